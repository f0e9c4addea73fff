"""The router's routing decisions (pure), and how it reads, counts, logs and
compares each task's answers."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kubeloop.front.router import Route, RouterConfig, _features, bucket, disagree, parse_outputs, pick
from kubeloop.requestlog import FolderStore, LogLimits, LogStoreError, RequestLog, request_records

ROUTES = (Route("primary", "1", 80), Route("canary", "2", 20))


def test_the_same_key_reaches_the_same_version_in_every_router_process():
    """Router replicas (and a restarted router) must agree: the draw may not
    depend on Python's per-process string hashing."""
    import subprocess
    import sys

    keys = [f"caller-{i}" for i in range(200)]
    here = [pick(ROUTES, k).role for k in keys]
    code = ("import json, sys; from kubeloop.front.router import Route, pick; "
            "routes = (Route('primary', '1', 80), Route('canary', '2', 20)); "
            "print(json.dumps([pick(routes, k).role for k in json.load(sys.stdin)]))")
    for seed in ("1", "2"):
        there = subprocess.run([sys.executable, "-c", code], input=json.dumps(keys), capture_output=True, text=True,
                               check=True, env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"}).stdout
        assert json.loads(there) == here
    assert 0 < here.count("canary") < len(keys)


def test_shares_follow_the_percents():
    counts = Counter(pick(ROUTES, f"k{i}").role for i in range(20000))
    assert abs(counts["canary"] / 20000 - 0.20) < 0.01


def test_the_shadow_draw_is_independent_of_the_canary_draw():
    keys = [f"k{i}" for i in range(20000)]
    canary = {k for k in keys if pick(ROUTES, k).role == "canary"}
    mirrored = {k for k in keys if bucket(k, "shadow") < 50}
    assert abs(len(canary & mirrored) / len(canary) - 0.5) < 0.03


def test_a_zero_percent_canary_gets_nothing():
    routes = (Route("primary", "1", 100), Route("canary", "2", 0))
    assert {pick(routes, f"k{i}").role for i in range(1000)} == {"primary"}


def test_features_from_flat_and_nested_v2_tensors():
    nested = {"inputs": [{"shape": [2, 3], "data": [[1, 2, 3], [4, 5, 6]]}]}
    flat = {"inputs": [{"shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]}]}
    assert _features(nested) == _features(flat) == [[1, 2, 3], [4, 5, 6]]


def test_the_traffic_gauge_shows_the_routes_the_router_reads(tmp_path, monkeypatch):
    import json
    import os

    from prometheus_client import generate_latest

    from kubeloop import processes
    from kubeloop.front.router import Router

    config = {"service": "ml/fraud", "model": "fraud", "triton_model": "fraud", "triton_url": "http://127.0.0.1:1",
              "routes": [{"role": "primary", "version": "1", "percent": 80},
                         {"role": "canary", "version": "2", "percent": 20}]}
    path = tmp_path / "routes.json"
    path.write_text(json.dumps(config))
    # As the router runs: processes.start leaves out what an earlier test's feast import set.
    for name in processes.INHERITED_NOT:
        monkeypatch.delenv(name, raising=False)
    router = Router(path)

    def shown() -> dict:
        return {(s.labels["role"], s.labels["version"]): s.value
                for metric in router.metrics.registry.collect() if metric.name == "kubeloop_router_traffic_ratio"
                for s in metric.samples}

    assert shown() == {("primary", "1"): 0.8, ("canary", "2"): 0.2}
    config["routes"] = [{"role": "primary", "version": "2", "percent": 100}]
    config["shadow"] = {"role": "shadow", "version": "3", "percent": 50}
    path.write_text(json.dumps(config))
    os.utime(path, ns=(0, path.stat().st_mtime_ns + 1))
    router.take_up_routes()
    assert shown() == {("primary", "2"): 1.0, ("shadow", "3"): 0.5}
    path.write_text("{broken")
    os.utime(path, ns=(0, path.stat().st_mtime_ns + 2))
    router.take_up_routes()
    assert shown() == {("primary", "2"): 1.0, ("shadow", "3"): 0.5}
    assert b"kubeloop_router_traffic_ratio" in generate_latest(router.metrics.registry)


# -- answers by task ----------------------------------------------------------
# Per task: the router's signature fields, the primary's (version 1) and the
# shadow's (version 2) answers for the same two rows (the second row's
# decision differs), and what the request log records as the outputs.
TASKS = {
    "binary": ({"task": "binary", "output": "probability", "threshold": 0.5},
               [[0.2], [0.7]], [[0.3], [0.4]], [0.2, 0.7]),
    "multiclass": ({"task": "multiclass", "output": "probabilities", "classes": ["a", "b", "c"]},
                   [[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]], [[0.6, 0.3, 0.1], [0.1, 0.8, 0.1]],
                   [[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]),
    "regression": ({"task": "regression", "output": "value", "tolerance": 0.05},
                   [[10.0], [100.0]], [[10.2], [150.0]], [10.0, 100.0]),
}


def v2_answer(name: str, rows: list[list[float]], nested: bool = False) -> bytes:
    import json

    data = rows if nested else [v for row in rows for v in row]
    return json.dumps({"outputs": [{"name": "other", "shape": [len(rows)], "data": [0] * len(rows)},
                                   {"name": name, "datatype": "FP32", "shape": [len(rows), len(rows[0])],
                                    "data": data}]}).encode()


def config_for(task: str) -> RouterConfig:
    fields = TASKS[task][0]
    return RouterConfig(service="ml/m", model="m", triton_model="m", triton_url="", routes=ROUTES,
                        **{**fields, "classes": tuple(fields.get("classes", ()))})


@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("nested", [False, True])
def test_outputs_are_read_by_the_signature_one_entry_per_row(task, nested):
    fields, primary, _, logged = TASKS[task]
    assert parse_outputs(v2_answer(fields["output"], primary, nested), config_for(task)) == logged


def test_an_answer_that_does_not_fit_the_signature_is_not_read():
    # A binary router reading a [2, 3] tensor, and a body that is no v2 answer.
    assert parse_outputs(v2_answer("probability", TASKS["multiclass"][1]), config_for("binary")) is None
    assert parse_outputs(b'{"error": "x"}', config_for("multiclass")) is None


@pytest.mark.parametrize("task", sorted(TASKS))
def test_the_shadow_disagrees_where_the_tasks_decision_differs(task):
    _, primary, shadow, _ = TASKS[task]
    config = config_for(task)
    rows = [parse_outputs(v2_answer(config.output, answer), config) for answer in (primary, shadow)]
    assert [disagree(config, p, s) for p, s in zip(*rows, strict=True)] == [False, True]


def test_regression_agreement_is_relative_and_two_zeros_agree():
    config = config_for("regression")
    assert not disagree(config, 0.0, 0.0)
    assert not disagree(config, -1000.0, -1040.0) and disagree(config, -1000.0, -1060.0)
    assert disagree(config, 0.0, 1e-9)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_the_router_counts_logs_and_compares_answers_by_task(task, tmp_path, monkeypatch):
    """The local backend's router (its own HTTP server, in this process) in front of a fake
    Triton that answers each version's tensors: the task's prediction metric,
    the request-log record shape and the shadow comparison (local backend;
    the real tritonserver is in tests/e2e)."""
    from kubeloop import processes

    for name in processes.INHERITED_NOT:
        monkeypatch.delenv(name, raising=False)
    fields, primary, shadow, logged = TASKS[task]
    metrics, records = asyncio.run(exchange(tmp_path, fields, {"1": primary, "2": shadow}))
    samples = {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k in ("version", "class", "le")))): s.value
               for family in text_string_to_metric_families(metrics) for s in family.samples}
    one = (("version", "1"),)
    if task == "binary":
        assert samples[("kubeloop_prediction_score_count", one)] == 2
        assert samples[("kubeloop_prediction_score_sum", one)] == pytest.approx(0.9)
    elif task == "multiclass":
        counted = {dict(labels)["class"]: value for (name, labels), value in samples.items()
                   if name == "kubeloop_predicted_class_total"}
        assert counted == {"a": 1, "c": 1}
    else:
        assert samples[("kubeloop_prediction_value_count", one)] == 2
        # Values 10 and 100 (signed buckets, so Prometheus exposes no _sum).
        assert [samples[("kubeloop_prediction_value_bucket", (("le", le), *one))] for le in ("3.0", "10.0", "100.0")] \
            == [0, 1, 2]
    predictions = {name for name, _ in samples if name.startswith(("kubeloop_prediction", "kubeloop_predicted"))}
    assert all(name.startswith(task_metric(task)) for name in predictions), predictions
    pair = [v for (name, _), v in samples.items() if name == "kubeloop_shadow_comparisons_total"]
    disagreed = [v for (name, _), v in samples.items() if name == "kubeloop_shadow_disagreements_total"]
    assert pair == [2] and disagreed == [1]
    by_role = {r["role"]: r for r in records}
    assert by_role["primary"]["features"] == ROWS and by_role["primary"]["outputs"] == logged
    assert by_role["shadow"]["outputs"] == config_outputs(task, shadow) and "features" not in by_role["shadow"]


ROWS = [[1.0, 2.0], [3.0, 4.0]]


def task_metric(task: str) -> str:
    return {"binary": "kubeloop_prediction_score", "multiclass": "kubeloop_predicted_class",
            "regression": "kubeloop_prediction_value"}[task]


def config_outputs(task: str, rows: list[list[float]]) -> list:
    return rows if task == "multiclass" else [row[0] for row in rows]


async def exchange(tmp_path, fields: dict, answers: dict[str, list[list[float]]]) -> tuple[str, list[dict]]:  # noqa: ANN001
    """One two-row request through the router, mirrored to the shadow: the
    router's /metrics once the shadow's answer is compared, and the request
    log it wrote."""
    import json

    import aiohttp
    from aiohttp import web

    from kubeloop.front.router import running

    async def infer(request: web.Request) -> web.Response:
        return web.Response(body=v2_answer(fields["output"], answers[request.match_info["version"]]),
                            content_type="application/json")

    triton = web.Application()
    triton.router.add_post("/v2/models/{model}/versions/{version}/infer", infer)
    runners = [web.AppRunner(triton)]
    await runners[0].setup()
    await web.TCPSite(runners[0], "127.0.0.1", 0).start()
    config = {"service": "ml/m", "model": "m", "triton_model": "m",
              "triton_url": f"http://127.0.0.1:{runners[0].addresses[0][1]}",
              "routes": [{"role": "primary", "version": "1", "percent": 100}],
              "shadow": {"role": "shadow", "version": "2", "percent": 100},
              "request_log": str(tmp_path / "log"), "sample_rate": 1.0, **fields}
    (tmp_path / "router.json").write_text(json.dumps(config))
    body = {"inputs": [{"name": "features", "shape": [2, 2], "datatype": "FP32", "data": ROWS}]}
    try:
        async with running(tmp_path / "router.json") as (url, _, _), aiohttp.ClientSession() as session:
            async with session.post(f"{url}/v2/models/m/infer", json=body) as response:
                assert response.status == 200
            # The shadow is asked after the caller has its answer.
            deadline = asyncio.get_running_loop().time() + 10
            while True:
                async with session.get(f"{url}/metrics") as response:
                    metrics = await response.text()
                if "kubeloop_shadow_comparisons_total{" in metrics \
                        or asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.05)
        # Leaving running() stopped the router, which writes its log as it stops.
    finally:
        await runners[0].cleanup()
    records = [json.loads(line) for path in sorted((tmp_path / "log").glob("*.jsonl"))
               for line in path.read_text().splitlines()]
    return metrics, records


@pytest.mark.parametrize("task", sorted(TASKS))
def test_the_local_backend_writes_the_signature_the_router_reads(task, tmp_path):
    """router.json as the local backend writes it from a version's signature
    tag, read back by the router."""
    import json

    from kubeloop.api.signature import TAG, ModelSignature
    from kubeloop.serving.routes import signature_fields

    fields = TASKS[task][0]
    signature = ModelSignature(task=task, feature_columns=["x", "y"], classes=list(fields.get("classes", [])),
                               threshold=0.3 if task == "binary" else None)
    path = tmp_path / "router.json"
    path.write_text(json.dumps({"service": "ml/m", "model": "m", "triton_model": "m", "triton_url": "",
                                "routes": [{"role": "primary", "version": "1", "percent": 100}],
                                **signature_fields(ModelSignature.from_tags({TAG: signature.to_json()}))}))
    config = RouterConfig.load(path)
    assert (config.task, config.output, config.classes) == (task, fields["output"], tuple(fields.get("classes", ())))
    assert config.threshold == (0.3 if task == "binary" else 0.5)
def test_the_request_log_queue_is_bounded_and_counts_what_it_drops(tmp_path):
    """Local: before, rows queued without limit while the disk refused them."""
    log = RequestLog(capacity=3)
    assert [log.add({"n": i}) for i in range(5)] == [True, True, True, False, False]
    assert log.dropped == 2 and len(log.rows) == 3


def test_rows_of_a_failed_write_go_back_in_front_as_far_as_the_queue_holds(tmp_path):
    """Local: one OSError ended the flush task for good (and with it route reloads)."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    store, log = FolderStore(blocker / "requests"), RequestLog(capacity=4)
    for i in range(3):
        log.add({"n": i})
    rows = log.take()
    with pytest.raises(LogStoreError):
        store.write(rows, time.time())
    for i in range(3, 5):
        log.add({"n": i})
    log.put_back(rows)
    assert [r["n"] for r in log.rows] == [0, 1, 2, 3] and log.dropped == 1
    blocker.unlink()
    store.write(log.take(), time.time())
    assert [r["n"] for r in request_records(blocker / "requests")] == [0, 1, 2, 3] and log.rows == []


def test_log_files_rotate_by_size_and_expire_by_age_and_total_size(tmp_path):
    """Local: files were never rotated nor removed."""
    import os

    store = FolderStore(tmp_path, LogLimits(file_bytes=200, total_bytes=1000, retention_seconds=3600))
    for i in range(40):
        store.write([{"n": i, "pad": "x" * 20}], time.time())
    files = sorted(tmp_path.glob("requests-*.jsonl"), key=lambda p: p.stat().st_mtime)
    assert len(files) > 3 and all(f.stat().st_size < 200 + 60 for f in files)
    now = files[-1].stat().st_mtime
    os.utime(files[0], (now - 7200, now - 7200))
    removed = store.expire(now)
    left = list(tmp_path.glob("requests-*.jsonl"))
    assert removed >= 1 and not files[0].exists()
    assert sum(f.stat().st_size for f in left) <= 1000 and files[-1].exists()


def test_the_drift_job_reads_only_the_files_of_its_window(tmp_path):
    """Local: the drift job rescanned every file ever written."""
    import os

    old, new = tmp_path / "requests-20270101-00.jsonl", tmp_path / "requests-20270102-00.jsonl"
    old.write_text('{"ts": 1, "n": "old"}\n')
    new.write_text('{"ts": 2000, "n": "new"}\n{"ts": 2001, "n": "being written"')
    os.utime(old, (1000, 1000))
    os.utime(new, (3000, 3000))
    assert [r["n"] for r in request_records(tmp_path, since=1500)] == ["new"]
    assert [r["n"] for r in request_records(tmp_path)] == ["old", "new"]


def _triton(answer_shadow: bool):
    """A KServe v2 stand-in: version 1 answers at once, version 2 only when released."""
    import asyncio

    from aiohttp import web

    release = asyncio.Event()

    async def infer(request: web.Request) -> web.Response:
        if request.match_info["version"] == "2" and not answer_shadow:
            await release.wait()
        return web.json_response({"outputs": [{"name": "p", "shape": [1, 1], "datatype": "FP32", "data": [0.9]}]})

    app = web.Application()
    app.router.add_post("/v2/models/{model}/versions/{version}/infer", infer)
    return app, release


def client_of(url: str):  # noqa: ANN201 - an aiohttp session whose paths are relative to url
    import aiohttp

    return aiohttp.ClientSession(base_url=url)


def _router_config(tmp_path, triton_url: str, shadow: bool = False, features=None) -> "Path":  # noqa: F821, ANN001
    """features: the FeatureSpec version 1's entity requests read, if any."""
    config = {"service": "ml/fraud", "model": "fraud", "triton_model": "fraud", "triton_url": triton_url,
              "routes": [{"role": "primary", "version": "1", "percent": 100}],
              "shadow": {"role": "shadow", "version": "2", "percent": 100} if shadow else None,
              "request_log": str(tmp_path / "requests")}
    if features is not None:
        config["features"] = {"1": features.to_dict()}
    path = tmp_path / "router.json"
    path.write_text(json.dumps(config))
    return path


def test_a_body_that_is_not_a_json_object_gets_400_and_mirrors_are_capped(tmp_path, monkeypatch):
    """Local: a JSON list crashed the handler (500); shadow mirrors had no bound."""
    import asyncio

    from aiohttp.test_utils import TestServer

    from kubeloop.front import router as module

    monkeypatch.setattr(module, "MAX_MIRRORS", 2)

    async def go():
        triton_app, release = _triton(answer_shadow=False)
        async with TestServer(triton_app) as triton:
            path = _router_config(tmp_path, str(triton.make_url("")).rstrip("/"), shadow=True)
            async with module.running(path) as (url, _, _), client_of(url) as client:
                bad = await client.post("/v2/models/fraud/infer", data=b"[1, 2]")
                answers = [await client.post("/v2/models/fraud/infer", json={
                    "id": f"r{i}", "inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]})
                    for i in range(5)]
                metrics = await (await client.get("/metrics")).text()
                release.set()
                return bad.status, [a.status for a in answers], metrics

    status, statuses, metrics = asyncio.run(go())
    assert status == 400 and statuses == [200] * 5
    assert 'kubeloop_shadow_skipped_total{service="ml/fraud"} 3.0' in metrics


def test_a_feature_store_that_cannot_be_opened_answers_503_and_the_router_is_not_ready(tmp_path, monkeypatch):
    """Local: an entity request to a version whose feature store cannot be
    opened gets 503 saying so (tried again on the next request), /ready says
    not ready, a malformed entity request still gets its 400, and a raw
    tensor request still reaches Triton."""
    import asyncio

    from aiohttp.test_utils import TestServer

    from kubeloop import processes
    from kubeloop.front import router as module
    from kubeloop.front.features import FeatureSpec

    for name in processes.INHERITED_NOT:
        monkeypatch.delenv(name, raising=False)
    spec = FeatureSpec(store=json.dumps({"path": str(tmp_path / "no-such-repository")}), views=("card_activity",),
                       entities=("card_id",), request_columns=(), columns=("avg_amount_7d",))
    entity = {"inputs": [{"name": "card_id", "shape": [1], "datatype": "INT64", "data": [7]}]}

    async def go():
        triton_app, _ = _triton(answer_shadow=True)
        async with TestServer(triton_app) as triton:
            path = _router_config(tmp_path, str(triton.make_url("")).rstrip("/"), features=spec)
            async with module.running(path) as (url, _, _), client_of(url) as client:
                first = await client.post("/v2/models/fraud/infer", json=entity)
                again = await client.post("/v2/models/fraud/infer", json=entity)
                malformed = await client.post("/v2/models/fraud/infer", json={"inputs": [
                    {"name": "merchant_id", "shape": [1], "datatype": "INT64", "data": [7]}]})
                raw = await client.post("/v2/models/fraud/infer", json={
                    "inputs": [{"name": "features", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]})
                ready = await client.get("/v2/health/ready")
                return ((first.status, (await first.json())["error"]), again.status,
                        (malformed.status, (await malformed.json())["error"]), raw.status, ready.status)

    first, again, malformed, raw, ready = asyncio.run(go())
    assert first[0] == 503 and "card_activity cannot be opened" in first[1] and again == 503
    assert malformed[0] == 400 and "lacks the input card_id" in malformed[1]
    assert raw == 200 and ready == 503


def test_a_slow_online_read_does_not_hold_up_raw_requests(tmp_path, monkeypatch):
    """Local: Feast's read blocks; it ran on the router's event loop, so every
    request waited for each entity request's retrieval."""
    import asyncio
    import threading

    from aiohttp.test_utils import TestServer

    from kubeloop.front import router as module
    from kubeloop.front.features import FeatureSpec, Retrieved, ViewInfo

    release = threading.Event()

    class SlowStore:
        views = [ViewInfo("card_activity", ("avg_amount_7d",), ("card_id",))]

        def __init__(self, spec):  # noqa: ANN001 - FeatureSpec
            self.spec = spec

        def read(self, rows):  # noqa: ANN001, ANN202 - OnlineStore's signature
            release.wait(timeout=30)
            n = len(rows["card_id"])
            return Retrieved({"avg_amount_7d": [1.0] * n}, {"card_activity": [True] * n},
                             {"card_activity": [None] * n})

    monkeypatch.setattr(module, "OnlineStore", SlowStore)
    spec = FeatureSpec(store="{}", views=("card_activity",), entities=("card_id",), request_columns=(),
                       columns=("avg_amount_7d",))
    entity = {"inputs": [{"name": "card_id", "shape": [1], "datatype": "INT64", "data": [7]}]}
    raw = {"inputs": [{"name": "features", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}

    async def go():
        triton_app, _ = _triton(answer_shadow=True)
        async with TestServer(triton_app) as triton:
            path = _router_config(tmp_path, str(triton.make_url("")).rstrip("/"), features=spec)
            async with module.running(path) as (url, _, _), client_of(url) as client:
                pending = asyncio.ensure_future(client.post("/v2/models/fraud/infer", json=entity))
                await asyncio.sleep(0)
                plain = await asyncio.wait_for(client.post("/v2/models/fraud/infer", json=raw), timeout=10)
                waiting = not pending.done()
                release.set()
                return plain.status, waiting, (await pending).status

    plain, waiting, entity_status = asyncio.run(go())
    assert plain == 200 and waiting and entity_status == 200


def test_the_fronts_routes_answer_as_kserve_v2_says_and_a_triton_that_is_gone_is_a_503(tmp_path, monkeypatch):
    """Local: the router's own HTTP server in this process, in front of a
    fake Triton that serves metadata and readiness, then is stopped."""
    import aiohttp
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from kubeloop import processes
    from kubeloop.front import router as module

    for name in processes.INHERITED_NOT:
        monkeypatch.delenv(name, raising=False)
    triton_app = web.Application()
    triton_app.router.add_get("/v2/models/{model}/versions/{version}",
                              lambda r: web.json_response({"name": r.match_info["model"], "versions": ["1"]}))
    triton_app.router.add_get("/v2/models/{model}/versions/{version}/ready", lambda r: web.Response(status=200))

    async def go():
        seen = {}
        triton = TestServer(triton_app)
        await triton.start_server()
        path = _router_config(tmp_path, str(triton.make_url("")).rstrip("/"))
        async with module.running(path) as (url, _, _), aiohttp.ClientSession(base_url=url) as client:
            for method, route in (("GET", "/v2/health/live"), ("POST", "/v2/health/live"), ("GET", "/v2/health/ready"),
                                  ("GET", "/v2/models/fraud"), ("GET", "/v2/models/fraud/ready"),
                                  ("GET", "/v2/models/other"), ("GET", "/v2/models/fraud/infer"), ("GET", "/nowhere")):
                async with client.request(method, route) as answer:
                    seen[(method, route)] = (answer.status, await answer.read())
            await triton.close()
            for method, route in (("GET", "/v2/health/ready"), ("GET", "/v2/models/fraud")):
                async with client.request(method, route) as answer:
                    seen[("gone", route)] = (answer.status, await answer.read())
            async with client.post("/v2/models/fraud/infer", json={"inputs": []}) as answer:
                seen[("gone", "infer")] = (answer.status, await answer.read())
        return seen

    seen = asyncio.run(go())
    assert seen[("GET", "/v2/health/live")][0] == 200 and seen[("POST", "/v2/health/live")][0] == 405
    assert seen[("GET", "/v2/health/ready")][0] == 200 and seen[("GET", "/v2/models/fraud/ready")][0] == 200
    assert json.loads(seen[("GET", "/v2/models/fraud")][1]) == {"name": "fraud", "versions": ["1"]}
    assert seen[("GET", "/v2/models/other")] == (404, b'{"error":"unknown model other"}')
    assert seen[("GET", "/v2/models/fraud/infer")][0] == 405 and seen[("GET", "/nowhere")][0] == 404
    assert seen[("gone", "/v2/health/ready")][0] == 503
    assert seen[("gone", "/v2/models/fraud")][0] == 503 and b"model server unavailable" in seen[("gone", "/v2/models/fraud")][1]
    assert seen[("gone", "infer")][0] == 503 and b"model server unavailable" in seen[("gone", "infer")][1]


def recording_triton(server: str, asked: list[str]):  # noqa: ANN201 - an aiohttp application
    """A Triton stand-in named `server` that notes each route it is asked
    ("server METHOD path"): its GET routes answer where they were asked, and
    infer answers each row 0.1 times the version."""
    from aiohttp import web

    async def where(request: web.Request) -> web.Response:
        asked.append(f"{server} {request.method} {request.path}")
        return web.json_response({"server": server, "path": request.path})

    async def infer(request: web.Request) -> web.Response:
        asked.append(f"{server} {request.method} {request.path}")
        version = request.match_info["version"]
        rows = json.loads(await request.read())["inputs"][0]["shape"][0]
        return web.json_response({"model_name": request.match_info["model"], "model_version": version, "outputs": [
            {"name": "probability", "datatype": "FP32", "shape": [rows, 1], "data": [0.1 * int(version)] * rows}]})

    app = web.Application()
    for route in ("/v2", "/v2/models/{model}/versions/{version}",
                  "/v2/models/{model}/versions/{version}/{action:ready|config|stats}"):
        app.router.add_get(route, where, allow_head=False)
    app.router.add_post("/v2/models/{model}/versions/{version}/infer", infer)
    return app


def test_tritonclient_reaches_the_server_metadata_and_each_served_versions_routes(tmp_path, monkeypatch):
    """Local: the front answered only the model's own metadata, readiness and
    infer routes, so tritonclient's server metadata, config, statistics and
    per-version calls were 404s. A named version is called past the split
    (here a 0% canary on a Triton of its own), counted and logged under its
    role; routes without a version are the primary's."""
    import aiohttp
    import numpy as np
    import tritonclient.http as httpclient
    from aiohttp.test_utils import TestServer
    from tritonclient.utils import InferenceServerException

    from kubeloop import processes
    from kubeloop.front import router as module

    for name in processes.INHERITED_NOT:
        monkeypatch.delenv(name, raising=False)
    asked: list[str] = []

    def tritonclient_calls(url: str) -> dict:
        client = httpclient.InferenceServerClient(url.removeprefix("http://"), network_timeout=10)
        features = httpclient.InferInput("features", [2, 2], "FP32").set_data_from_numpy(np.zeros((2, 2), np.float32))
        try:
            client.get_model_metadata("fraud", "7")
        except InferenceServerException as exc:
            unknown = str(exc)
        return {"server": client.get_server_metadata(), "metadata": client.get_model_metadata("fraud", "2"),
                "config": client.get_model_config("fraud"), "version config": client.get_model_config("fraud", "2"),
                "stats": client.get_inference_statistics("fraud", "2"), "ready": client.is_model_ready("fraud", "2"),
                "infer": client.infer("fraud", [features], model_version="2").as_numpy("probability").ravel().tolist(),
                "unknown": unknown}

    async def go() -> tuple[dict, dict, str]:
        async with TestServer(recording_triton("A", asked)) as a, TestServer(recording_triton("B", asked)) as b:
            config = keyed_config(tmp_path, str(a.make_url("")).rstrip("/"), triton_model="fraud_trt",
                                  routes=[{"role": "primary", "version": "1", "percent": 100},
                                          {"role": "canary", "version": "2", "percent": 0}],
                                  shadow={"role": "shadow", "version": "3", "percent": 0},
                                  version_urls={"2": str(b.make_url("")).rstrip("/")})
            async with module.running(config) as (url, _, _), aiohttp.ClientSession(base_url=url) as client:
                called = await asyncio.to_thread(tritonclient_calls, url)
                seen = {}
                for method, route in (("POST", "/v2/models/fraud/infer"),
                                      ("POST", "/v2/models/fraud/versions/1/infer"),
                                      ("GET", "/v2/models/fraud/versions/3"),
                                      ("POST", "/v2/models/fraud/versions/7/infer"),
                                      ("GET", "/v2/models/fraud/versions/2/infer"),
                                      ("GET", "/v2/models/fraud/versions"),
                                      ("GET", "/v2/models/fraud/versions/2/other")):
                    async with client.request(method, route, json=one_row(1.0)) as answer:
                        seen[(method, route)] = (answer.status, answer.headers.get("X-Model-Role"), await answer.read())
                for route in ("/v2", "/v2/health/live", "/v2/models/fraud/versions/2/config", "/metrics"):
                    async with client.get(route) as got, client.head(route) as head:
                        seen[("HEAD", route)] = (head.status, dict(head.headers), await head.read(),
                                                 got.status, dict(got.headers))
                metrics = await (await client.get("/metrics")).text()
        return called, seen, metrics

    called, seen, metrics = asyncio.run(go())
    assert called["server"] == {"server": "A", "path": "/v2"}
    assert called["metadata"] == {"server": "B", "path": "/v2/models/fraud_trt/versions/2"}
    assert called["config"] == {"server": "A", "path": "/v2/models/fraud_trt/versions/1/config"}
    assert called["version config"] == {"server": "B", "path": "/v2/models/fraud_trt/versions/2/config"}
    assert called["stats"] == {"server": "B", "path": "/v2/models/fraud_trt/versions/2/stats"}
    assert called["ready"] and called["infer"] == pytest.approx([0.2, 0.2])
    assert "model fraud has no version 7 here; it serves 1 (primary), 2 (canary)" in called["unknown"]
    # The split sends every routed request to the primary; a named version is called as named.
    assert seen[("POST", "/v2/models/fraud/infer")][:2] == (200, "primary")
    assert seen[("POST", "/v2/models/fraud/versions/1/infer")][:2] == (200, "primary")
    assert seen[("GET", "/v2/models/fraud/versions/3")][0] == 404  # the shadow is no version callers may name
    assert seen[("POST", "/v2/models/fraud/versions/7/infer")][0] == 404
    assert seen[("GET", "/v2/models/fraud/versions/2/infer")][0] == 405
    assert seen[("GET", "/v2/models/fraud/versions")][0] == seen[("GET", "/v2/models/fraud/versions/2/other")][0] == 404
    assert sorted(a for a in asked if " POST " in a) == ["A POST /v2/models/fraud_trt/versions/1/infer"] * 2 + [
        "B POST /v2/models/fraud_trt/versions/2/infer"]
    assert asked.count("A GET /v2") == 3  # tritonclient's, then the GET's and the HEAD's (a GET to Triton)
    for route in ("/v2", "/v2/health/live", "/v2/models/fraud/versions/2/config", "/metrics"):
        status, headers, body, get_status, get_headers = seen[("HEAD", route)]
        assert (status, body) == (get_status, b"") and headers.keys() == get_headers.keys(), route
        if route != "/metrics":  # the metrics grow between the two
            assert headers == get_headers, route
    requests = {(s.labels["version"], s.labels["role"]): s.value for family in text_string_to_metric_families(metrics)
                for s in family.samples if s.name == "kubeloop_inference_requests_total"}
    assert requests == {("1", "primary"): 2, ("2", "canary"): 1}
    logged = sorted((row["version"], row["role"]) for row in request_records(tmp_path / "requests"))
    assert logged == [("1", "primary"), ("1", "primary"), ("2", "canary")]


# -- sticky sampling, paired comparison -----------------------------------------
# The real router in this process (local backend) in front of a fake Triton
# whose answer for a row depends on the version and the row's first feature.

def fake_triton(score, hold: str | None = None):  # noqa: ANN001, ANN201 - score(version, x) -> probability
    """A KServe v2 stand-in answering each row score(version, its first
    feature), for a lone JSON request and for the router's joined binary
    one alike; the version `hold` answers only once released."""
    import numpy as np
    from aiohttp import web

    from kubeloop.front.features import flat_values

    release = asyncio.Event()

    async def infer(request: web.Request) -> web.Response:
        version, body = request.match_info["version"], await request.read()
        if version == hold:
            await release.wait()
        length = int(request.headers.get("Inference-Header-Content-Length", len(body)))
        tensor = json.loads(body[:length])["inputs"][0]
        flat = np.frombuffer(body[length:], np.float32) if length < len(body) else flat_values(tensor["data"])
        data = [score(version, float(x)) for x in flat[::tensor["shape"][1]]]
        return web.json_response({"outputs": [{"name": "probability", "datatype": "FP32",
                                               "shape": [len(data), 1], "data": data}]})

    app = web.Application()
    app.router.add_post("/v2/models/{model}/versions/{version}/infer", infer)
    return app, release


def keyed_config(tmp_path, triton_url: str, **fields) -> "Path":  # noqa: F821, ANN001
    config = {"service": "ml/fraud", "model": "fraud", "triton_model": "fraud", "triton_url": triton_url,
              "routes": [{"role": "primary", "version": "1", "percent": 100}],
              "request_log": str(tmp_path / "requests"), "task": "binary", "output": "probability", **fields}
    path = tmp_path / "router.json"
    path.write_text(json.dumps(config))
    return path


def sent(body: dict | tuple[bytes, int | None]) -> tuple[bytes, dict[str, str]]:
    """A request body and its headers: a dict as JSON, or what
    tritonclient's generate_request_body built (binary when it gives the
    JSON's length)."""
    if isinstance(body, dict):
        return json.dumps(body).encode(), {"Content-Type": "application/json"}
    data, json_size = body
    return data, {} if json_size is None else {"Inference-Header-Content-Length": str(json_size)}


async def read_answer(answer) -> dict:  # noqa: ANN001 - an aiohttp response
    """A v2 answer as JSON, its binary outputs read by tritonclient (flat)."""
    from tritonclient.http import InferResult

    length = answer.headers.get("Inference-Header-Content-Length")
    if length is None:
        return await answer.json()
    result = InferResult.from_response_body(await answer.read(), header_length=int(length))
    whole = result.get_response()
    return {**whole, "outputs": [{**tensor, "data": result.as_numpy(tensor["name"]).ravel().tolist()}
                                 for tensor in whole["outputs"]]}


async def send_keyed(tmp_path, fields: dict, score, requests: list[tuple[str | None, dict | tuple]],  # noqa: ANN001
                     callers: int = 8) -> tuple[list[tuple[str | None, str, dict]], dict, list[dict]]:
    """Each (key, body) through a router of keyed_config(**fields), `callers`
    at a time (so calls to Triton are joined too), the key in
    X-Request-Key, the body as sent() sends it: each caller's key,
    answering role and answer; then, once every mirror is done, the metrics
    (name and labels -> value) and the request log's rows."""
    from aiohttp.test_utils import TestServer

    from kubeloop.front import router as module

    triton_app, _ = fake_triton(score)
    async with TestServer(triton_app) as triton:
        config = keyed_config(tmp_path, str(triton.make_url("")).rstrip("/"), **fields)
        async with module.running(config) as (url, router, _), client_of(url) as client:
            gate = asyncio.Semaphore(callers)

            async def one(key: str | None, body: dict | tuple) -> tuple[str | None, str, dict]:
                data, headers = sent(body)
                async with gate, client.post("/v2/models/fraud/infer", data=data,
                                             headers={**headers, **({"X-Request-Key": key} if key else {})}) as answer:
                    assert answer.status == 200, await answer.text()
                    return key, answer.headers["X-Model-Role"], await read_answer(answer)

            answers = await asyncio.gather(*(one(key, body) for key, body in requests))
            # Mirrors start as each answer is written: all are under way by now.
            deadline = time.monotonic() + 10
            while router.mirrors and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            metrics = await (await client.get("/metrics")).text()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(metrics) for s in family.samples}
    return answers, samples, list(request_records(tmp_path / "requests"))


def one_row(x: float = 0.0) -> dict:
    return {"inputs": [{"name": "features", "shape": [1, 2], "datatype": "FP32", "data": [x, x]}]}


def test_request_logging_samples_by_key_so_a_key_is_always_logged_or_never(tmp_path, monkeypatch):
    """Local: rows were sampled by a random draw per request, so a label
    could not tell whether its prediction was logged, nor which share was."""
    from kubeloop import processes
    from kubeloop.requestlog import sampled

    for name in processes.INHERITED_NOT:
        monkeypatch.delenv(name, raising=False)
    keys = [f"caller-{i}" for i in range(2000)]
    again = keys[:300]  # asked twice: logged both times or neither
    answers, samples, rows = asyncio.run(send_keyed(
        tmp_path, {"sample_rate": 0.3}, lambda version, x: 0.9,
        [(key, one_row()) for key in keys + again], callers=16))
    assert len(answers) == len(keys) + len(again)
    logged = Counter(row["key"] for row in rows)
    assert set(logged) == {key for key in keys if sampled(key, 0.3)}
    assert abs(len(logged) / len(keys) - 0.3) < 0.02
    assert all(logged[key] == 2 for key in again if key in logged)
    assert all(logged[key] == 1 for key in keys[300:] if key in logged)
    assert samples[("kubeloop_request_log_sample_rate", (("service", "ml/fraud"),))] == 0.3


PAIRED_ROUTES = (Route("primary", "1", 50), Route("canary", "2", 50))


def paired_score(version: str, x: float) -> float:
    """The primary (1) and the canary (2) agree on rows of x = 0 (both below
    0.5) and decide differently on rows of x = 1."""
    return {("1", 0.0): 0.2, ("1", 1.0): 0.7, ("2", 0.0): 0.3, ("2", 1.0): 0.4}[(version, x)]


def tritonclient_body(rows: list[list[float]]) -> tuple[bytes, int | None]:
    """What tritonclient sends for an FP32 tensor of rows, naming no outputs:
    the tensor binary, all outputs asked binary."""
    import numpy as np
    from tritonclient.http import InferenceServerClient, InferInput

    tensor = InferInput("features", [len(rows), len(rows[0])], "FP32")
    tensor.set_data_from_numpy(np.array(rows, np.float32), binary_data=True)
    return InferenceServerClient.generate_request_body([tensor])


@pytest.mark.parametrize("encoding", ["json", "binary"])
def test_a_keyed_share_of_the_canarys_requests_is_paired_with_the_primary(encoding, tmp_path, monkeypatch):
    """Local: the canary and the primary were never asked the same request,
    so a rollout could not compare them on the same traffic nor join one
    label to both predictions. Binary requests (tritonclient's) are routed,
    paired, logged and counted as their JSON twins."""
    from kubeloop import processes

    for name in processes.INHERITED_NOT:
        monkeypatch.delenv(name, raising=False)
    keys = [f"k{i}" for i in range(400)]
    two_rows = ({"inputs": [{"name": "features", "shape": [2, 2], "datatype": "FP32", "data": [0, 0, 1, 1]}]}
                if encoding == "json" else tritonclient_body([[0, 0], [1, 1]]))
    config = {"routes": [{"role": r.role, "version": r.version, "percent": r.percent} for r in PAIRED_ROUTES],
              "compare": {"percent": 50}, "sample_rate": 1.0}
    answers, samples, rows = asyncio.run(send_keyed(
        tmp_path, config, paired_score, [(key, two_rows) for key in keys] + [(None, two_rows)]))
    by_role: dict[str, dict[str, dict]] = {}
    for row in rows:
        by_role.setdefault(row["role"], {})[row["key"]] = row
    # A request without a key is logged under the random key it was given
    # (and reaches a version at random).
    [unkeyed] = {*by_role["primary"], *by_role["canary"]} - set(keys)
    assert len(unkeyed) == 16
    assert all(row["features"] == [[0, 0], [1, 1]] for role in ("primary", "canary")
               for row in by_role[role].values())
    canary = {key for key in [*keys, unkeyed] if key in by_role["canary"]}
    assert canary - {unkeyed} == {key for key in keys if pick(PAIRED_ROUTES, key).role == "canary"}
    paired = {key for key in canary if bucket(key, "compare") < 50}
    assert 0 < len(paired) < len(canary) < len(keys)
    # Callers get the version their key reaches, never the paired answer.
    for key, role, answer in answers[:-1]:
        assert role == ("canary" if key in canary else "primary")
        assert answer["outputs"][0]["data"] == pytest.approx([0.3, 0.4] if key in canary else [0.2, 0.7])
    # The primary's answer to each paired request, under the canary row's key.
    assert set(by_role["paired"]) == paired
    assert all(row["version"] == "1" and row["outputs"] == pytest.approx([0.2, 0.7])
               for row in by_role["paired"].values())
    pair = (("canary", "2"), ("model", "fraud"), ("primary", "1"), ("service", "ml/fraud"))
    # Two rows per paired request, the second decided differently.
    assert samples[("kubeloop_canary_comparisons_total", pair)] == 2 * len(paired)
    assert samples[("kubeloop_canary_disagreements_total", pair)] == len(paired)

    def requests(version: str, role: str) -> float:
        return samples[("kubeloop_inference_requests_total", (("code", "200"), ("model", "fraud"), ("role", role),
                                                               ("service", "ml/fraud"), ("version", version)))]

    # The paired calls count as such: the primary's callers' figures stay theirs.
    assert requests("1", "paired") == len(paired)
    assert (requests("1", "primary"), requests("2", "canary")) == (len(keys) + 1 - len(canary), len(canary))


def test_paired_requests_share_the_mirrors_bound_and_what_does_not_fit_is_counted(tmp_path, monkeypatch):
    """Local: with MAX_MIRRORS paired calls waiting for a slow primary, the
    canary's next requests are answered at once and not paired, counted."""
    from aiohttp.test_utils import TestServer

    from kubeloop.front import router as module

    monkeypatch.setattr(module, "MAX_MIRRORS", 2)

    async def go() -> tuple[list[str], int, str]:
        triton_app, release = fake_triton(paired_score, hold="1")
        async with TestServer(triton_app) as triton:
            path = keyed_config(tmp_path, str(triton.make_url("")).rstrip("/"), compare={"percent": 100},
                                routes=[{"role": "primary", "version": "1", "percent": 0},
                                        {"role": "canary", "version": "2", "percent": 100}])
            async with module.running(path) as (url, router, _), client_of(url) as client:
                roles = []
                for i in range(5):
                    async with client.post("/v2/models/fraud/infer", json=one_row(),
                                           headers={"X-Request-Key": f"k{i}"}) as answer:
                        roles.append(answer.headers["X-Model-Role"])
                in_flight = len(router.mirrors)
                metrics = await (await client.get("/metrics")).text()
                release.set()
                return roles, in_flight, metrics

    roles, in_flight, metrics = asyncio.run(go())
    assert roles == ["canary"] * 5 and in_flight == 2
    assert 'kubeloop_canary_comparisons_skipped_total{service="ml/fraud"} 3.0' in metrics


def test_the_router_compares_only_when_its_routes_say_so(tmp_path):
    """The backends' routes pair a canary's requests (25% of a 20% canary) only while a canary is served."""
    from kubeloop.serving.routes import build_router_config
    from tests.unit.test_builders_serving import _front_request

    with_canary = build_router_config(_front_request(replicas=1), "m", "http://t", None)
    without = build_router_config(_front_request(replicas=1), "m", "http://t", None, roles=("primary", "shadow"))
    assert with_canary["compare"] == {"percent": 25} and "compare" not in without
    for routes, percent in ((with_canary, 25), (without, 0.0)):
        path = tmp_path / "router.json"
        path.write_text(json.dumps(routes))
        assert RouterConfig.load(path).compare_percent == percent


def test_a_paired_copy_never_takes_the_primarys_call_from_its_callers(tmp_path):
    """Local: a paired call in flight to an idle primary goes past its one
    call to Triton, so a caller of the primary arriving meanwhile is sent at
    once instead of waiting behind the copy."""
    from aiohttp.test_utils import TestServer

    from kubeloop.front import router as module

    async def go() -> tuple[bool, int]:
        triton_app, release = fake_triton(paired_score, hold="1")
        async with TestServer(triton_app) as triton:
            path = keyed_config(tmp_path, str(triton.make_url("")).rstrip("/"), compare={"percent": 100},
                                routes=[{"role": "primary", "version": "1", "percent": 0},
                                        {"role": "canary", "version": "2", "percent": 100}])
            async with module.running(path) as (url, router, _), client_of(url) as client:
                async with client.post("/v2/models/fraud/infer", json=one_row(), headers={"X-Request-Key": "k"}):
                    pass
                while not router.mirrors:
                    await asyncio.sleep(0.01)
                idle, in_flight = router.upstreams["1"].idle, len(router.mirrors)
                release.set()
                return idle, in_flight

    idle, in_flight = asyncio.run(go())
    assert in_flight == 1 and idle


@pytest.mark.parametrize("request_id", ["r1", None, 7])
def test_an_entity_requests_rows_are_those_joinable_reads_from_its_triton_request(request_id):
    """Backend-independent (local and cluster routers run this code): the
    router hands the Triton coalescer an entity request's vectors as rows
    without reading back the request it built of them."""
    from kubeloop.front.batching import joinable
    from kubeloop.front.features import Assembled, tensor_request
    from kubeloop.front.router import _vector_rows

    assembled = Assembled([[1.0, 2.5], [3.0, -4.0]], [], joined=2)
    assert _vector_rows(assembled, 2, request_id) == joinable(tensor_request(assembled.vectors,
                                                                             request_id=request_id))
    assert _vector_rows(Assembled([[]], []), 0, None) is None is joinable(tensor_request([[]]))
