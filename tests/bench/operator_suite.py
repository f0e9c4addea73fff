"""Operator suite: apply N TrainingJobs (no-op pipeline backend) and measure
apply-to-first-status latency, throughput and the operator's memory.

Baseline, in the same run: the API server's own create round trip for the
same objects; the ratio says what the operator adds on top of the API. Each
size runs five times (a fresh namespace and operator each time); the table
shows medians, the figures' spreads follow.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from rich.console import Console
from rich.table import Table

from kubeloop.api.constants import API_VERSION
from kubeloop.kube import KubeError
from tests.bench.repeat import Figure, figures, figures_table, repeat
from tests.support.operator import OperatorProcess


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def _job(name: str, namespace: str) -> dict:
    return {"apiVersion": API_VERSION, "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"modelName": "bench", "backend": "noop", "features": {"featureViews": ["card_activity"], "labels": {"source": "transactions", "column": "is_fraud"}}}}


def measure(platform, count: int, workdir) -> dict:
    kube = platform.kube()
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    op = OperatorProcess(platform.kubeconfig, workdir, {
        "KUBELOOP_REGISTRY": "memory", "KUBELOOP_PIPELINE_BACKENDS": "noop", "KUBELOOP_PIPELINE_BACKEND": "noop",
        "KUBELOOP_RESYNC_SECONDS": "600", "KUBELOOP_WORK_DIR": str(workdir)}, [namespace]).start()
    op.wait_for_log("Initial authentication has finished", timeout=60)

    first_status: dict[str, float] = {}
    done = threading.Event()

    def seen(obj: dict) -> None:
        name = obj["metadata"]["name"]
        if name not in first_status and obj.get("status", {}).get("conditions"):
            first_status[name] = time.monotonic()
            if len(first_status) == count:
                done.set()

    def watcher():
        # The API server may end a watch early; catch up with a list and watch again.
        while not done.is_set():
            try:
                for _type, obj in kube.watch(API_VERSION, "TrainingJob", namespace, timeout=600):
                    seen(obj)
                    if done.is_set():
                        return
                for obj in kube.list(API_VERSION, "TrainingJob", namespace):
                    seen(obj)
            except KubeError:
                time.sleep(0.5)

    threading.Thread(target=watcher, daemon=True).start()
    peak_rss = [0.0]

    def sample_rss():
        while not done.is_set():
            peak_rss[0] = max(peak_rss[0], op.rss_mib())
            time.sleep(0.25)

    threading.Thread(target=sample_rss, daemon=True).start()
    time.sleep(0.5)  # let the watch start before the first create
    sent: dict[str, float] = {}
    create_latency: list[float] = []
    writer = platform.kube()

    def create(i: int):
        name = f"job-{i:05d}"
        sent[name] = time.monotonic()
        writer.create(_job(name, namespace))
        create_latency.append(time.monotonic() - sent[name])

    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, range(count)))
    applied = time.monotonic() - started
    if not done.wait(timeout=max(120, count * 0.5)):
        raise TimeoutError(f"only {len(first_status)}/{count} TrainingJobs got a status; operator log:\n"
                           f"{op.log()[-3000:]}")
    latencies = [first_status[n] - sent[n] for n in sent]
    total = max(first_status.values()) - started
    rss = max(peak_rss[0], op.rss_mib())
    op.stop()
    kube.delete("v1", "Namespace", namespace)
    return {
        "objects": count,
        "apply_seconds": round(applied, 2),
        "status_p50_ms": round(percentile(latencies, 50) * 1000, 1),
        "status_p99_ms": round(percentile(latencies, 99) * 1000, 1),
        "throughput_per_s": round(count / total, 1),
        "create_p50_ms": round(statistics.median(create_latency) * 1000, 1),
        "ratio_p50_vs_create": round(percentile(latencies, 50) / statistics.median(create_latency), 1),
        "operator_rss_mib": round(rss, 1),
    }


def _fresh(platform, count: int, workdir) -> dict:  # noqa: ANN001 - Platform, Path
    workdir.mkdir()
    return measure(platform, count, workdir)


FIGURES = ("apply_seconds", "status_p50_ms", "status_p99_ms", "throughput_per_s", "create_p50_ms",
           "ratio_p50_vs_create", "operator_rss_mib")


def run(context, console: Console, quick: bool = False) -> list[dict]:
    import tempfile
    from pathlib import Path

    sizes = [20, 100] if quick else [100, 1000]
    rows, spread = [], []
    for count in sizes:
        with console.status(f"operator: {count} TrainingJobs, repeated"):
            with tempfile.TemporaryDirectory() as tmp:
                runs = repeat(lambda i, n=count, t=tmp: _fresh(context.platform, n, Path(t) / str(i)))
        repeated: list[Figure] = figures(runs, {k: "" for k in FIGURES})
        rows.append({"objects": count, **{f.name: round(f.median, 2) for f in repeated},
                     "repeated": {f.name: f.to_json() for f in repeated}})
        spread += [Figure(f"{count} objects {f.name}", f.values, f.unit) for f in repeated]
    table = Table(title="Operator: TrainingJob apply -> first status (noop pipeline backend)")
    for column in ("objects", "apply s", "status p50 ms", "status p99 ms", "throughput /s",
                   "API create p50 ms", "p50 / create", "operator RSS MiB"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(str(r["objects"]), str(r["apply_seconds"]), str(r["status_p50_ms"]), str(r["status_p99_ms"]),
                      str(r["throughput_per_s"]), str(r["create_p50_ms"]), f"{r['ratio_p50_vs_create']}x",
                      str(r["operator_rss_mib"]))
    console.print(table)
    console.print(figures_table("operator: each figure over the runs", spread))
    return rows
