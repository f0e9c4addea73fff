"""Honest latency measurement: warm-up, device synchronisation, rotating
inputs, percentiles from many timed calls, and a bounded time per case."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from kubeloop.components.variants import Predict


@dataclass(frozen=True)
class Latency:
    batch_size: int
    p50_ms: float
    p99_ms: float
    throughput: float
    """Rows per second at the median latency."""
    calls: int


def measure(predict: Predict, pool: np.ndarray, batch_size: int, *, device: torch.device | None = None,
            warmup: int = 30, min_calls: int = 200, max_calls: int = 3000, seconds: float = 1.0) -> Latency:
    """Time predict on batch_size rows drawn in turn from pool (so no two
    consecutive calls see the same data)."""
    batches = [np.ascontiguousarray(pool[i:i + batch_size]) for i in range(0, len(pool) - batch_size + 1, batch_size)]
    if not batches:
        raise ValueError(f"the pool has fewer than {batch_size} rows")
    sync = torch.cuda.synchronize if device is not None and device.type == "cuda" else (lambda: None)
    for i in range(warmup):
        predict(batches[i % len(batches)])
    sync()
    times = []
    deadline = time.perf_counter() + seconds
    while len(times) < max_calls and (len(times) < min_calls or time.perf_counter() < deadline):
        x = batches[len(times) % len(batches)]
        start = time.perf_counter_ns()
        predict(x)
        sync()
        times.append(time.perf_counter_ns() - start)
    ms = np.array(times) / 1e6
    p50 = float(np.percentile(ms, 50))
    return Latency(batch_size, p50, float(np.percentile(ms, 99)), batch_size / (p50 / 1000), len(times))


def peak_memory_mib(predict: Predict, x: np.ndarray, device: torch.device) -> float | None:
    """Peak device memory of one call on x (GPU allocator); None on CPU,
    where no allocator reports it."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    predict(x)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**20
