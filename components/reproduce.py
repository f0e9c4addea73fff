"""Rebuild a registered version from its lineage and compare (`kubeloop
reproduce`).

The version's tags name everything the pipeline used: the TrainingJob spec
with its window pinned to the rows it saw (its seed and hyper-parameters
inside), the feature store, the dataset hash and the views' fingerprints,
the code and the environment. The rebuild runs the training pipeline's own
step bodies (components.steps: data, train, evaluate) in this process with
that spec, against that store, as a new MLflow run tagged
kubeloop.reproduces; register_step is never called, so nothing is
registered, aliased or promoted. The registered and the rebuilt networks
then score the rebuilt evaluation rows, and components.comparison judges.
"""

from __future__ import annotations

import getpass
import json
import socket
import tempfile
import uuid
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np

from kubeloop.api.tasks import PRIMARY
from kubeloop.api.training import Hyperparameters, TrainingJobSpec, Tuning
from kubeloop.components.comparison import Build, Report, Tolerance, compare, output_gap
from kubeloop.components.data import DatasetInfo, load_split
from kubeloop.registry import tags

REPORT = "reproduction/report.json"
# The run tags that say which code and environment trained the version.
CODE_TAGS = {"kubeloop": "env.kubeloop", "torch": "env.torch", "numpy": "env.numpy", "python": "env.python",
             "device": "train.device", "precision": "train.precision"}


class LineageError(ValueError):
    """The version cannot be reproduced; the message says why and what to do."""


@dataclass(frozen=True)
class Lineage:
    """What a registered version recorded about how it was made."""

    model: str
    version: str
    run_id: str
    spec: TrainingJobSpec
    """The TrainingJob spec, its window pinned at registration."""
    store: str
    """StoreLocation JSON ("" when the version names none)."""
    spec_hash: str
    best_hyperparameters: dict | None
    """What tuning chose, when the job tuned."""
    recorded: Build


def version_tags(tracking_uri: str, model: str, version: str) -> dict:
    """A registered version's tags; LookupError for an unknown model or version."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        return MlflowClient(tracking_uri).get_model_version(model, version).tags
    except MlflowException:
        raise LookupError(f"{model} has no version {version} in the registry at {tracking_uri}") from None


def require_lineage(model: str, version: str, vtags: dict, keys: tuple[str, ...], remedy: str) -> None:
    """LineageError naming the lineage tags the version lacks, and the remedy."""
    missing = [k for k in keys if k not in vtags]
    if missing:
        raise LineageError(f"{model} version {version} has no lineage ({', '.join(missing)} missing): {remedy}")


def read_lineage(tracking_uri: str, model: str, version: str, vtags: dict) -> Lineage:
    """A trained version's lineage from its tags; LineageError for a version
    that cannot be rebuilt."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    require_lineage(model, version, vtags, (tags.TRAINING_SPEC, "dataset_hash", "run_id"),
                    "it was registered by an older kubeloop or outside a TrainingJob; train it again with a "
                    "TrainingJob and reproduce the version that registers")
    try:
        spec = TrainingJobSpec.model_validate_json(vtags[tags.TRAINING_SPEC])
    except ValueError as exc:
        raise LineageError(f"{model} version {version}: its recorded spec ({tags.TRAINING_SPEC}) no longer "
                           f"validates against this kubeloop's TrainingJob API: {exc}") from None
    run = client.get_run(vtags["run_id"]).data
    best = run.tags.get("train.best_hyperparameters")
    return Lineage(model, str(version), vtags["run_id"], spec, vtags.get(tags.FEATURE_STORE, ""),
                   run.tags.get("kubeloop.spec_hash", ""), json.loads(best) if best else None,
                   _recorded(vtags, run))


def _recorded(vtags: dict, run) -> Build:  # noqa: ANN001 - mlflow RunData
    code = {"git sha": vtags.get("git_sha"), "factory": vtags.get(tags.FACTORY),
            "factory code": vtags.get(tags.FACTORY_CODE),
            **{name: run.tags.get(tag) for name, tag in CODE_TAGS.items()}}
    metrics = {k.removeprefix(tags.METRIC_PREFIX): float(v) for k, v in vtags.items()
               if k.startswith(tags.METRIC_PREFIX)}
    rows = run.tags.get("dataset.rows")
    return Build(vtags["dataset_hash"], int(rows) if rows else None, json.loads(vtags.get("feature_views", "{}")),
                 json.loads(vtags.get(tags.VIEW_HASHES, "{}")), {k: v for k, v in code.items() if v},
                 metrics)


def rebuild_spec(lineage: Lineage) -> TrainingJobSpec:
    """The recorded spec as the rebuild trains it: no promotion (the rebuild
    is never registered, and no champion is scored), and a tuned job trains
    once with the hyper-parameters its tuning chose."""
    update: dict = {"promotion": None}
    if lineage.spec.tuning.trials > 1 and lineage.best_hyperparameters:
        update |= {"hyperparameters": Hyperparameters.model_validate(lineage.best_hyperparameters),
                   "tuning": Tuning()}
    return lineage.spec.model_copy(update=update)


def reproduce(tracking_uri: str, model: str, version: str, feast_repo: str = "", work_dir: Path | None = None,
              tolerance: Tolerance | None = None) -> Report:
    """Rebuild the version as a new MLflow run and compare it with the
    record: a trained version by training it again, an optimised one by
    building its variant again (components.reproduce_variant). The metrics
    checked default to the task's primary one (e.g. auc), or an optimised
    version's accuracy budget metric."""
    vtags = version_tags(tracking_uri, model, version)
    if tags.SOURCE in vtags:
        from kubeloop.components.reproduce_variant import read_variant_lineage, reproduce_variant

        variant = read_variant_lineage(model, version, vtags)
        checked, rebuild = variant.metric, partial(reproduce_variant, tracking_uri, variant, feast_repo)
    else:
        lineage = read_lineage(tracking_uri, model, version, vtags)
        checked, rebuild = PRIMARY[lineage.spec.task], partial(_reproduce, tracking_uri, lineage, feast_repo)
    tolerance = tolerance or Tolerance(())
    if not tolerance.checked:
        tolerance = replace(tolerance, checked=(checked,))
    if not vtags.get(tags.FEATURE_STORE) and not feast_repo:
        raise LineageError(f"{model} version {version} names no feature store: pass --feast-repo (or set "
                           "KUBELOOP_FEAST_REPO) to the repository it was trained from")
    if work_dir is None:
        with tempfile.TemporaryDirectory(prefix="kubeloop-reproduce-") as tmp:
            return rebuild(Path(tmp), tolerance)
    return rebuild(work_dir, tolerance)


def _reproduce(tracking_uri: str, lineage: Lineage, feast_repo: str, work: Path, tolerance: Tolerance) -> Report:
    from mlflow import MlflowClient

    from kubeloop.components import steps
    from kubeloop.version import git_sha

    spec = rebuild_spec(lineage).to_json()
    work.mkdir(parents=True, exist_ok=True)
    data, model_dir = work / "dataset.parquet", work / "model"
    info_json = steps.training_data_step(spec, lineage.store, feast_repo, str(data))
    name = f"reproduce-{lineage.model}-{lineage.version}-{uuid.uuid4().hex[:8]}"
    run_id = steps.train_step(spec, str(data), info_json, str(model_dir), tracking_uri, name, _who(),
                              lineage.spec_hash, git_sha())
    client = MlflowClient(tracking_uri)
    client.set_tag(run_id, tags.REPRODUCES, f"{lineage.model}/{lineage.version}")
    evaluation = json.loads(steps.evaluate_step(spec, str(data), info_json, str(model_dir), tracking_uri, run_id))
    info = DatasetInfo.from_json(info_json)
    gap = _outputs(tracking_uri, lineage, info, data, model_dir, work)
    report = compare(lineage.model, lineage.version, run_id, lineage.recorded,
                     _rebuilt(info, client.get_run(run_id).data, evaluation["metrics"], lineage.spec), gap,
                     tolerance,
                     _notes(lineage))
    log_report(client, run_id, report)
    return report


def _who() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()} (kubeloop reproduce)"


def _rebuilt(info: DatasetInfo, run, metrics: dict, spec: TrainingJobSpec) -> Build:  # noqa: ANN001 - RunData
    """The rebuild's own record: train_step tags its run as it tags every
    training run (git sha, environment, factory, device)."""
    from kubeloop.components.model import factory_code

    factory = run.tags.get("model.factory", "")
    code = {"git sha": run.tags.get("git_sha"), "factory": factory,
            "factory code": factory_code(factory, spec.model.path if spec.model else None) if factory else "",
            **{name: run.tags.get(tag) for name, tag in CODE_TAGS.items()}}
    shown = {k: float(v) for k, v in metrics.items() if v == v and k not in ("rows", "positives")}
    return Build(info.dataset_hash, info.rows, info.feature_views, info.view_hashes,
                 {k: v for k, v in code.items() if v}, shown)


def _outputs(tracking_uri: str, lineage: Lineage, info: DatasetInfo, data: Path, model_dir: Path, work: Path):  # noqa: ANN202 - OutputGap
    """Both networks (torch, as trained) on the rebuilt evaluation rows."""
    import mlflow

    from kubeloop.components.model import load_model
    from kubeloop.components.registration import EXPORTED
    from kubeloop.components.training import predict

    frame, _ = load_split(data, info, "holdout")
    x = frame[info.feature_columns].to_numpy(np.float32)
    mlflow.set_tracking_uri(tracking_uri)
    (work / "registered").mkdir(exist_ok=True)
    state = mlflow.artifacts.download_artifacts(f"runs:/{lineage.run_id}/{EXPORTED}/state.pt",
                                                dst_path=str(work / "registered"))
    return output_gap(predict(load_model(Path(state).parent), x), predict(load_model(model_dir), x), info.task)


def _notes(lineage: Lineage) -> list[str]:
    notes = []
    if lineage.spec.tuning.trials > 1:
        notes.append(f"tuning ({lineage.spec.tuning.trials} trials) not repeated: trained once with the "
                     f"hyper-parameters it chose {json.dumps(lineage.best_hyperparameters, sort_keys=True)}")
    if not lineage.spec.features.window.start:
        notes.append("the version recorded no pinned window: rows that arrived since it was trained count")
    return notes


def log_report(client, run_id: str, report: Report) -> None:  # noqa: ANN001 - MlflowClient
    """The verdict on the rebuild's run, and the whole report beside it."""
    client.set_tag(run_id, "kubeloop.reproduction.verdict", report.verdict[:5000])
    client.log_dict(run_id, report.to_dict(), REPORT)
