"""Triton repositories written from a signature load in the real local
tritonserver (nvidia-pytriton's, python backend, the serving environment)
and answer KServe v2 requests with the task's output name and shape; the
router in front reads, counts and logs a multiclass version's answers, and
answers the fraud model's entity requests from Feast's Redis online store
(Debian's redis-server, launched as the local platform launches it).
Local backend; no control plane."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import requests
import torch

from kubeloop.api.signature import TAG as SIGNATURE_TAG, ModelSignature
from kubeloop.components.model import Architecture, build_model, export_onnx
from kubeloop.components.triton import BatchingPlan, write_repository
from kubeloop import processes
from kubeloop.serving.base import triton_name
from kubeloop.serving.repository import fetch_version, write_config
from kubeloop.serving.routes import signature_fields
from kubeloop.serving.runtime import TritonRuntime
from tests.support.entities import (answered_as_the_offline_vectors, entity_request, missing_count,
                                    recent_with_offline_vectors)
from tests.support.waiting import wait_for

N_INPUTS = 6
FETCHED = "fetched-multiclass"
FRAUD = "fraud-on-redis"
UNKNOWN_CARD = 10**9
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
    server, url = _start_triton(runtime, repository, [*MODELS, FETCHED], root)
    try:
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
    router, base = _start_router(_multiclass_routes(url, version, tmp_path), tmp_path)
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
    model's answer for its own rows, with its own id. Every third caller
    names its output, as tritonclient does: those join each other. A
    request Triton must judge alone (it has parameters) is answered as sent."""
    import asyncio

    import aiohttp
    from prometheus_client.parser import text_string_to_metric_families

    url, models, version = triton
    rng = np.random.default_rng(5)
    requests_rows = [rng.normal(0, 2, (1 + k % 3, N_INPUTS)).astype(np.float32) for k in range(96)]

    async def call_all(base: str) -> list[dict]:
        async with aiohttp.ClientSession() as session:
            async def call(k: int, rows: np.ndarray, **extra) -> dict:
                named = {"outputs": [{"name": "probabilities"}]} if k % 3 == 0 else {}
                body = {"inputs": [{"name": "features", "shape": list(rows.shape), "datatype": "FP32",
                                    "data": rows.tolist()}], **({"id": f"r{k}"} if k % 2 else {}), **named, **extra}
                async with session.post(f"{base}/v2/models/{FETCHED}/infer", json=body) as answer:
                    assert answer.status == 200, await answer.text()
                    return await answer.json()
            alone = call(-1, requests_rows[0], parameters={"caller": "alone"})
            return await asyncio.gather(alone, *(call(k, rows) for k, rows in enumerate(requests_rows)))

    router, base = _start_router(_multiclass_routes(url, version, tmp_path), tmp_path)
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
    # Those naming their output join each other: had each of the 32 gone alone, with the one that did
    # and at least one call for the rest, there would be 34 calls.
    assert calls["kubeloop_triton_call_requests_count"] < 34


@pytest.fixture
def fraud_on_redis(redis_address, tmp_path_factory):
    """A feature repository whose data ends today, materialised into Redis
    and nowhere else; the example's fraud model trained on it, registered in
    a real MLflow (sqlite) and fetched into a tritonserver as the local
    backend fetches it. Yields Triton's URL, the repository, the version,
    its signature and what its entity requests read (the router config's
    "features" entry)."""
    import redis
    from mlflow import MlflowClient

    from kubeloop.featurestore.generate import Scenario, default_start
    from kubeloop.featurestore.store import create_repository, materialize
    from kubeloop.front.features import FeatureSpec
    from kubeloop.registry.tags import FEATURE_STORE
    from tests.support.models import register_fraud_model

    root = tmp_path_factory.mktemp("fraud")
    repo = create_repository(root / "repo", Scenario(start=default_start(21), days=21, seed=5),
                             redis_address=redis_address)
    materialize(repo)
    host, port = redis_address.rsplit(":", 1)
    with redis.Redis(host=host, port=int(port)) as client:
        assert client.dbsize() > 1000
    assert not (repo / "data" / "online.db").exists()
    tracking = f"sqlite:///{root / 'mlflow.db'}"
    repository = root / "repository"
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)  # the sqlite store keeps artifacts under ./mlruns
        version = register_fraud_model(tracking, FRAUD, repo, root / "train")
        write_config(repository, fetch_version(tracking, FRAUD, version, repository), [version])
    tags = MlflowClient(tracking).get_model_version(FRAUD, version).tags
    signature = ModelSignature.from_tags(tags)
    spec = FeatureSpec.of(signature, tags[FEATURE_STORE])
    assert spec is not None and set(spec.inputs) == {"card_id", "merchant_id", "amount", "hour", "channel"}
    server, url = _start_triton(TritonRuntime.discover(), repository, [triton_name(FRAUD)], root)
    try:
        yield url, repo, version, signature, {version: spec.to_dict()}
    finally:
        processes.stop(server)


def test_entity_requests_read_redis_answer_as_the_offline_vector_and_unknown_cards_follow_the_policy(
        fraud_on_redis, redis_address, tmp_path):
    """Component (no platform), Feast's Redis online store: the router
    process as the local backend starts it, in front of the real tritonserver
    serving the fraud model, answers requests that carry only the raw
    transaction (card, merchant, amount, hour, channel) by reading the rest
    from Redis, the only place the values live: the probabilities the
    raw-vector requests built from the offline store's point-in-time vectors
    get, and the vectors it logs are those. An unknown card follows the
    policy: default (answered, counted by view), then reject (422 naming the
    card). Redis emptied, known cards are refused too: the answers came from
    it. (The local backend's e2e test proves the same on sqlite, with gRPC
    and the skew check.) Opening the store reads it once, for placeholder
    entities Redis does not hold, so the first caller does not pay Feast's
    first read. The router's lean read of Redis answers as Feast's
    get_online_features does."""
    import redis

    from kubeloop.front.features import FeatureSpec, OnlineStore
    from kubeloop.requestlog import request_records

    url, repo, version, signature, features = fraud_on_redis
    host, port = redis_address.rsplit(":", 1)
    with redis.Redis(host=host, port=int(port)) as client:
        misses = client.info("stats")["keyspace_misses"]
        store = OnlineStore(FeatureSpec.from_dict(features[version]))
        assert store.warmed
        assert client.info("stats")["keyspace_misses"] > misses
    sent, vectors = recent_with_offline_vectors(repo, signature)
    assert len(sent) >= 16, f"only {len(sent)} of 32 transactions have fresh features"
    # The router reads Redis with the lean read, which answers as Feast's
    # get_online_features does, unknown cards included.
    rows = {c: sent[c].tolist() + sent[c].tolist()[:1] for c in store.spec.inputs}
    rows["card_id"][-1] = UNKNOWN_CARD
    assert store.direct is not None
    ours, feasts = store.read(rows), store.read_through_feast(rows)
    assert ours.values == {name: feasts.values[name] for name in ours.values}
    assert ours.found == feasts.found and ours.timestamps == feasts.timestamps
    assert not ours.found["card_activity"][-1] and all(ours.found["card_activity"][:-1])
    config = _routes(url, FRAUD, version, signature, tmp_path, features=features, missing="default")
    router, base = _start_router(config, tmp_path)

    def infer(body: dict) -> requests.Response:
        return requests.post(f"{base}/v2/models/{FRAUD}/infer", json=body, timeout=30)

    try:
        expected = answered_as_the_offline_vectors(infer, sent, vectors)
        _each_caller_at_once_gets_its_own_rows_answer(infer, sent, expected)
        logged = wait_for(lambda: [r for r in request_records(tmp_path / "log") if r.get("request")]
                          if (tmp_path / "log").exists() else [], timeout=15, what="the entity request logged")
        assert logged[0]["request"]["card_id"] == sent["card_id"].tolist()
        assert np.allclose(np.array(logged[0]["features"], dtype=np.float32), vectors, rtol=1e-6)

        # An unknown card, policy default: answered with the training default
        # in place of its card views' features, and counted by view.
        stranger = sent.iloc[:1].assign(card_id=UNKNOWN_CARD)
        answered = infer(entity_request(stranger))
        assert answered.status_code == 200, answered.text
        assert missing_count(base, "card_activity", "default") == 1
        assert missing_count(base, "card_profile", "default") == 1
        assert missing_count(base, "merchant_risk", "default") == 0

        # Policy reject (the config rewritten, as the backend rewrites it):
        # 422 naming the card; known cards are still answered.
        (tmp_path / "router.json").write_text(json.dumps({**config, "missing": "reject"}))
        # (A Response is falsy when its status is 4xx: wait for its text.)
        rejected = wait_for(lambda: (r := infer(entity_request(stranger))).status_code == 422 and r.text,
                            timeout=30, interval=0.2, what="the reject policy in force")
        assert f"card_id={UNKNOWN_CARD} is not in the online store" in json.loads(rejected)["error"]
        assert missing_count(base, "card_activity", "reject") >= 1
        assert infer(entity_request(sent)).status_code == 200

        with redis.Redis(host=host, port=int(port)) as client:
            client.flushall()
        emptied = infer(entity_request(sent.iloc[:1]))
        assert emptied.status_code == 422, emptied.text
        assert f"card_id={sent['card_id'].iloc[0]} is not in the online store" in emptied.json()["error"]
    finally:
        processes.stop(router)


def _each_caller_at_once_gets_its_own_rows_answer(infer, sent, expected: np.ndarray) -> None:  # noqa: ANN001
    """One-row entity requests from 16 callers at once: reads of the online
    store join them, and the requests of one read join one call to Triton;
    each caller still gets its own row's answer."""
    from concurrent.futures import ThreadPoolExecutor

    rows = [k % len(sent) for k in range(4 * len(sent))]
    with ThreadPoolExecutor(16) as callers:
        answers = list(callers.map(lambda k: infer(entity_request(sent.iloc[k:k + 1])), rows))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200][:1]
    served = [a.json()["outputs"][0]["data"][0] for a in answers]
    np.testing.assert_allclose(served, expected[rows], rtol=1e-5, atol=1e-6)


def _multiclass_routes(url: str, version: str, tmp_path: Path) -> dict:
    """The router's config as the local backend writes it for the fetched
    multiclass version, its request log in tmp_path/log."""
    return _routes(url, FETCHED, version, MODELS["multiclass"][0], tmp_path)


def _routes(url: str, model: str, version: str, signature: ModelSignature, tmp_path: Path, **extra) -> dict:
    return {"service": "ml/faults", "model": model, "triton_model": triton_name(model), "triton_url": url,
            "routes": [{"role": "primary", "version": version, "percent": 100}],
            "request_log": str(tmp_path / "log"), "sample_rate": 1.0, **signature_fields(signature), **extra}


def _start_router(config: dict, tmp_path: Path):  # noqa: ANN202 - the router's process and its URL
    """The router process as the local backend starts it, reading its config
    from tmp_path/router.json (rewritten, it is read again)."""
    port = processes.free_port()
    (tmp_path / "router.json").write_text(json.dumps(config))
    router = processes.start("router", [sys.executable, "-m", "kubeloop.front.router", "--config",
                                        str(tmp_path / "router.json"), "--port", str(port)], tmp_path / "logs")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _running(router) and _ok(f"{base}/v2/health/ready"), timeout=60, what="the router ready")
    except BaseException:
        processes.stop(router)
        raise
    return router, base


def _start_triton(runtime: TritonRuntime, repository: Path, models: list[str], root: Path):  # noqa: ANN202
    """tritonserver over repository, every model loaded at start; its
    process and HTTP URL once each of models is ready."""
    ports = [processes.free_port() for _ in range(3)]
    argv = [a for a in runtime.argv(repository, *ports) if a != "--model-control-mode=explicit"]
    server = processes.start("tritonserver", [*argv, "--model-control-mode=none"], root / "logs", env=runtime.env())
    url = f"http://127.0.0.1:{ports[0]}"
    try:
        wait_for(lambda: _running(server) and all(_ok(f"{url}/v2/models/{m}/ready") for m in models),
                 timeout=120, interval=0.3, what=f"tritonserver with {', '.join(models)} ready")
    except BaseException:
        processes.stop(server)
        raise
    return server, url


def _ok(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


def _running(process: processes.ProcessRecord) -> bool:
    if not process.running():
        raise AssertionError(f"{process.name} exited:\n{processes.log_tail(process.log)}")
    return True
