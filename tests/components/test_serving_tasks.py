"""Triton repositories written from a signature load in the real local
tritonserver (nvidia-pytriton's, python backend, the serving environment)
and answer KServe v2 requests with the task's output name and shape; the
router in front reads, counts and logs a multiclass version's answers.
Local backend; no control plane."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import requests
import torch

from kubeloop.api.signature import TAG as SIGNATURE_TAG, ModelSignature
from kubeloop.components.model import Architecture, build_model, export_onnx
from kubeloop.components.triton import BatchingPlan, write_repository
from kubeloop import processes
from kubeloop.serving.repository import fetch_version, write_config
from kubeloop.serving.runtime import TritonRuntime
from tests.support.waiting import wait_for

N_INPUTS = 6
FETCHED = "fetched-multiclass"
PLAN = BatchingPlan(max_batch_size=16, preferred_batch_sizes=(8,), max_queue_delay_us=200, instances=1,
                    kind="KIND_CPU", why="test")
# Triton model name -> (signature, batching plan); multiclass also without a
# plan (batching off: the config spells the batch dimension as -1).
MODELS = {
    "binary": (ModelSignature(feature_columns=[f"f{i}" for i in range(N_INPUTS)], threshold=0.5), PLAN),
    "multiclass": (ModelSignature(task="multiclass", feature_columns=[f"f{i}" for i in range(N_INPUTS)],
                                  classes=["low", "mid", "high", "top"]), PLAN),
    "multiclass-plain": (ModelSignature(task="multiclass", feature_columns=[f"f{i}" for i in range(N_INPUTS)],
                                        classes=["low", "mid", "high", "top"]), None),
    "regression": (ModelSignature(task="regression", feature_columns=[f"f{i}" for i in range(N_INPUTS)]), PLAN),
}


def task_model(signature: ModelSignature, seed: int):  # noqa: ANN201 - TaskModel
    """A small built-in MLP for the signature's task, with non-trivial
    standardisation (and, for regression, de-standardisation) buffers."""
    torch.manual_seed(seed)
    model = build_model(Architecture(signature.task, signature.n_inputs, signature.n_outputs,
                                     parameters={"hidden_units": [16, 8], "dropout": 0.0}))
    model.set_normalisation(torch.linspace(-1, 1, signature.n_inputs), torch.linspace(0.5, 2, signature.n_inputs))
    if signature.task == "regression":
        model.set_target_normalisation(250.0, 40.0)
    return model.eval()


def register_exported(tracking: str, root: Path, name: str, onnx_path: Path, signature: ModelSignature) -> str:
    """A registered version as a TrainingJob leaves it: exported/model.onnx
    and the signature tag, no ready-made Triton repository."""
    import mlflow
    from mlflow import MlflowClient

    client = MlflowClient(tracking)
    experiment = client.create_experiment(name, artifact_location=(root / "artifacts").as_uri())
    exported = root / "exported"
    exported.mkdir()
    shutil.copyfile(onnx_path, exported / "model.onnx")
    mlflow.set_tracking_uri(tracking)
    with mlflow.start_run(experiment_id=experiment) as run:
        mlflow.log_artifacts(str(exported), "exported")
    client.create_registered_model(name)
    return str(client.create_model_version(name, f"runs:/{run.info.run_id}/exported", run.info.run_id,
                                           tags={SIGNATURE_TAG: signature.to_json()}).version)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A torch model per entry of MODELS and its ONNX export; the multiclass
    one also registered in a real MLflow (sqlite) as FETCHED."""
    root = tmp_path_factory.mktemp("exported")
    models = {name: task_model(signature, seed) for seed, (name, (signature, _)) in enumerate(MODELS.items())}
    onnx = {name: export_onnx(model, root / f"{name}.onnx") for name, model in models.items()}
    tracking = f"sqlite:///{root / 'mlflow.db'}"
    version = register_exported(tracking, root, FETCHED, onnx["multiclass"], MODELS["multiclass"][0])
    return models, onnx, tracking, version


@pytest.fixture(scope="module")
def triton(exported, tmp_path_factory):
    """One tritonserver over a repository with a model per entry of MODELS,
    and the multiclass version fetched from MLflow as the local backend
    fetches it (FETCHED); yields its URL and the torch models to compare with."""
    models, onnx, tracking, version = exported
    runtime = TritonRuntime.discover()
    root = tmp_path_factory.mktemp("triton")
    repository = root / "repository"
    for name, (signature, plan) in MODELS.items():
        write_repository(repository, name, onnx[name], signature, plan, "python")
    write_config(repository, fetch_version(tracking, FETCHED, version, repository), [version])
    models = {**models, FETCHED: models["multiclass"]}
    ports = [processes.free_port() for _ in range(3)]
    argv = [a for a in runtime.argv(repository, *ports) if a != "--model-control-mode=explicit"]
    server = processes.start("tritonserver", [*argv, "--model-control-mode=none"], root / "logs", env=runtime.env())
    url = f"http://127.0.0.1:{ports[0]}"

    def ready() -> bool:
        if not server.running():
            raise AssertionError(f"tritonserver exited:\n{processes.log_tail(server.log)}")
        try:
            return all(requests.get(f"{url}/v2/models/{m}/ready", timeout=2).status_code == 200
                       for m in (*MODELS, FETCHED))
        except requests.RequestException:
            return False

    try:
        wait_for(ready, timeout=120, interval=0.3, what="tritonserver with every task's model ready")
        yield url, models, version
    finally:
        processes.stop(server)


@pytest.mark.parametrize("name", [*MODELS, FETCHED])
def test_each_tasks_repository_answers_v2_with_its_output_name_and_shape(triton, name):
    """Local backend (the real tritonserver): the answer's output tensor is
    the signature's, [batch, n_outputs], equal to the torch model's."""
    url, models, _ = triton
    signature = MODELS["multiclass" if name == FETCHED else name][0]
    # More rows than the largest batch the plan profiled (16): a caller's
    # request is not bounded by it.
    rows = np.random.default_rng(7).normal(0, 2, (50, N_INPUTS)).astype(np.float32)
    body = {"inputs": [{"name": "features", "shape": list(rows.shape), "datatype": "FP32", "data": rows.tolist()}]}
    response = requests.post(f"{url}/v2/models/{name}/infer", json=body, timeout=30)
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    assert output["name"] == signature.output_name
    assert output["shape"] == [50, signature.n_outputs] and output["datatype"] == "FP32"
    answer = np.asarray(output["data"], dtype=np.float32).reshape(50, signature.n_outputs)
    with torch.no_grad():
        expected = models[name](torch.from_numpy(rows)).numpy()
    assert np.allclose(answer, expected, atol=1e-4, rtol=1e-4)
    if signature.task == "multiclass":
        assert np.allclose(answer.sum(axis=1), 1.0, atol=1e-5) and len(set(answer.argmax(axis=1))) > 1
    if signature.task == "regression":
        assert abs(float(answer.mean()) - 250.0) < 200.0 and answer.std() > 0


def test_the_config_triton_loaded_declares_the_signatures_tensors(triton):
    """Local backend (the real tritonserver): Triton's own view of each model
    (/v2/models/<m>/config) has the signature's input and output."""
    url, _, _ = triton
    # The fetched version has the default plan (batching on).
    for name, (signature, plan) in [*MODELS.items(), (FETCHED, MODELS["multiclass"])]:
        config = requests.get(f"{url}/v2/models/{name}/config", timeout=10).json()
        batch = [] if plan else [-1]
        assert [(i["name"], [int(d) for d in i["dims"]]) for i in config["input"]] == [
            ("features", [*batch, signature.n_inputs])]
        assert [(o["name"], [int(d) for d in o["dims"]]) for o in config["output"]] == [
            (signature.output_name, [*batch, signature.n_outputs])]


def test_serving_fetch_writes_the_onnxruntime_repository_from_the_signature(exported, tmp_path):
    """`kubeloop serving fetch` as a cluster serving Pod's init container runs
    it (onnxruntime backend), here against the real MLflow: the repository it
    writes. No cluster or onnxruntime backend runs here, so this proves the
    files, not a Pod serving them."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    from kubeloop.serving.repository import fetch_for_kubernetes

    _, _, tracking, version = exported
    path = fetch_for_kubernetes(f"models:/{FETCHED}/{version}", tmp_path, tracking, "onnxruntime")
    config = text_format.Parse(path.read_text(), mc.ModelConfig())
    assert config.platform == "onnxruntime_onnx" and list(config.version_policy.specific.versions) == [int(version)]
    assert [(i.name, list(i.dims)) for i in config.input] == [("features", [N_INPUTS])]
    assert [(o.name, list(o.dims)) for o in config.output] == [("probabilities", [4])]
    assert (tmp_path / FETCHED / version / "model.onnx").exists()
    assert not (tmp_path / FETCHED / version / "model.py").exists()


def test_the_router_in_front_of_triton_counts_and_logs_class_probabilities(triton, tmp_path):
    """Local backend: the router process (as the local backend starts it, its
    config carrying the version's signature) in front of the real
    tritonserver serving the fetched multiclass version: the caller gets
    [batch, C]; the router counts the most probable classes and logs each
    row's class probabilities."""
    from prometheus_client.parser import text_string_to_metric_families

    from kubeloop.requestlog import request_records

    url, models, version = triton
    signature = MODELS["multiclass"][0]
    router, base = _start_router(url, version, tmp_path)
    try:
        rows = np.random.default_rng(11).normal(0, 2, (8, N_INPUTS)).astype(np.float32)
        body = {"inputs": [{"name": "features", "shape": [8, N_INPUTS], "datatype": "FP32", "data": rows.tolist()}]}
        answer = requests.post(f"{base}/v2/models/{FETCHED}/infer", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        output = answer.json()["outputs"][0]
        assert output["name"] == "probabilities" and output["shape"] == [8, 4]
        with torch.no_grad():
            expected = models[FETCHED](torch.from_numpy(rows)).numpy()
        classes = [signature.classes[i] for i in expected.argmax(axis=1)]
        counted = {s.labels["class"]: s.value for family in text_string_to_metric_families(
            requests.get(f"{base}/metrics", timeout=5).text) for s in family.samples
            if s.name == "kubeloop_predicted_class_total"}
        assert counted == {c: float(classes.count(c)) for c in set(classes)}
        records = wait_for(lambda: list(request_records(tmp_path / "log")) if (tmp_path / "log").exists() else [],
                           timeout=10, what="the router's request log")
    finally:
        processes.stop(router)
    (record,) = records
    assert record["features"] == rows.tolist() and np.allclose(record["outputs"], expected, atol=1e-4)


def test_requests_waiting_for_triton_are_joined_and_each_caller_gets_its_own_rows(triton, tmp_path):
    """Local backend: 96 callers at once, with one to three rows each, through
    the router process to the real tritonserver. Requests that arrive while
    a call is under way share the next one; each caller still gets the
    model's answer for its own rows, with its own id, and a request Triton
    must judge alone (it chooses its outputs) is answered as sent."""
    import asyncio

    import aiohttp
    from prometheus_client.parser import text_string_to_metric_families

    url, models, version = triton
    rng = np.random.default_rng(5)
    requests_rows = [rng.normal(0, 2, (1 + k % 3, N_INPUTS)).astype(np.float32) for k in range(96)]

    async def call_all(base: str) -> list[dict]:
        async with aiohttp.ClientSession() as session:
            async def call(k: int, rows: np.ndarray, **extra) -> dict:
                body = {"inputs": [{"name": "features", "shape": list(rows.shape), "datatype": "FP32",
                                    "data": rows.tolist()}], **({"id": f"r{k}"} if k % 2 else {}), **extra}
                async with session.post(f"{base}/v2/models/{FETCHED}/infer", json=body) as answer:
                    assert answer.status == 200, await answer.text()
                    return await answer.json()
            alone = call(-1, requests_rows[0], outputs=[{"name": "probabilities"}])
            return await asyncio.gather(alone, *(call(k, rows) for k, rows in enumerate(requests_rows)))

    router, base = _start_router(url, version, tmp_path)
    try:
        answers = asyncio.run(call_all(base))
        metrics = requests.get(f"{base}/metrics", timeout=5).text
    finally:
        processes.stop(router)
    with torch.no_grad():
        expected = [models[FETCHED](torch.from_numpy(rows)).numpy() for rows in requests_rows]
    alone, answers = answers[0], answers[1:]
    assert np.allclose(alone["outputs"][0]["data"], expected[0].ravel(), atol=1e-4)
    for k, (answer, want) in enumerate(zip(answers, expected, strict=True)):
        (output,) = answer["outputs"]
        assert output["shape"] == [len(want), 4] and np.allclose(output["data"], want.ravel(), atol=1e-4)
        assert answer.get("id") == (f"r{k}" if k % 2 else None)
    calls = {s.name: s.value for family in text_string_to_metric_families(metrics) for s in family.samples
             if s.name.startswith("kubeloop_triton_call_requests")}
    # Every call is counted: the 96 joinable requests' and the one that went alone.
    assert calls["kubeloop_triton_call_requests_sum"] == 97
    assert calls["kubeloop_triton_call_requests_count"] < 97


def _start_router(url: str, version: str, tmp_path: Path):  # noqa: ANN202 - the router's process and its URL
    """The router process as the local backend starts it, its config carrying
    the multiclass version's signature."""
    import json
    import sys

    from kubeloop.serving.routes import signature_fields

    port = processes.free_port()
    config = tmp_path / "router.json"
    config.write_text(json.dumps({
        "service": "ml/faults", "model": FETCHED, "triton_model": FETCHED, "triton_url": url,
        "routes": [{"role": "primary", "version": version, "percent": 100}], "request_log": str(tmp_path / "log"),
        "sample_rate": 1.0, **signature_fields(MODELS["multiclass"][0])}))
    router = processes.start("router", [sys.executable, "-m", "kubeloop.front.router", "--config", str(config),
                                        "--port", str(port)], tmp_path / "logs")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ok(f"{base}/v2/health/ready"), timeout=30, what="the router ready")
    except BaseException:
        processes.stop(router)
        raise
    return router, base


def _ok(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False
