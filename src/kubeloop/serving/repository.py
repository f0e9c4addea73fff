"""Put registered model versions into a Triton model repository.

An OptimizedModel registers its winner with ready-made Triton repositories
(tuned batching, `triton/<backend>/<name>/`); a version straight from a
TrainingJob has only its ONNX export, and gets a default configuration whose
input and output follow the version's signature (its `kubeloop.signature` tag).
Registry versions become Triton versions of one Triton model, so a canary is
`/v2/models/<m>/versions/<canary>/infer` and moving an alias is a change of
the config's version policy plus a reload through the repository API.
"""

from __future__ import annotations

import os
import py_compile
import re
import shutil
import tempfile
from pathlib import Path

import mlflow
from google.protobuf import text_format
from mlflow import MlflowClient
from tritonclient.grpc import model_config_pb2 as mc

from kubeloop.api.constants import MAX_REQUEST_ROWS
from kubeloop.api.signature import ModelSignature
from kubeloop.files import write_if_changed
from kubeloop.components.triton import MODEL_PY, BatchingPlan, for_device, write_repository
from kubeloop.registry.headers import defer_feast_headers
from kubeloop.serving.base import triton_name

defer_feast_headers()

# Batching for versions nobody profiled: small batches, a short wait.
DEFAULT_PLAN = BatchingPlan(max_batch_size=64, preferred_batch_sizes=(8, 32), max_queue_delay_us=500, instances=1,
                            kind="KIND_CPU", why="default: the version has no measured latency profile")


def write_model_py(version_dir: Path) -> None:
    """The python backend's model.py with its bytecode beside it. The stub
    writes __pycache__ into the version's folder at the model's first load
    (its interpreter ignores PYTHONDONTWRITEBYTECODE), and Triton takes that
    for a change: the model's next load request, a pool's reload for new
    routes of the same versions, started a second stub and loaded it all
    again (1.4 s, twice the memory meanwhile) instead of doing nothing. A
    stub of another Python than this one writes its own, as before."""
    path = version_dir / "model.py"
    path.write_text(MODEL_PY)
    py_compile.compile(str(path), doraise=True)


def fetch_version(tracking_uri: str, model: str, version: str, repository: Path, backend: str = "python") -> mc.ModelConfig:
    """Write <repository>/<triton name>/<version>/ for a registered version and
    return the Triton config that version came with."""
    client = MlflowClient(tracking_uri)
    mv = client.get_model_version(model, version)
    name = triton_name(model)
    with tempfile.TemporaryDirectory() as tmp:
        staging = Path(tmp)
        try:
            mlflow.artifacts.download_artifacts(f"runs:/{mv.run_id}/triton/{backend}", dst_path=str(staging),
                                                tracking_uri=tracking_uri)
            source = next((staging / backend).iterdir())
        except (mlflow.exceptions.MlflowException, StopIteration, FileNotFoundError):
            onnx_path = Path(mlflow.artifacts.download_artifacts(f"runs:/{mv.run_id}/exported/model.onnx",
                                                                 dst_path=str(staging), tracking_uri=tracking_uri))
            source = write_repository(staging / "built", name, onnx_path, ModelSignature.from_tags(mv.tags),
                                      DEFAULT_PLAN, backend)
        target = repository / name / str(version)
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(next(p for p in source.iterdir() if p.is_dir()), target)
        if backend == "python":
            # The python backend's glue belongs to the runtime, not to the
            # registered artifact: always the current one.
            write_model_py(target)
        config = text_format.Parse((source / "config.pbtxt").read_text(), mc.ModelConfig())
    config.name = name
    if config.max_batch_size:
        # Versions registered before requests were bounded by MAX_REQUEST_ROWS
        # refused any request larger than their largest profiled batch.
        config.max_batch_size = max(config.max_batch_size, MAX_REQUEST_ROWS)
    return config


def write_config(repository: Path, config: mc.ModelConfig, versions: list[str]) -> Path:
    """The model's config.pbtxt serving exactly these versions."""
    config = mc.ModelConfig.FromString(config.SerializeToString())
    config.version_policy.ClearField("specific")
    config.version_policy.specific.versions.extend(sorted(int(v) for v in versions))
    path = repository / config.name / "config.pbtxt"
    path.parent.mkdir(parents=True, exist_ok=True)
    # Atomic, and untouched when unchanged: a pool's member may be loading
    # the model, and a half-written config reads as one naming no backend.
    write_if_changed(path, text_format.MessageToString(config))
    return path


def served_versions(config: Path) -> list[str]:
    """The versions a model's config.pbtxt serves (none where it is not there)."""
    try:
        parsed = text_format.Parse(config.read_text(), mc.ModelConfig())
    except FileNotFoundError:
        return []
    return [str(v) for v in parsed.version_policy.specific.versions]


def prune_versions(repository: Path, name: str, keep: list[str]) -> None:
    """Remove version folders that are no longer served."""
    folder = repository / name
    for child in folder.iterdir() if folder.exists() else []:
        if child.is_dir() and child.name.isdigit() and child.name not in keep:
            shutil.rmtree(child)


FETCHED_KEPT = 64
"""Registered versions a pool keeps fetched for the services that join it
later (the most recently used): a thousand services of one version fetch
it once."""


def put_pooled(tracking_uri: str, model: str, versions: list[str], primary: str, name: str, repository: Path,
               work: Path, backend: str = "python") -> None:
    """A pooled service's versions as one Triton model of its own (name, not
    the registered model's: a pool's repository holds many services of one
    model) in a shared repository. Versions already there are not fetched
    again; each version's own config is kept in work, and the model's
    config is the primary's, serving exactly these versions. The versions
    the config served until now stay on disk until the next change: a
    member may still be loading them (Triton's python backend, finding a
    version's files gone while it loads, never answered the load)."""
    configs = work / "configs" / name
    configs.mkdir(parents=True, exist_ok=True)
    for version in sorted(set(versions)):
        if not ((repository / name / version).is_dir() and (configs / f"{version}.pbtxt").exists()):
            fetched = _fetched(tracking_uri, model, version, work, backend)
            target = repository / name / version
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(fetched / "files", target, copy_function=_link_or_copy)
            shutil.copyfile(fetched / "config.pbtxt", configs / f"{version}.pbtxt")
    config = text_format.Parse((configs / f"{primary}.pbtxt").read_text(), mc.ModelConfig())
    config.name = name
    before = served_versions(repository / name / "config.pbtxt")
    write_config(repository, config, sorted(set(versions)))
    if set(before) != set(versions):
        prune_versions(repository, name, sorted(set(versions) | set(before)))


def _fetched(tracking_uri: str, model: str, version: str, work: Path, backend: str) -> Path:
    """work/registry/<model>/<version>: the version's files and its config,
    fetched from the registry the first time a service of the pool serves
    it. Services reconciled at once may fetch it together: each into a
    folder of its own, the first to finish kept."""
    cached = work / "registry" / triton_name(model) / version
    if not (cached / "config.pbtxt").exists():
        cached.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=cached.parent, prefix=f".{version}-"))
        try:
            config = fetch_version(tracking_uri, model, version, staging / "repository", backend=backend)
            shutil.move(staging / "repository" / triton_name(model) / version, staging / "files")
            (staging / "config.pbtxt").write_text(text_format.MessageToString(config))
            shutil.rmtree(staging / "repository")
            try:
                staging.rename(cached)
            except OSError:  # another service's fetch finished first
                pass
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        _keep_newest(work / "registry", FETCHED_KEPT)
    cached.touch()
    return cached


def _keep_newest(root: Path, kept: int) -> None:
    """Fetched versions beyond the kept most recently used go."""
    fetched = sorted((p for p in root.glob("*/*") if not p.name.startswith(".")), key=lambda p: p.stat().st_mtime)
    for old in fetched[:-kept]:
        shutil.rmtree(old, ignore_errors=True)


def _link_or_copy(source: str, target: str) -> None:
    """A fetched file in a service's model: linked where both are on one
    file system (nothing copied), else copied."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def remove_pooled(name: str, repository: Path, work: Path) -> None:
    """What put_pooled wrote for a service that left its pool."""
    for leftover in (repository / name, work / "configs" / name):
        shutil.rmtree(leftover, ignore_errors=True)


def fetch_for_kubernetes(model_uri: str, repository: Path, tracking_uri: str, backend: str = "onnxruntime",
                         device: str = "cpu") -> Path:
    """What the serving Pod's init container runs: models:/<name>/<version>
    into /models, with instances on the device the Pod was placed on."""
    match = re.fullmatch(r"models:/([^/@]+)/(\d+)", model_uri)
    if not match:
        raise ValueError(f"expected models:/<name>/<version>, got {model_uri}")
    model, version = match.groups()
    config = fetch_version(tracking_uri, model, version, repository, backend)
    return write_config(repository, for_device(config, device), [version])
