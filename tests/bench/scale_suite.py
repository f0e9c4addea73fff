"""Scale suite: one operator keeping N InferenceServices (kubernetes backend,
CPU, on the platform's fake fleet) converged. Reported: the operator's
share of a core in steady state (its process's CPU time over windows, once
every service has been reconciled), and how long a spec change takes to
reach the service's child (a patch of spec.resources.cpu, until the
predictor Deployment's container requests it), p50 and p99 over changes
made one at a time (KUBELOOP_BENCH_SCALE_SERVICES sets N; 5,000 by
default, 100 quick). Baseline, in the same run: the API server's own round
trip for the same kind of change (a patch of a Deployment, read back).
Beside them, what the API server was asked in steady state (its own
apiserver_request_total, by verb and resource, over the windows): the
load every client's change waits behind.
"""

from __future__ import annotations

import os
import re
import statistics
import tempfile
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
from rich.console import Console

from kubeloop.api.constants import API_VERSION
from kubeloop.dev.fleet import NodeSpec, build_node, load_fleet
from kubeloop.polling import wait_for
from tests.bench.fleet_suite import _model
from tests.bench.operator_suite import percentile
from tests.bench.repeat import Figure, figures_table
from tests.support.operator import OperatorProcess

WINDOWS = 5
CHANGES = 40
CHANGE_TIMEOUT = 60.0


REQUEST_SERIES = re.compile(r'^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$', re.M)


def api_requests(kube) -> Counter:  # noqa: ANN001
    """The API server's requests served so far, by "VERB resource[/subresource]"."""
    counts: Counter = Counter()
    for found in REQUEST_SERIES.finditer(kube.text("/metrics")):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', found["labels"]))
        resource = "/".join(filter(None, (labels.get("resource"), labels.get("subresource"))))
        counts[f"{labels.get('verb')} {resource}"] += float(found["value"])
    return counts


def _isvc(namespace: str, name: str, model: str) -> dict:
    return {"apiVersion": API_VERSION, "kind": "InferenceService", "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": {"name": model, "alias": "champion"}, "backend": "kubernetes",
                     "resources": {"cpu": "10m", "memory": "32Mi"}}}


def _requested_cpu(deployment: dict | None) -> str | None:
    if not deployment:
        return None
    container = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "triton")
    return container["resources"]["requests"].get("cpu")


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system + times.children_user + times.children_system


def measure(platform, count: int, workdir: Path, window: float, console: Console) -> dict:  # noqa: ANN001
    kube = platform.kube()
    namespace = f"scale-{uuid.uuid4().hex[:6]}"
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    model = _model(platform, namespace)
    # The fleet's CPU node takes 110 Pods, as a kubelet's default does: one
    # fake node of the bench's own takes every service's Pod.
    node = build_node(NodeSpec(name=f"{namespace}-cpu", cpu=count, memory=f"{count}Gi", pods=count + 10),
                      load_fleet(platform.fleet_file))
    kube.create(node)
    op = OperatorProcess(platform.kubeconfig, workdir / "operator", {
        "KUBELOOP_REGISTRY": "mlflow", "MLFLOW_TRACKING_URI": platform.env()["MLFLOW_TRACKING_URI"],
        "KUBELOOP_SERVING_BACKENDS": "kubernetes", "KUBELOOP_SERVING_BACKEND": "kubernetes",
        "KUBELOOP_PIPELINE_BACKENDS": "noop", "KUBELOOP_PIPELINE_BACKEND": "noop",
        "KUBELOOP_WORK_DIR": str(workdir / "work")}, [namespace]).start()
    names = [f"svc-{i:05d}" for i in range(count)]
    try:
        op.wait_for_log("Initial authentication has finished", timeout=60)
        started, created_asked = time.monotonic(), api_requests(kube)
        with ThreadPoolExecutor(8) as creating:
            list(creating.map(lambda n: kube.create(_isvc(namespace, n, model)), names))

        def reconciled() -> int:
            return sum(1 for o in kube.list(API_VERSION, "InferenceService", namespace)
                       if (o.get("status") or {}).get("observedGeneration") == o["metadata"].get("generation"))

        with console.status(f"scale: {count} InferenceServices being reconciled"):
            wait_for(lambda: reconciled() == count, timeout=max(600, count), interval=5,
                     what=f"all {count} InferenceServices reconciled", seen=lambda: f"{reconciled()} reconciled")
        converged = time.monotonic() - started

        def ready() -> int:
            return sum(1 for o in kube.list(API_VERSION, "InferenceService", namespace)
                       if (o.get("status") or {}).get("phase") == "Ready")

        with console.status(f"scale: {count} InferenceServices' Pods starting on the fake fleet"):
            try:  # steady state is Ready: the Deployments' Pods running
                wait_for(lambda: ready() == count, timeout=max(600, count / 4), interval=10,
                         what=f"all {count} InferenceServices Ready", seen=lambda: f"{ready()} Ready")
            except TimeoutError as exc:
                console.print(f"scale: measuring anyway: {exc}")
        all_ready = time.monotonic() - started
        creating = {k: v for k, v in (api_requests(kube) - created_asked).items() if k.startswith("PATCH")}
        console.print(f"scale: from creation to all Ready ({all_ready:.0f} s), PATCHes: "
                      + ", ".join(f"{k} {v:.0f}" for k, v in sorted(creating.items())))
        phases = Counter((o.get("status") or {}).get("phase") for o in kube.list(API_VERSION, "InferenceService", namespace))
        process = psutil.Process(op.pid)
        shares = []
        server = next(p for p in psutil.process_iter(["name", "cmdline"]) if p.info["name"] == "kube-apiserver"
                      and any(str(platform.dir) in arg for arg in p.info["cmdline"] or ()))
        asked, steady_from, server_from = api_requests(kube), time.monotonic(), _cpu_seconds(server)
        with console.status(f"scale: steady state, {WINDOWS} windows of {window:.0f} s"):
            for _ in range(WINDOWS):
                before, at = _cpu_seconds(process), time.monotonic()
                time.sleep(window)
                shares.append((_cpu_seconds(process) - before) / (time.monotonic() - at))
        steady_seconds = time.monotonic() - steady_from
        server_share = round((_cpu_seconds(server) - server_from) / steady_seconds, 3)
        asked = {k: round(v / steady_seconds, 2) for k, v in (api_requests(kube) - asked).most_common()
                 if v / steady_seconds >= 0.01}
        console.print(f"scale: the API server in steady state: {server_share} of a core, "
                      f"{sum(asked.values()):.1f} requests a second: "
                      + ", ".join(f"{k} {v}" for k, v in list(asked.items())[:12]))
        console.print(f"scale: steady state at {count} services, the operator's share of a core by window: "
                      f"{', '.join(f'{v:.3f}' for v in shares)}")
        with console.status(f"scale: {CHANGES} spec changes, one at a time"):
            changes, round_trips, missed = _changes(kube, namespace, names)
    finally:
        op.stop()
        kube.delete("v1", "Namespace", namespace)
        kube.delete("v1", "Node", node["metadata"]["name"])
    return {"services": count, "converged_seconds": round(converged, 1), "ready_seconds": round(all_ready, 1),
            "phases": dict(phases), "creation_patches": {k: round(v) for k, v in creating.items()},
            "core_share": Figure("operator's share of a core, steady state", shares, " core"),
            "change_p50_s": round(percentile(changes, 50), 3), "change_p99_s": round(percentile(changes, 99), 3),
            "changes_missed": missed, "api_requests_per_s": asked, "api_server_core_share": server_share,
            "api_round_trip_p50_s": round(percentile(round_trips, 50), 4),
            "change_p50_vs_api": round(percentile(changes, 50) / statistics.median(round_trips), 1)}


def _changes(kube, namespace: str, names: list[str]) -> tuple[list[float], list[float], int]:  # noqa: ANN001
    """Spec changes reflected in the child (seconds; one not reflected
    within CHANGE_TIMEOUT counts as that long, and as missed), and the API
    server's own patch-and-read of a Deployment, interleaved."""
    changes, round_trips, missed = [], [], 0
    step = max(1, len(names) // CHANGES)
    for i, name in enumerate(names[::step][:CHANGES]):
        cpu = f"{20 + i}m"
        child = f"{name}-predictor"
        at = time.monotonic()
        kube.merge_patch(API_VERSION, "InferenceService", name, {"spec": {"resources": {"cpu": cpu}}}, namespace)
        try:
            wait_for(lambda child=child, cpu=cpu: _requested_cpu(kube.get("apps/v1", "Deployment", child,
                                                                          namespace)) == cpu,
                     timeout=CHANGE_TIMEOUT, interval=0.02, what=f"{child} requesting {cpu}")
        except TimeoutError:
            missed += 1
        changes.append(time.monotonic() - at)
        at = time.monotonic()
        kube.merge_patch("apps/v1", "Deployment", child, {"metadata": {"annotations": {"kubeloop.dev/bench": cpu}}},
                   namespace)
        kube.get("apps/v1", "Deployment", child, namespace)
        round_trips.append(time.monotonic() - at)
    return changes, round_trips, missed


def run(context, console: Console, quick: bool = False) -> dict:  # noqa: ANN001
    count, window = (100, 30.0) if quick else (int(os.environ.get("KUBELOOP_BENCH_SCALE_SERVICES", "5000")), 100.0)
    with tempfile.TemporaryDirectory() as tmp:
        results = measure(context.platform, count, Path(tmp), window, console)
    share: Figure = results["core_share"]
    console.print(f"scale: {results['services']} InferenceServices reconciled in {results['converged_seconds']} s "
                  f"({', '.join(f'{n} {phase}' for phase, n in results['phases'].items())}); "
                  f"a spec change reached its Deployment in p50 {results['change_p50_s']} s, p99 "
                  f"{results['change_p99_s']} s, {results['changes_missed']} of {CHANGES} not within "
                  f"{CHANGE_TIMEOUT:.0f} s (the API server's own patch and read: p50 "
                  f"{results['api_round_trip_p50_s']} s; {results['change_p50_vs_api']}x)")
    console.print(figures_table("scale: the operator in steady state", [share]))
    return {**results, "core_share": share.to_json()}
