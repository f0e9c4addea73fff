"""Pooled services suite: InferenceServices (1,000; 32 quick) that name one
pool of tritonservers (4 members; 2 quick), reconciled by the operator on
the local platform (local backend) and called through the pool's front,
against one dedicated InferenceService (its own tritonserver and front) of
the same registered version. Zipf-skewed traffic over the services (s = 1.1,
four callers at once); the members' budgets hold a quarter of the models
together. Reported: the operator's create -> Ready for every service,
servers and memory against a dedicated service each (ratio; the dedicated
service's tritonserver and front measured with its model loaded), the hit
rate, the first request to each service (always a cold load) p50/p99, the
members' peak memory against their budgets, and a loaded model's request
p50/p99 through the pool against the dedicated service (interleaved
rounds). Local backend: what tests/bench/pool_suite.py measures of the
pool alone, here through the operator, the routers and the front."""

from __future__ import annotations

import json
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import requests
from mlflow import MlflowClient
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from kubeloop.api.constants import API_VERSION
from kubeloop.front.memory import private_mib
from kubeloop.serving.instances import InstanceState
from tests.bench.repeat import RUNS, Figure, figures_table
from tests.support.models import N_FEATURES, register_model
from tests.support.operator import OperatorProcess
from tests.support.poolmemory import MemorySampler
from tests.support.waiting import wait_for

CALLERS = 4
FIRST_MIB, NEXT_MIB = 60.0, 28.0
"""A python-backend model's growth of its member: the first (with the backend's libraries), then each."""
ROWS = np.random.default_rng(3).normal(0, 1, (1, N_FEATURES)).round(4).tolist()
BODY = {"inputs": [{"name": "features", "shape": [1, N_FEATURES], "datatype": "FP32", "data": ROWS}]}


def run(context, console: Console, quick: bool = False) -> dict:  # noqa: ANN001 - the bench context
    return sized(context, console, *((32, 2, 240) if quick else (1000, 4, 2400)))


def sized(context, console: Console, services: int, members: int, calls: int) -> dict:  # noqa: ANN001 - the bench context
    platform, kube = context.platform, context.platform.kube()
    namespace = f"bench-pool-{uuid.uuid4().hex[:6]}"
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    uri = platform.env()["MLFLOW_TRACKING_URI"]
    model = f"{namespace}-m"
    MlflowClient(uri).set_registered_model_alias(model, "champion", register_model(uri, model, seed=3))
    budget = (FIRST_MIB + NEXT_MIB * (services / 4 / members - 1)) / 0.9 + NEXT_MIB / 2
    names = [f"s-{i:04d}" for i in range(services)]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "work"
        op = OperatorProcess(platform.kubeconfig, Path(tmp), {
            "KUBELOOP_REGISTRY": "mlflow", "MLFLOW_TRACKING_URI": uri, "KUBELOOP_PIPELINE_BACKENDS": "noop",
            "KUBELOOP_PIPELINE_BACKEND": "noop", "KUBELOOP_SERVING_BACKENDS": "local",
            "KUBELOOP_SERVING_BACKEND": "local", "KUBELOOP_WORK_DIR": str(work), "KUBELOOP_RESYNC_SECONDS": "60",
            "KUBELOOP_SERVING_POOLS": json.dumps({"shared": {"members": members, "memoryMiB": budget}})},
            [namespace]).start()
        try:
            op.wait_for_log("Initial authentication has finished", timeout=120)
            results = _measure(kube, namespace, model, names, calls, work, console)
        finally:
            for name in ["dedicated", *names]:
                kube.delete(API_VERSION, "InferenceService", name, namespace)
            wait_for(lambda: not kube.list(API_VERSION, "InferenceService", namespace), timeout=1200, interval=2,
                     what="the services deleted")
            op.stop()
            kube.delete("v1", "Namespace", namespace)
    results.update(services=services, members=members, budget_mib=round(budget, 1), calls=calls)
    _print(console, results)
    return {key: value.to_json() if isinstance(value, Figure) else value for key, value in results.items()}


def _isvc(namespace: str, name: str, model: str, pool: str | None) -> dict:
    return {"apiVersion": API_VERSION, "kind": "InferenceService", "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": {"name": model, "alias": "champion"}, **({"pool": pool} if pool else {})}}


def _ready(kube, namespace: str, names: list[str]) -> int:  # noqa: ANN001 - Kube
    return sum((i.get("status") or {}).get("phase") == "Ready" and i["metadata"]["name"] in names
               for i in kube.list(API_VERSION, "InferenceService", namespace))


def _measure(kube, namespace: str, model: str, names: list[str], calls: int, work: Path,  # noqa: ANN001 - Kube
             console: Console) -> dict:
    kube.create(_isvc(namespace, "dedicated", model, None))
    created = time.monotonic()
    with console.status(f"pooled services: creating {len(names)}") as status:
        for name in names:
            kube.create(_isvc(namespace, name, model, "shared"))
        wait_for(lambda: status.update(f"pooled services: {(n := _ready(kube, namespace, names))} of {len(names)} "
                                       "Ready") or n == len(names), timeout=3600, interval=5, what="every service Ready")
    create_to_ready = time.monotonic() - created
    wait_for(lambda: _ready(kube, namespace, ["dedicated"]) == 1, timeout=300, what="the dedicated service Ready")
    url = kube.get(API_VERSION, "InferenceService", names[0], namespace)["status"]["url"]
    dedicated_url = kube.get(API_VERSION, "InferenceService", "dedicated", namespace)["status"]["url"]
    session = requests.Session()
    _infer(session, dedicated_url, model)  # its model loaded: what a dedicated service uses serving
    dedicated = InstanceState.read(work / "serving" / f"{namespace}-dedicated" / "state.json")
    dedicated_mib = sum(private_mib(dedicated.record(p).pid) for p in ("tritonserver", "router"))
    pool = InstanceState.read(work / "serving" / "pools" / "shared" / "state.json")
    member_pids = {m: pool.record(m).pid for m in pool.processes if m.startswith("member-")}
    weights = 1.0 / np.arange(1, len(names) + 1) ** 1.1
    picks = np.random.default_rng(11).choice(len(names), size=calls, p=weights / weights.sum())
    firsts, seen = [], set()
    for i in picks:
        firsts.append(i not in seen)
        seen.add(i)
    with MemorySampler(member_pids) as memory, ThreadPoolExecutor(CALLERS) as callers:
        with console.status(f"pooled services: {calls} Zipf requests over {len(names)} services"):
            # A connection per request: one session shared by four threads is not safe.
            took = list(callers.map(lambda i: _infer(requests, url, f"{namespace}.{names[i]}"), picks))
    pool_mib = sum(memory.empty.values()) + sum(memory.peak.values()) + private_mib(pool.record("front").pid)
    counts = _pool_counts(session, url)
    first = np.array([t for t, f in zip(took, firsts, strict=True) if f]) * 1000
    hottest = f"{namespace}.{names[0]}"
    with console.status("pooled services: a loaded model's requests, through the pool and to a dedicated service"):
        ratios = _loaded_rounds(session, url, hottest, dedicated_url, model)
    return {"create_to_ready_s": round(create_to_ready, 1), "servers_ratio": (len(member_pids) + 1) / (2 * len(names)),
            "memory_ratio": round(pool_mib / (len(names) * dedicated_mib), 4), "dedicated_mib": round(dedicated_mib, 1),
            "pool_mib": round(pool_mib, 1), "peak_over_base_mib": {k: round(v, 1) for k, v in memory.peak.items()},
            "hit_rate": round(counts["hits"] / (counts["hits"] + counts["loads"]), 3), **counts,
            "first_request_p50_ms": round(float(np.percentile(first, 50)), 1),
            "first_request_p99_ms": round(float(np.percentile(first, 99)), 1),
            "loaded_p50": Figure("loaded model p50, pool / dedicated service", ratios["p50"], "x"),
            "loaded_p99": Figure("loaded model p99, pool / dedicated service", ratios["p99"], "x")}


def _infer(session, url: str, model: str) -> float:  # noqa: ANN001 - a requests.Session, or requests itself
    started = time.perf_counter()
    answer = session.post(f"{url}/v2/models/{model}/infer", json=BODY, timeout=600)
    if answer.status_code != 200:
        raise RuntimeError(f"{model}: {answer.status_code} {answer.text}")
    return time.perf_counter() - started


def _pool_counts(session: requests.Session, url: str) -> dict[str, float]:
    text = session.get(f"{url}/metrics", timeout=30).text
    found = {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
             if s.name.startswith("kubeloop_pool_") and s.name.endswith("_total")}
    return {k: found.get(f"kubeloop_pool_{k}_total", 0.0) for k in ("loads", "unloads", "hits", "failed")}


def _loaded_rounds(session: requests.Session, url: str, pooled: str, dedicated: str, model: str) -> dict:
    """The hottest pooled service (loaded) and the dedicated one: 200
    requests one at a time to each, alternating, per round."""
    ratios: dict[str, list[float]] = {"p50": [], "p99": []}
    for _ in range(RUNS):
        through, direct = [], []
        for _ in range(200):
            through.append(_infer(session, url, pooled))
            direct.append(_infer(session, dedicated, model))
        for q, key in ((50, "p50"), (99, "p99")):
            ratios[key].append(float(np.percentile(through, q) / np.percentile(direct, q)))
    return ratios


def _print(console: Console, r: dict) -> None:
    console.print(f"pooled services: {r['services']} InferenceServices on {r['members']} members with "
                  f"{r['budget_mib']} MiB each (a quarter of the models together), {r['calls']} Zipf requests; "
                  f"create -> every one Ready {r['create_to_ready_s']} s")
    console.print(f"  processes {r['members'] + 1} against {2 * r['services']} (ratio {r['servers_ratio']:.4f}); memory "
                  f"{r['memory_ratio']:.3f}x of a dedicated service each ({r['dedicated_mib']} MiB: its tritonserver "
                  f"and front; the pool {r['pool_mib']} MiB)")
    console.print(f"  hit rate {r['hit_rate']}, {r['loads']:.0f} loads, {r['unloads']:.0f} unloads, {r['failed']:.0f} "
                  f"failed; a service's first request (cold) p50 {r['first_request_p50_ms']} ms, p99 "
                  f"{r['first_request_p99_ms']} ms; members' peak over their empty memory {r['peak_over_base_mib']} "
                  f"MiB (budget {r['budget_mib']})")
    console.print(figures_table("a loaded model's requests: pool / dedicated service",
                                [r["loaded_p50"], r["loaded_p99"]]))
