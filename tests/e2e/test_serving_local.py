"""InferenceService with the local backend: the real tritonserver behind the
router, answering KServe v2 requests; canary split, shadow mirroring,
rollback of a canary that cannot load, and clean deletion."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
import requests
from mlflow import MlflowClient
from prometheus_client.parser import text_string_to_metric_families

from kubeloop.api.constants import API_VERSION
from kubeloop import processes
from kubeloop.requestlog import request_records
from tests.support.models import N_FEATURES, register_broken, register_model, synthetic
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def operator(platform, namespace, start_operator, tmp_path):
    env = platform.env()
    op = start_operator([namespace], KUBELOOP_REGISTRY="mlflow", MLFLOW_TRACKING_URI=env["MLFLOW_TRACKING_URI"],
                        KUBELOOP_SERVING_BACKENDS="local,kubernetes", KUBELOOP_SERVING_BACKEND="local",
                        KUBELOOP_REQUEST_LOG=str(tmp_path / "requests"))
    op.wait_for_log("Initial authentication has finished")
    op.requests = tmp_path / "requests"
    return op


def isvc(namespace: str, model: str, **spec) -> dict:
    return {"apiVersion": API_VERSION, "kind": "InferenceService", "metadata": {"name": "fraud", "namespace": namespace},
            "spec": {"model": {"name": model, "alias": "champion"}, **spec}}


def get(kube, namespace):
    return kube.get(API_VERSION, "InferenceService", "fraud", namespace)


def infer(url: str, model: str, rows: np.ndarray, key: str | None = None) -> requests.Response:
    body = {"inputs": [{"name": "features", "shape": list(rows.shape), "datatype": "FP32",
                        "data": rows.tolist()}]}
    return requests.post(f"{url}/v2/models/{model}/infer", json=body, timeout=10,
                         headers={"X-Request-Key": key} if key else {})


def deployed(found: dict) -> dict:
    return next(c for c in found["status"]["conditions"] if c["type"] == "Deployed")


class Sampler:
    """(phase, Deployed reason, modelVersion, status of a request) every 50 ms
    on a thread of its own, while the block runs."""

    def __init__(self, platform, namespace: str, model: str, rows: np.ndarray):
        self.kube, self.namespace, self.model, self.rows = platform.kube(), namespace, model, rows
        self.samples: list[tuple] = []
        self.stop = threading.Event()

    def __enter__(self) -> list[tuple]:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self.samples

    def _run(self) -> None:
        while not self.stop.wait(0.05):
            try:
                found = get(self.kube, self.namespace)
                code = infer(found["status"]["url"], self.model, self.rows).status_code
                self.samples.append((found["status"]["phase"], deployed(found)["reason"],
                                     found["status"]["modelVersion"], code))
            except Exception as exc:  # noqa: BLE001 - a failed sample is a finding, not the end of sampling
                self.samples.append(("error", repr(exc), None, None))

    def __exit__(self, *_exc) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        self.kube.close()


def routes(url: str) -> dict[tuple[str, str], float]:
    """(role, version) -> share, as the router's /metrics says it routes now."""
    text = requests.get(f"{url}/metrics", timeout=5).text
    return {(s.labels["role"], s.labels["version"]): s.value for family in text_string_to_metric_families(text)
            if family.name == "kubeloop_router_traffic_ratio" for s in family.samples}


def test_local_serving_end_to_end(platform, kube, namespace, operator):
    """Local path: the local serving backend and its router, against real tritonserver and MLflow."""
    uri = platform.env()["MLFLOW_TRACKING_URI"]
    client = MlflowClient(uri)
    model = f"{namespace}-fraud"
    kube.create(isvc(namespace, model, requestLogging={"sampleRate": 1.0}))
    pending = wait_for(lambda: (o := get(kube, namespace)) and o.get("status", {}).get("phase") and o, timeout=60)
    assert pending["status"]["phase"] == "Pending"

    # Registered -> answering real predictions over HTTP v2 within 30 s.
    v1 = register_model(uri, model, seed=1)
    client.set_registered_model_alias(model, "champion", v1)
    registered = time.monotonic()
    x, _ = synthetic(rows=64, seed=7)

    def answering():
        status = get(kube, namespace).get("status", {})
        if status.get("phase") != "Ready":
            return None
        response = infer(status["url"], model, x[:4])
        return status if response.status_code == 200 else None

    status = wait_for(answering, timeout=30, interval=0.2, what="predictions within 30 s")
    first_answer = time.monotonic() - registered
    assert status["url"].startswith("http://127.0.0.1:") and status["modelVersion"] == v1
    answer = infer(status["url"], model, x[:4]).json()
    scores = answer["outputs"][0]["data"]
    assert len(scores) == 4 and all(0 <= s <= 1 for s in scores) and len(set(scores)) > 1
    print(f"first prediction {first_answer:.1f} s after registration")

    # A 20% canary gets 20% +- 3% of 2,000 requests, and a caller sticks to a version.
    v2 = register_model(uri, model, seed=2)
    client.set_registered_model_alias(model, "challenger", v2)
    live = get(kube, namespace)
    live["spec"]["canary"] = {"alias": "challenger", "percent": 20}
    # While Triton loads v2 beside v1, v1 answers and the service stays Ready on it.
    with Sampler(platform, namespace, model, x[:1]) as samples:
        kube.apply({**live, "metadata": {k: live["metadata"][k] for k in ("name", "namespace")}}, field_manager="test")
        wait_for(lambda: get(kube, namespace)["status"].get("canaryVersion") == v2
                 and get(kube, namespace)["status"]["phase"] == "Ready"
                 and deployed(get(kube, namespace))["reason"] == "Available", timeout=30, what="canary ready")
    assert {(phase, code) for phase, _, _, code in samples} == {("Ready", 200)}, samples
    assert {version for _, reason, version, _ in samples if reason == "Updating"} <= {v1}, samples
    # The swap can finish between two samples; the operator's Events keep every transition.
    wait_for(lambda: any(e["reason"] == "Updating" and f"version {v1} answers" in e["message"]
                         for e in kube.list("v1", "Event", namespace)), timeout=30, what="the Updating event")
    url = get(kube, namespace)["status"]["url"]
    wait_for(lambda: routes(url) == {("primary", v1): 0.8, ("canary", v2): 0.2}, timeout=10, what="the router's new routes")
    served = [infer(url, model, x[i % 64:i % 64 + 1], key=f"caller-{i}").headers["X-Model-Version"]
              for i in range(2000)]
    share = served.count(v2) / len(served)
    assert abs(share - 0.20) <= 0.03, share
    assert {infer(url, model, x[:1], key="caller-7").headers["X-Model-Version"] for _ in range(10)} == {served[7]}

    # Shadow: mirrored, logged, compared, never returned.
    v3 = register_model(uri, model, seed=3)
    live = get(kube, namespace)
    live["spec"]["shadow"] = {"version": v3, "percent": 100}
    kube.apply({**live, "metadata": {k: live["metadata"][k] for k in ("name", "namespace")}}, field_manager="test")
    wait_for(lambda: get(kube, namespace)["status"].get("shadowVersion") == v3, timeout=30, what="shadow")
    wait_for(lambda: routes(url).get(("shadow", v3)) == 1.0, timeout=10, what="the router mirroring")
    answers = [infer(url, model, x[i:i + 1], key=f"s-{i}") for i in range(50)]
    assert {a.headers["X-Model-Version"] for a in answers} <= {v1, v2}
    assert all(a.json()["model_version"] in (v1, v2) for a in answers)

    def shadow_requests() -> float:
        metrics = requests.get(f"{url}/metrics", timeout=5).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                   if line.startswith("kubeloop_inference_requests_total") and 'role="shadow"' in line)

    # Mirroring runs after the caller has its answer, so it may trail a little.
    wait_for(lambda: shadow_requests() >= 50, timeout=10, what="every request mirrored")
    assert "kubeloop_shadow_comparisons_total" in requests.get(f"{url}/metrics", timeout=5).text

    def logged() -> list[dict]:
        return [r for folder in {f.parent for f in operator.requests.rglob("*.jsonl")} for r in request_records(folder)]

    # The router writes its log every half second.
    rows = wait_for(lambda: (r := logged()) and any(x["role"] == "shadow" and x["version"] == v3 for x in r) and r,
                    timeout=10, what="shadow rows in the request log")
    assert any(r["role"] == "primary" and len(r["features"][0]) == N_FEATURES
               and len(r["outputs"]) == len(r["features"]) and all(0 <= o <= 1 for o in r["outputs"]) for r in rows)

    # A canary version Triton cannot load is rolled back; the primary keeps serving.
    broken = register_broken(uri, model)
    client.set_registered_model_alias(model, "challenger", broken)
    degraded = wait_for(lambda: (o := get(kube, namespace))["status"].get("rolledBackVersion") == broken and o,
                        timeout=60, what="rollback")
    cond = next(c for c in degraded["status"]["conditions"] if c["type"] == "CanaryReady")
    assert cond["reason"] == "RolledBack" and degraded["status"]["phase"] == "Degraded"
    assert "canaryVersion" not in degraded["status"]
    wait_for(lambda: {k: v for k, v in routes(url).items() if k[0] != "shadow"} == {("primary", v1): 1.0},
             timeout=10, what="the router without the canary")
    assert {infer(url, model, x[:1], key=f"after-{i}").headers["X-Model-Version"] for i in range(100)} == {v1}

    # Deleting the InferenceService stops its processes.
    state = json.loads(next((operator.log_dir.parent / "work" / "serving").glob("*/state.json")).read_text())
    records = [processes.ProcessRecord(**p) for p in state["processes"].values()]
    assert all(r.running() for r in records)
    kube.delete(API_VERSION, "InferenceService", "fraud", namespace)
    wait_for(lambda: get(kube, namespace) is None, timeout=30, what="deleted")
    wait_for(lambda: not any(r.running() for r in records), timeout=15, what="processes stopped")
    assert not list((operator.log_dir.parent / "work" / "serving").glob("*"))
