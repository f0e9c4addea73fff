"""Serving suite: the Triton config generated from the latency profile
(tuned dynamic batching and instances) against the same model without
batching, at concurrency 1 and 16, with batch-1 requests to a real
tritonserver; throughput ratio and p50/p99 over five rounds in which the
two configs alternate, each figure's median and spread."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import numpy as np
import requests
import torch
from rich.console import Console
from rich.table import Table

from kubeloop.api.optimization import OptimizedModelSpec
from kubeloop.api.signature import ModelSignature
from kubeloop.components.benchmark import measure_interleaved, measuring
from kubeloop.components.training import TrainSettings, train
from kubeloop.components.triton import plan_batching, write_repository
from kubeloop.components.variants import BuildContext, onnx
from kubeloop import processes
from kubeloop.serving.runtime import TritonRuntime
from tests.bench.repeat import RUNS, Figure, figures_table
from tests.support.models import N_FEATURES, synthetic

SLO_MS = 5.0


async def load_bodies(url: str, bodies: list[str], concurrency: int, seconds: float) -> list[float]:
    """Latencies of the bodies posted in turn by concurrency callers for seconds."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def worker(offset: int) -> None:
        i = offset
        async with aiohttp.ClientSession() as session:
            while time.perf_counter() < deadline:
                start = time.perf_counter()
                async with session.post(url, data=bodies[i % len(bodies)],
                                        headers={"Content-Type": "application/json"}) as response:
                    await response.read()
                    if response.status != 200:
                        raise RuntimeError(await response.text())
                latencies.append(time.perf_counter() - start)
                i += concurrency

    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    return latencies


@contextmanager
def triton_serving(root: Path) -> Iterator[tuple[str, np.ndarray, object, str]]:
    """A real tritonserver serving one small model twice: "tuned" (the
    config generated from its latency profile) and "plain" (no batching);
    yields its URL, rows to send, the batching plan and its gRPC host:port."""
    runtime = TritonRuntime.discover()
    x, y = synthetic(rows=8000)
    torch.set_num_threads(1)
    model = train(x, y, None, None, TrainSettings(epochs=2, batch_size=256)).model
    spec = OptimizedModelSpec.model_validate({"source": {"name": "bench", "version": "1"}})
    variant = onnx(BuildContext(model, x, y, spec, root))
    with measuring():
        profile = {b: (lat.p50.value, lat.p99.value) for b in (1, 8, 32)
                   for lat in [measure_interleaved({"onnx": variant.predict}, x, b)["onnx"]]}
    plan = plan_batching(profile, SLO_MS, "cpu", os.cpu_count() or 1)
    repository = root / "repository"
    signature = ModelSignature(feature_columns=[f"f{i}" for i in range(N_FEATURES)])
    write_repository(repository, "tuned", variant.onnx, signature, plan, "python")
    write_repository(repository, "plain", variant.onnx, signature, None, "python")
    ports = [processes.free_port() for _ in range(3)]
    argv = runtime.argv(repository, *ports)
    argv = [a for a in argv if a != "--model-control-mode=explicit"] + ["--model-control-mode=none"]
    server = processes.start("tritonserver", argv, root / "logs", env=runtime.env())
    base = f"http://127.0.0.1:{ports[0]}"
    try:
        wait_ready([f"{base}/v2/models/{m}/ready" for m in ("tuned", "plain")], server)
        yield base, x, plan, f"127.0.0.1:{ports[1]}"
    finally:
        processes.stop(server)


def wait_ready(urls: list[str], server: processes.ProcessRecord, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if all(requests.get(url, timeout=1).status_code == 200 for url in urls):
                return
        except requests.RequestException:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{server.name} not ready:\n{processes.log_tail(server.log)}")


def run(context, console: Console, quick: bool = False) -> dict:
    seconds = 0.6 if quick else 1.6  # per config and round
    with tempfile.TemporaryDirectory() as tmp, triton_serving(Path(tmp)) as (base, x, plan, _grpc):
        results = {"plan": plan.why, "preferred": list(plan.preferred_batch_sizes),
                   "queue_delay_us": plan.max_queue_delay_us, "instances": plan.instances}
        repeated: list[Figure] = []
        for concurrency in (1, 16):
            with console.status(f"serving: plain and tuned alternating at concurrency {concurrency}"):
                rounds = [_round({"plain": f"{base}/v2/models/plain/infer", "tuned": f"{base}/v2/models/tuned/infer"},
                                 x, concurrency, seconds, r) for r in range(RUNS)]
            for name in ("plain", "tuned"):
                figs = [Figure(f"{name} c{concurrency} {key}", [r[name][key] for r in rounds], unit)
                        for key, unit in (("requests_per_s", "/s"), ("p50_ms", "ms"), ("p99_ms", "ms"))]
                repeated += figs
                results[f"{name}_c{concurrency}"] = {f.name.split()[-1]: round(f.median, 2) for f in figs}
            repeated.append(Figure(f"tuned / plain c{concurrency}",
                                   [r["tuned"]["requests_per_s"] / r["plain"]["requests_per_s"] for r in rounds],
                                   "x"))
    table = Table(title=f"Triton: generated config vs no batching (batch-1 requests, medians of {RUNS} alternating "
                        f"rounds of {seconds} s)")
    for column in ("concurrency", "config", "requests/s", "p50 ms", "p99 ms", "throughput ratio"):
        table.add_column(column)
    for concurrency in (1, 16):
        plain, tuned = results[f"plain_c{concurrency}"], results[f"tuned_c{concurrency}"]
        ratio = next(f.median for f in repeated if f.name == f"tuned / plain c{concurrency}")
        results[f"ratio_c{concurrency}"] = round(ratio, 2)
        table.add_row(str(concurrency), "no batching, 1 instance", str(plain["requests_per_s"]), str(plain["p50_ms"]),
                      str(plain["p99_ms"]), "1.00x")
        table.add_row(str(concurrency), f"tuned: preferred {results['preferred']}, delay "
                      f"{results['queue_delay_us']} us, {results['instances']} instances", str(tuned["requests_per_s"]),
                      str(tuned["p50_ms"]), str(tuned["p99_ms"]), f"{ratio:.2f}x")
    console.print(table)
    console.print(figures_table("serving: each figure over the rounds", repeated))
    console.print(f"plan: {results['plan']}")
    results["repeated"] = {f.name: f.to_json() for f in repeated}
    return results


def _round(urls: dict[str, str], x: np.ndarray, concurrency: int, seconds: float, index: int) -> dict:
    """Each target under the same load, the order reversed every other round."""
    bodies = vector_bodies(x)
    return load_round({name: (url, bodies) for name, url in urls.items()}, concurrency, seconds, index)


def vector_bodies(x: np.ndarray) -> list[str]:
    """Batch-1 requests of raw feature vectors."""
    return [json.dumps({"inputs": [{"name": "features", "shape": [1, N_FEATURES], "datatype": "FP32",
                                    "data": row.tolist()}]}) for row in x[:512]]


def load_round(targets: dict[str, tuple[str, list[str]]], concurrency: int, seconds: float, index: int) -> dict:
    """Each target (URL, bodies) under the same load in turn, the order
    reversed every other round: requests per second, p50 and p99 ms."""
    out = {}
    names = list(targets) if index % 2 == 0 else list(reversed(targets))
    for name in names:
        url, bodies = targets[name]
        ms = np.array(asyncio.run(load_bodies(url, bodies, concurrency, seconds))) * 1000
        out[name] = {"requests_per_s": len(ms) / seconds, "p50_ms": float(np.percentile(ms, 50)),
                     "p99_ms": float(np.percentile(ms, 99))}
    return out


def round_medians(rounds: list[dict], name: str, digits: int = 2) -> dict:
    """One target's figures, each the median over the rounds."""
    return {key: round(float(np.median([r[name][key] for r in rounds])), digits)
            for key in ("requests_per_s", "p50_ms", "p99_ms")}
