"""Front suite: the serving front (kubeloop's router, logging every request
to the platform's object store) against the same Triton called directly, at
concurrency 1 and 16 with batch-1 requests, alternating over rounds with a
second front in the middle of a rollout (a 25% canary, a share of its
requests paired with the primary: the comparison's extra call, its counters
and log row); the suite's Triton serves one version, so the canary is that
version again and the paired calls join its calls rather than a second
version's;
NVIDIA's tritonclient as the load generator (HTTP JSON and binary, and gRPC; 1 and 4
rows, c1 and c16; tests.bench.tritonclient_load) against both;
the CPU each process spends per request at concurrency 16 (on a machine
whose cores the load generator, the front and Triton share, that decides
the throughput ratio); and the request log's own rates in the same run: rows
per second written to the object store against a folder, and the drift
job's time to read a window's rows back from each."""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import psutil
from rich.console import Console
from rich.table import Table

from kubeloop import processes
from kubeloop.monitoring.drift import load_requests
from kubeloop.requestlog import FolderStore, ObjectStore
from kubeloop.serving.routes import compare_percent
from tests.bench.repeat import RUNS, Figure, figures_table, repeat
from tests.bench import tritonclient_load
from tests.bench.serving_suite import _round, load_bodies, round_medians, triton_serving, vector_bodies, wait_ready
from tests.bench.tritonclient_load import Target
from tests.support.models import N_FEATURES

COLUMNS = [f"f{i}" for i in range(N_FEATURES)]
FLUSH_ROWS = 5000
"""Rows per flush: five seconds of a router answering 1,000 requests a second."""
CANARY = 25
ROLLOUT = {"routes": [{"role": "primary", "version": "1", "percent": 100 - CANARY},
                      {"role": "canary", "version": "1", "percent": CANARY}],
           "compare": {"percent": compare_percent(CANARY)}}
"""A rollout's step as the backends' routes say it: the canary at 25%, compared."""


def run(context, console: Console, quick: bool = False) -> dict:
    env = context.platform.env()
    seconds = 0.6 if quick else 1.6
    prefix = f"s3://requests/bench-{uuid.uuid4().hex[:8]}"
    repeated: list[Figure] = []
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp, triton_serving(Path(tmp)) as (base, x, _plan, triton_grpc):
        router, front, front_grpc = _start_router(Path(tmp), "router", base, f"{prefix}/front", env)
        rollout_router, rollout, _ = _start_router(Path(tmp), "rollout-router", base, f"{prefix}/rollout", env, ROLLOUT)
        try:
            urls = {"triton": f"{base}/v2/models/tuned/infer", "front": f"{front}/v2/models/tuned/infer",
                    "rollout": f"{rollout}/v2/models/tuned/infer"}
            for concurrency in (1, 16):
                with console.status(f"front: Triton and the fronts alternating at concurrency {concurrency}"):
                    rounds = [_round(urls, x, concurrency, seconds, r) for r in range(RUNS)]
                for name in urls:
                    results[f"{name}_c{concurrency}"] = round_medians(rounds, name)
                for name, baseline in (("front", "triton"), ("rollout", "front")):
                    repeated += [
                        Figure(f"{name} / {baseline} throughput c{concurrency}",
                               [r[name]["requests_per_s"] / r[baseline]["requests_per_s"] for r in rounds], "x"),
                        Figure(f"{name} / {baseline} p99 c{concurrency}",
                               [r[name]["p99_ms"] / r[baseline]["p99_ms"] for r in rounds], "x")]
            with console.status("front: tritonclient as the load generator, every encoding"):
                results["tritonclient"], figures = tritonclient_load.cells(
                    {"triton": Target(base, "tuned", triton_grpc), "front": Target(front, "tuned", front_grpc)}, x,
                    "probability", seconds)
            repeated += figures
            with console.status("front: CPU per request at concurrency 16"):
                repeated += _cpu_per_request({k: urls[k] for k in ("triton", "front")}, x, router, seconds)
        finally:
            processes.stop(rollout_router)
            processes.stop(router)
        results["log"] = _log_rates(Path(tmp), prefix, env, console, quick, repeated)
    _print(console, results, repeated, seconds)
    results["repeated"] = {f.name: f.to_json() for f in repeated}
    return results


def _cpu_per_request(urls: dict[str, str], x: np.ndarray, router, seconds: float) -> list[Figure]:  # noqa: ANN001
    """CPU microseconds per request of the load generator, the router and
    Triton (with its Python backend's stub processes), each target in turn
    over the rounds."""
    me = psutil.Process()
    triton = next(p for p in me.children() if p.name() == "tritonserver")
    who = {"load generator": [me], "router": [psutil.Process(router.pid)],
           "Triton": [triton, *triton.children(recursive=True)]}
    spent: dict[str, list[float]] = {}
    for index in range(RUNS):
        for target in (list(urls) if index % 2 == 0 else list(reversed(urls))):
            before = {name: _cpu(procs) for name, procs in who.items()}
            answered = len(asyncio.run(load_bodies(urls[target], vector_bodies(x), 16, seconds)))
            for name, procs in who.items():
                if target == "front" or name != "router":
                    used = (_cpu(procs) - before[name]) / answered * 1e6
                    spent.setdefault(f"CPU per request c16, {name} ({target} path)", []).append(used)
    return [Figure(name, values, "us") for name, values in spent.items()]


def _cpu(procs: list[psutil.Process]) -> float:
    return sum(t.user + t.system for t in (p.cpu_times() for p in procs))


def _start_router(root: Path, name: str, triton: str, request_log: str, env: dict[str, str],  # noqa: ANN202
                  routes: dict | None = None):
    """A router process, its URL and gRPC host:port; routes: the config's
    routes (and compare) in place of the primary alone."""
    config = root / f"{name}.json"
    config.write_text(json.dumps({
        "service": "bench/front", "model": "tuned", "triton_model": "tuned", "triton_url": triton,
        "routes": [{"role": "primary", "version": "1", "percent": 100}], "request_log": request_log,
        "sample_rate": 1.0, "task": "binary", "output": "probability", **(routes or {})}))
    port, grpc_port = processes.free_port(), processes.free_port()
    router = processes.start(name, [sys.executable, "-m", "kubeloop.front.router", "--config", str(config),
                                    "--port", str(port), "--grpc-port", str(grpc_port)], root / "logs",
                             env=_s3_env(env))
    url = f"http://127.0.0.1:{port}"
    wait_ready([f"{url}/v2/health/ready"], router)
    return router, url, f"127.0.0.1:{grpc_port}"


def _s3_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith("AWS_")}


def _records(rows: int) -> list[dict]:
    values = np.random.default_rng(0).normal(size=(rows, N_FEATURES)).round(4).tolist()
    now = time.time()
    return [{"ts": now, "key": f"k{i}", "role": "primary", "version": "1", "features": [row], "outputs": [0.5]}
            for i, row in enumerate(values)]


def _log_rates(root: Path, prefix: str, env: dict[str, str], console: Console, quick: bool,
               repeated: list[Figure]) -> dict:
    """Rows/s through each store's write (flush-sized batches), then the
    drift job's read of a whole window from each."""
    import os

    os.environ.update(_s3_env(env))  # boto3 reads the platform's endpoint and key from the environment
    written = _records(20_000 if quick else 100_000)
    batches = [written[i:i + FLUSH_ROWS] for i in range(0, len(written), FLUSH_ROWS)]
    stores = {"object store": lambda n: ObjectStore(f"{prefix}/write-{n}"),
              "folder": lambda n: FolderStore(root / f"write-{n}")}

    def write(index: int) -> dict:
        rates = {}
        for name in (list(stores) if index % 2 == 0 else list(reversed(stores))):
            store = stores[name](index)
            started = time.perf_counter()
            for batch in batches:
                store.write(batch, time.time())
            rates[f"{name} rows/s"] = len(written) / (time.perf_counter() - started)
        return rates

    with console.status("front: request-log writes, object store and folder alternating"):
        runs = repeat(write)
    for name in stores:
        repeated.append(Figure(f"log write, {name}", [r[f"{name} rows/s"] for r in runs], "/s"))
    window = 100_000 if quick else 1_000_000
    records = _records(window)
    locations = {"object store": f"{prefix}/window", "folder": str(root / "window")}
    for name, location in locations.items():
        store = ObjectStore(location) if name == "object store" else FolderStore(location)
        with console.status(f"front: writing a {window:,}-row window to the {name}"):
            for i in range(0, window, FLUSH_ROWS):
                store.write(records[i:i + FLUSH_ROWS], time.time())

    def read(location: str) -> float:
        started = time.perf_counter()
        loaded = load_requests(location, 0, COLUMNS)
        assert len(loaded) == window, (len(loaded), window)
        return time.perf_counter() - started

    with console.status(f"front: the drift job reading {window:,} logged rows, repeatedly"):
        for name, location in locations.items():
            repeated.append(Figure(f"read {window:,} rows, {name}", repeat(lambda _, loc=location: read(loc)), "s"))
    return {"rows_written": len(written), "flush_rows": FLUSH_ROWS, "window_rows": window}


def _print(console: Console, results: dict, repeated: list[Figure], seconds: float) -> None:
    table = Table(title=f"The serving front (router, request log to the object store) vs Triton direct, and "
                        f"the front during a rollout ({CANARY}% canary, {compare_percent(CANARY)}% of it paired) "
                        f"(batch-1 requests, medians of {RUNS} alternating rounds of {seconds} s)")
    for column in ("concurrency", "target", "requests/s", "p50 ms", "p99 ms"):
        table.add_column(column)
    for concurrency in (1, 16):
        for name in ("triton", "front", "rollout"):
            r = results[f"{name}_c{concurrency}"]
            table.add_row(str(concurrency), name, str(r["requests_per_s"]), str(r["p50_ms"]), str(r["p99_ms"]))
    console.print(table)
    client = Table(title=f"NVIDIA's tritonclient (HTTP and gRPC) as the load generator, Triton direct vs the front "
                         f"(medians of {RUNS} alternating rounds of {seconds} s; generator cores: this process's "
                         f"CPU use, near 1 it is the limit)")
    for column in ("encoding, rows, concurrency", "target", "requests/s", "p50 ms", "p99 ms", "generator cores"):
        client.add_column(column)
    for cell, by_target in results["tritonclient"].items():
        for name, r in by_target.items():
            client.add_row(cell, name, str(r["requests_per_s"]), str(r["p50_ms"]), str(r["p99_ms"]),
                           str(r["generator_cores"]))
    console.print(client)
    console.print(figures_table("front: each figure over the runs (goal: throughput >= 0.8x, p99 <= 1.5x)",
                                repeated))
