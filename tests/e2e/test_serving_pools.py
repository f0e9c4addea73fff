"""InferenceServices in a pool (spec.pool), local backend: many services
share two tritonservers in explicit model control and one front. With a
budget that holds a quarter of the models, traffic to every service loads
and unloads models; every answer is its own service's model's, each
member's measured memory stays within its budget, loads and unloads are
counted, a hot service's model is copied onto the other member, request
counters stay per service while histograms beyond the pool's limit are
shared, `kubeloop placement plan` packs the services by the sizes the
pool measured, request logs stay per service, and tritonclient gets the
same answers, refusals and statistics through the pool's front (HTTP and
gRPC) as from the member that holds the model. Also: a pool the operator does
not run is refused by a condition, and a deleted service's model leaves
the pool. A second test: a pooled service's canary split, shadow and log,
a canary version that cannot load rolled back, and roll-forward. A third:
a pooled service's rollout, judged on the series the platform's Prometheus
scraped from the pool's front, and its drift and outcome jobs reading the
pool's log. Local backend only (the cluster path's
pools, Pods on the real node: tests/e2e/test_real_node.py).

KUBELOOP_POOL_E2E_SERVICES sets how many services (24 in make test; the
issue's 200 is the same test with 200)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
from mlflow import MlflowClient
from prometheus_client.parser import text_string_to_metric_families

from kubeloop.api.constants import API_VERSION
from kubeloop.cli.placement import render_text
from kubeloop.requestlog import request_records
from kubeloop.serving.instances import InstanceState
from kubeloop.story.labels import LabelFeed
from tests.support.conformance import assert_conforms, assert_grpc_conforms
from tests.support.models import N_FEATURES, register_broken, register_model
from tests.support.poolmemory import MemorySampler
from tests.support.rollouts import rollout_of
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e

SERVICES = int(os.environ.get("KUBELOOP_POOL_E2E_SERVICES", "24"))
MODELS = 3
"""Registered models the services serve (each service is still a Triton model of its own)."""
FIRST_MIB, NEXT_MIB = 60.0, 28.0
"""What a member grows by for its first python-backend model (the backend's
libraries with it) and for each one after (measured: the pool benchmark)."""
HOLDS = max(2, SERVICES // 8)
"""Models each member's budget holds: a quarter of the services in all."""
BUDGET_MIB = (FIRST_MIB + NEXT_MIB * (HOLDS - 1)) / 0.9 + NEXT_MIB / 2
DETAILED = 8
"""Services whose histograms are their own (the pool's detailedMetrics)."""
ROWS = np.random.default_rng(5).normal(0, 1, (3, N_FEATURES)).astype(np.float32)


@pytest.fixture
def operator(platform, namespace, start_operator, tmp_path):
    env = platform.env()
    pools = {"shared": {"members": 2, "memoryMiB": BUDGET_MIB, "spreadAt": 3, "detailedMetrics": DETAILED}}
    op = start_operator([namespace], KUBELOOP_REGISTRY="mlflow", MLFLOW_TRACKING_URI=env["MLFLOW_TRACKING_URI"],
                        KUBELOOP_SERVING_BACKENDS="local", KUBELOOP_SERVING_BACKEND="local",
                        KUBELOOP_SERVING_POOLS=json.dumps(pools), KUBELOOP_REQUEST_LOG=str(tmp_path / "requests"),
                        KUBELOOP_WORK_DIR=str(tmp_path / "work"), KUBELOOP_PROMETHEUS_URL=env["PROMETHEUS_URL"],
                        KUBELOOP_PROMETHEUS_TARGETS=env["KUBELOOP_PROMETHEUS_TARGETS"])
    op.wait_for_log("Initial authentication has finished")
    op.requests, op.work, op.pools = tmp_path / "requests", tmp_path / "work", json.dumps(pools)
    return op


def isvc(namespace: str, name: str, model: str, **spec) -> dict:
    return {"apiVersion": API_VERSION, "kind": "InferenceService", "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": {"name": model, "alias": "champion"}, **spec}}


def infer(url: str, model: str) -> requests.Response:
    body = {"inputs": [{"name": "features", "shape": list(ROWS.shape), "datatype": "FP32", "data": ROWS.tolist()}]}
    return requests.post(f"{url}/v2/models/{model}/infer", json=body, timeout=120,
                         headers={"X-Request-Key": "k"})


def pool_metrics(url: str) -> dict[tuple[str, tuple], float]:
    text = requests.get(f"{url}/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def assert_metrics_bounded(metrics: dict, namespace: str, names: list[str], hot: str) -> None:
    """Requests counted per service; latency histograms of DETAILED services
    their own, the rest's shared as _other (together: every request)."""
    requests_by = {dict(labels)["service"]: value for (name, labels), value in metrics.items()
                   if name == "kubeloop_inference_requests_total"}
    assert requests_by == {f"{namespace}/{n}": 2 + 24 * (n == hot) for n in names}, requests_by
    timed = {dict(labels)["service"]: value for (name, labels), value in metrics.items()
             if name == "kubeloop_inference_request_duration_seconds_count"}
    assert len(timed) == DETAILED + 1 and "_other" in timed, sorted(timed)
    assert sum(timed.values()) == sum(requests_by.values())


def placement_plan(platform, namespace: str, pools: str) -> dict:  # noqa: ANN001
    env = {**os.environ, **platform.env(), "KUBELOOP_SERVING_POOLS": pools}
    done = subprocess.run([sys.executable, "-m", "kubeloop.cli", "placement", "plan", "-n", namespace, "-o", "json"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def assert_packed_by_measure(plan: dict, namespace: str, names: list[str]) -> int:
    """Every service was loaded, so every size is the pool's measure; the
    members hold some at once within their budgets, the rest on demand."""
    pools = {pool["name"]: pool for pool in plan["pools"]}
    assert "no pool 'elsewhere'" in pools["elsewhere"]["error"]
    shared = pools["shared"]
    sources = {m["model"]: m["source"] for m in shared["models"]}
    assert sources == {f"{namespace}.{n}": "measured" for n in names}, sources
    held = shared["held"]
    assert all(h["usedMib"] <= shared["budgetMib"] for h in held.values()), held
    at_once = sum(len(h["models"]) for h in held.values())
    assert at_once >= 2 and at_once + len(shared["onDemand"]) == len(names), shared
    assert next(s for s in plan["services"] if s["name"] == f"{namespace}/{names[0]}")["pool"] == "shared"
    return at_once


def test_a_pool_serves_every_service_within_its_members_budgets(platform, kube, namespace, operator):
    uri = platform.env()["MLFLOW_TRACKING_URI"]
    client = MlflowClient(uri)
    models = [f"{namespace}-pooled-{i}" for i in range(MODELS)]
    for seed, model in enumerate(models):
        client.set_registered_model_alias(model, "champion", register_model(uri, model, seed=seed + 1))
    names = [f"svc-{i:03d}" for i in range(SERVICES)]
    for i, name in enumerate(names):
        kube.apply(isvc(namespace, name, models[i % MODELS], pool="shared"))
    kube.apply(isvc(namespace, "nowhere", models[0], pool="elsewhere"))

    def phases() -> dict[str, str]:
        return {name: (kube.get(API_VERSION, "InferenceService", name, namespace) or {}).get("status", {})
                .get("phase", "") for name in names}
    wait_for(lambda: set(phases().values()) == {"Ready"}, timeout=120 + SERVICES, interval=1,
             what=f"{SERVICES} pooled services Ready")
    nowhere = kube.get(API_VERSION, "InferenceService", "nowhere", namespace)["status"]
    deployed = next(c for c in nowhere["conditions"] if c["type"] == "Deployed")
    assert nowhere["phase"] == "Failed" and "no pool 'elsewhere'" in deployed["message"], deployed

    urls = {kube.get(API_VERSION, "InferenceService", n, namespace)["status"]["url"] for n in names}
    assert len(urls) == 1, f"a pool has one front, the services name {urls}"
    url = urls.pop()
    state = InstanceState.read(operator.work / "serving" / "pools" / "shared" / "state.json")
    members = {name: state.record(name).pid for name in ("member-0", "member-1")}
    answers: dict[str, list] = {}
    with MemorySampler(members) as memory, ThreadPoolExecutor(4) as calls:
        # Two rounds in different orders: the second finds most models unloaded again.
        order = names + names[::-1]
        for name, answer in zip(order, calls.map(lambda n: infer(url, f"{namespace}.{n}"), order), strict=True):
            assert answer.status_code == 200, (name, answer.text)
            body = answer.json()
            assert body["model_name"] == f"{namespace}.{name}", body
            answers.setdefault(name, []).append(body["outputs"][0]["data"])
        hot = names[SERVICES // 2]  # eight callers at once, three times: hot from the third request under way
        for _ in range(3):
            for answer in ThreadPoolExecutor(8).map(lambda _: infer(url, f"{namespace}.{hot}"), range(8)):
                assert answer.status_code == 200 and answer.json()["outputs"][0]["data"] == answers[hot][0]
    for model in range(MODELS):
        served = {json.dumps(a) for name in names[model::MODELS] for a in answers[name]}
        assert len(served) == 1, f"services of {models[model]} answered differently: {served}"
    assert len({json.dumps(answers[names[m]][0]) for m in range(MODELS)}) == MODELS, "the models answer alike"
    for member, peak in memory.peak.items():  # the memory no other process shares (kubeloop.front.memory)
        assert peak <= BUDGET_MIB, f"{member} used {peak:.0f} MiB over its empty self, budget {BUDGET_MIB:.0f}"
    metrics = pool_metrics(url)
    loads = metrics[("kubeloop_pool_loads_total", (("pool", "shared"),))]
    unloads = metrics[("kubeloop_pool_unloads_total", (("pool", "shared"),))]
    assert loads >= SERVICES and unloads >= loads - 2 * HOLDS - 2, (loads, unloads)
    assert metrics[("kubeloop_pool_failed_total", (("pool", "shared"),))] == 0
    assert metrics[("kubeloop_pool_spreads_total", (("pool", "shared"),))] >= 1, "the hot model was not copied"
    assert_metrics_bounded(metrics, namespace, names, hot)
    plan = placement_plan(platform, namespace, operator.pools)
    at_once = assert_packed_by_measure(plan, namespace, names)
    print(render_text({**plan, "services": [], "layouts": []}))
    spread = metrics[("kubeloop_pool_spreads_total", (("pool", "shared"),))]
    print(f"pool e2e: {SERVICES} services, budget {BUDGET_MIB:.0f} MiB per member, {loads:.0f} loads, "
          f"{unloads:.0f} unloads, {spread:.0f} spread, {at_once} held at once by the plan, peaks "
          f"{', '.join(f'{v:.0f}' for v in memory.peak.values())} MiB")

    # A registered model's name reaches its service where only one service serves it.
    lone = f"{namespace}-lone"
    client.set_registered_model_alias(lone, "champion", register_model(uri, lone, seed=9))
    kube.apply(isvc(namespace, "lone", lone, pool="shared"))
    wait_for(lambda: infer(url, lone).status_code == 200, timeout=60, what="the lone model by its own name")
    assert infer(url, models[0]).status_code == 409, "a model several services serve must be named by service"
    logged = {folder.name for folder in {f.parent for f in operator.requests.rglob("*.jsonl")}}
    assert f"{namespace}-{names[0]}" in logged and f"{namespace}-{names[1]}" in logged, logged
    assert all(r["version"] == "1" for r in request_records(operator.requests / f"{namespace}-{names[0]}"))

    assert_clients_conform(kube, namespace, operator, url, state)

    kube.delete(API_VERSION, "InferenceService", names[0], namespace)
    wait_for(lambda: infer(url, f"{namespace}.{names[0]}").status_code == 404, timeout=30,
             what="a deleted service gone from the pool's front")


def assert_clients_conform(kube, namespace: str, operator, url: str, state: InstanceState) -> None:  # noqa: ANN001
    """NVIDIA's clients see the pool's front as they see the member that
    holds the model: every HTTP encoding and gRPC case of the front
    conformance test (tests/support/conformance.py) gets the same tensors,
    refusals and statistics' form through the front as from that member."""
    route = json.loads(next((operator.work / "serving" / "pools" / "shared" / "routes").glob("*lone.json")).read_text())

    def holder(port: str, scheme: str):
        def find(_version: str) -> tuple[str, str]:
            for member in ("member-0", "member-1"):
                ready = f"http://127.0.0.1:{state.ports[f'{member}-http']}/v2/models/{route['triton_model']}/ready"
                if requests.get(ready, timeout=10).status_code == 200:
                    return f"{scheme}127.0.0.1:{state.ports[f'{member}-{port}']}", route["triton_model"]
            raise AssertionError(f"no member holds {route['triton_model']}")
        return find

    status = kube.get(API_VERSION, "InferenceService", "lone", namespace)["status"]
    answered = assert_conforms(url, f"{namespace}.lone", holder("http", "http://"), ROWS, route["output"])
    answered += assert_grpc_conforms(status["grpcAddress"], f"{namespace}.lone", holder("grpc", ""), ROWS,
                                     route["output"])
    assert set(answered) == {"1"}, answered


def test_a_pooled_service_keeps_its_canary_shadow_log_and_roll_forward(platform, kube, namespace, operator):
    """Local backend: a service in a pool is served as one of its own is.
    Its canary takes its share of keyed callers and a caller sticks to a
    version; its shadow is mirrored and logged, never returned; moving the
    champion alias rolls the pool's copy of the model forward; a canary
    version Triton cannot load is rolled back while the primary answers
    every caller, whether the model was loaded or idle when it came."""
    uri = platform.env()["MLFLOW_TRACKING_URI"]
    client = MlflowClient(uri)
    model = f"{namespace}-versions"
    v1 = register_model(uri, model, seed=1)
    client.set_registered_model_alias(model, "champion", v1)
    kube.apply(isvc(namespace, "versions", model, pool="shared", requestLogging={"sampleRate": 1.0}))
    status = wait_for(lambda: (s := (kube.get(API_VERSION, "InferenceService", "versions", namespace) or {})
                               .get("status", {})).get("phase") == "Ready" and s, timeout=120, what="the pooled service")
    url, served = status["url"], f"{namespace}.versions"

    def versions(keys: list[str]) -> list[str]:
        return answering(url, served, keys)

    def change(**spec) -> None:  # noqa: ANN003 - fields to set, or to drop where None
        live = kube.get(API_VERSION, "InferenceService", "versions", namespace)
        kept = {k: v for k, v in {**live["spec"], **spec}.items() if v is not None}
        kube.apply({**live, "metadata": {k: live["metadata"][k] for k in ("name", "namespace")}, "spec": kept},
                   field_manager="test")

    def status_of(field: str) -> str | None:
        return kube.get(API_VERSION, "InferenceService", "versions", namespace)["status"].get(field)

    assert set(versions(["first"])) == {v1}
    v2 = register_model(uri, model, seed=2)
    client.set_registered_model_alias(model, "challenger", v2)
    change(canary={"alias": "challenger", "percent": 20})
    wait_for(lambda: status_of("canaryVersion") == v2 and status_of("phase") == "Ready", timeout=60,
             what="the pooled canary ready")
    wait_for(lambda: v2 in versions([f"probe-{i}" for i in range(40)]), timeout=30, what="the front splitting")
    split = versions([f"caller-{i}" for i in range(400)])
    assert set(split) == {v1, v2} and abs(split.count(v2) / len(split) - 0.2) <= 0.06, split.count(v2)
    assert versions(["caller-7"] * 5) == [split[7]] * 5, "a caller sticks to its version"

    v3 = register_model(uri, model, seed=3)
    change(shadow={"version": v3, "percent": 100})
    wait_for(lambda: status_of("shadowVersion") == v3, timeout=60, what="the pooled shadow")

    def shadow_logged() -> bool:
        versions(["shadowed"])  # traffic to mirror meanwhile
        return any(r["role"] == "shadow" and r["version"] == v3
                   for r in request_records(operator.requests / f"{namespace}-versions"))

    wait_for(shadow_logged, timeout=60, what="a shadow row in the service's request log")
    assert set(versions([f"s-{i}" for i in range(20)])) <= {v1, v2}, "the shadow's answers are never returned"

    # A challenger Triton cannot load: Triton loads a model's versions all or none, so the pool loads
    # the others without it, and the split leaves its share to the primary until it is rolled back.
    broken = register_broken(uri, model)
    moved = time.monotonic()
    client.set_registered_model_alias(model, "challenger", broken)

    def rolled_back_to_the_primary() -> float:
        wait_for(lambda: status_of("rolledBackVersion") == broken, timeout=120, what="the broken canary rolled back")
        took = time.monotonic() - moved
        assert status_of("canaryVersion") is None
        wait_for(lambda: set(versions([f"after-{i}" for i in range(40)])) == {v1}, timeout=30,
                 what="the primary alone answering",
                 seen=lambda: str(Counter(versions([f"after-{i}" for i in range(40)]))))
        return took

    rolled_back, answered = answered_meanwhile(versions, rolled_back_to_the_primary)
    print(f"a canary version that cannot load: rolled back {rolled_back:.1f} s after the alias moved; "
          f"{len(answered)} requests meanwhile, answered by {dict(Counter(answered))}")
    assert set(answered) <= {v1, v2}, "each answered, never by the broken version"

    # The same canary given to a service whose model no member holds yet: its first request loads
    # the versions that can load, and it is answered by its primary while the canary is rolled back.
    kube.apply(isvc(namespace, "idle", model, pool="shared", canary={"alias": "challenger", "percent": 50}))
    wait_for(lambda: (s := (kube.get(API_VERSION, "InferenceService", "idle", namespace) or {}).get("status", {}))
             .get("canaryVersion") == broken and s.get("phase") == "Ready", timeout=60,
             what="the idle service Ready with its canary (not loaded yet)")
    cold = answering(url, f"{namespace}.idle", [f"idle-{i}" for i in range(40)])
    assert set(cold) == {v1}, Counter(cold)
    wait_for(lambda: kube.get(API_VERSION, "InferenceService", "idle", namespace)["status"].get("rolledBackVersion")
             == broken, timeout=60, what="the idle service's broken canary rolled back")
    kube.delete(API_VERSION, "InferenceService", "idle", namespace)

    # Rolled forward to a version no member holds yet: the front keeps the old routes until the
    # members have loaded it, so no caller is sent to a version that is still loading.
    change(canary=None, shadow=None)
    moved = time.monotonic()
    client.set_registered_model_alias(model, "champion", v2)

    def rolled_forward() -> float:
        wait_for(lambda: status_of("modelVersion") == v2, timeout=60, what="the champion's new version in status",
                 seen=lambda: json.dumps(kube.get(API_VERSION, "InferenceService", "versions", namespace)["status"]))
        wait_for(lambda: set(versions([f"rolled-{i}" for i in range(40)])) == {v2}, timeout=60,
                 what="the pool serving the new champion to every caller",
                 seen=lambda: str(Counter(versions([f"rolled-{i}" for i in range(40)]))))
        return time.monotonic() - moved

    forward, answered = answered_meanwhile(versions, rolled_forward)
    print(f"rolled forward to version {v2} in {forward:.1f} s; {len(answered)} requests meanwhile, answered by "
          f"{dict(Counter(answered))}")
    assert set(answered) <= {v1, v2}, "every caller answered while the members loaded the new champion"


def answered_meanwhile(versions: Callable[[list[str]], list[str]],
                       wait: Callable[[], float]) -> tuple[float, list[str]]:
    """wait()'s result, and what answered each call of a caller asking
    every 50 ms (a key of its own each time) while it ran."""
    stop = threading.Event()

    def call_all_along() -> list[str]:
        found = []
        while not stop.wait(0.05):
            found += versions([f"during-{len(found)}"])
        return found

    with ThreadPoolExecutor(1) as calling:
        seen = calling.submit(call_all_along)
        try:
            result = wait()
        finally:
            stop.set()
    return result, seen.result()


def test_a_pooled_service_is_rolled_out_on_what_its_pool_front_measured(platform, kube, namespace, operator,
                                                                         tmp_path):
    """Local backend: the pool registers its front with the platform's
    Prometheus, and a pooled service's rollout is judged on the front's
    series as a dedicated service's is: a challenger as good as the champion
    steps 20% -> 50% and is promoted, the alias moved; a challenger that
    decides the opposite is aborted at its first step by the paired
    disagreement, and every caller gets the champion again. Meanwhile the
    service's drift job reads its rows of the pool's request log, and its
    outcome job joins the callers' late labels to them (live quality)."""
    uri = platform.env()["MLFLOW_TRACKING_URI"]
    registry = MlflowClient(uri)
    model = f"{namespace}-rolled"
    champion, good = (register_model(uri, model, seed=seed) for seed in (1, 2))
    contrary = register_model(uri, model, seed=3, contrary=True)
    registry.set_registered_model_alias(model, "champion", champion)
    registry.set_registered_model_alias(model, "challenger", good)
    # The labels are arbitrary, so the live-loss guardrail is left out of the verdicts asserted here.
    rollout = {"steps": [{"weight": 20, "duration": "20s"}, {"weight": 50, "duration": "20s"}],
               "analysis": {"minRequests": 60, "maxLatencyRatio": 4.0, "latencyTolerance": "100ms",
                            "maxDisagreement": 0.3, "maxLossIncrease": 10.0}}
    labels = LabelFeed(tmp_path / "labels", delay=1.0).start()
    kube.apply(isvc(namespace, "rolled", model, pool="shared", canary={"alias": "challenger", "percent": 20},
                    rollout=rollout, requestLogging={"sampleRate": 1.0},
                    monitoring={"schedule": "10s", "window": "1h", "minRows": 200,
                                "groundTruth": {"location": str(labels.folder), "maxDelay": "10m"},
                                "performance": {"schedule": "10s", "window": "1h", "minRows": 50}}))
    url = wait_for(lambda: (s := (kube.get(API_VERSION, "InferenceService", "rolled", namespace) or {})
                            .get("status", {})).get("phase") == "Ready" and s.get("canaryVersion") == good
                   and s["url"], timeout=120, what="the pooled service and its canary")
    rng, stop = np.random.default_rng(7), threading.Event()

    def versions_answering() -> Counter:
        """Keyed callers of varied rows, ~30 a second, until stopped."""
        seen = Counter()
        while not stop.wait(1 / 30):
            rows = rng.normal(0, 1, (4, N_FEATURES)).astype(np.float32)
            body = {"inputs": [{"name": "features", "shape": list(rows.shape), "datatype": "FP32",
                                "data": rows.tolist()}]}
            key = uuid.uuid4().hex
            answer = requests.post(f"{url}/v2/models/{model}/infer", json=body, timeout=30,
                                   headers={"X-Request-Key": key})
            seen[answer.headers.get("X-Model-Version") if answer.ok else f"status {answer.status_code}"] += 1
            if answer.ok:
                labels.record(key, [int(row[0] > 0) for row in rows], time.time())
        return seen

    with ThreadPoolExecutor(1) as calling:
        calls = calling.submit(versions_answering)
        try:
            began = time.monotonic()
            promoted = rollout_of(kube, namespace, "rolled", good, timeout=300)
            took = time.monotonic() - began
            assert promoted["phase"] == "Promoted", promoted
            assert promoted["analysis"]["verdict"] == "Pass" and promoted["analysis"]["requests"] >= 60, promoted
            assert registry.get_model_version_by_alias(model, "champion").version == good

            registry.set_registered_model_alias(model, "challenger", contrary)
            aborted = rollout_of(kube, namespace, "rolled", contrary, timeout=300)
            assert aborted["phase"] == "Aborted" and aborted["step"] == 0 and aborted["weight"] == 0, aborted
            assert aborted["analysis"]["disagreement"] > 0.3 and "decided differently" in aborted["message"]
            assert registry.get_model_version_by_alias(model, "champion").version == good
            at = time.monotonic()
            wait_for(lambda: set(answering(url, model, [uuid.uuid4().hex for _ in range(20)])) == {good},
                     timeout=60, what=f"every caller answered by version {good} again")
            back = time.monotonic() - at
        finally:
            stop.set()
    answered = calls.result()
    drift = wait_for(lambda: (d := (kube.get(API_VERSION, "InferenceService", "rolled", namespace)["status"]
                                    .get("drift") or {})).get("rows", 0) >= 200 and d, timeout=60,
                     what="a drift job reading the service's rows of the pool's request log")
    assert "share" in drift and "message" not in drift, drift

    def latest() -> dict:
        return kube.get(API_VERSION, "InferenceService", "rolled", namespace)["status"].get("performance") or {}

    def judged() -> dict:
        """The latest outcome run, once it judged the primary (the new champion) on its labelled rows."""
        found = latest()
        return {v["version"]: v["rows"] for v in found.get("versions", [])}.get(good, 0) >= 50 and found

    performance = wait_for(judged, timeout=90, what="an outcome job judging the primary on labels joined to the "
                           "pool's logged rows", seen=lambda: repr(latest()))
    labels.stop()
    assert performance["labels"]["matched"] >= 200 and "message" not in performance, performance
    rows = {v["version"]: v["rows"] for v in performance["versions"]}
    print(f"pooled rollout: version {good} promoted {took:.0f} s after traffic began; version {contrary} aborted "
          f"at step 1 (disagreement {aborted['analysis']['disagreement']:.2f}), every caller on the champion "
          f"{back:.1f} s later; answers by version: {dict(answered)}; drift over the pool's log: {drift}; "
          f"labelled rows by version: {rows}, labels {performance['labels']}")
    assert set(answered) <= {champion, good, contrary}, answered


def answering(url: str, model: str, keys: list[str]) -> list[str]:
    """The version that answered each keyed caller (or the status it got instead)."""
    body = {"inputs": [{"name": "features", "shape": [1, N_FEATURES], "datatype": "FP32", "data": ROWS[:1].tolist()}]}
    answers = [requests.post(f"{url}/v2/models/{model}/infer", json=body, timeout=120,
                             headers={"X-Request-Key": key}) for key in keys]
    return [a.headers["X-Model-Version"] if a.status_code == 200 else f"status {a.status_code}" for a in answers]
