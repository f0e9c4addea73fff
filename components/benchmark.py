"""Latency measurement that repeats: variants timed round-robin over many
rounds (never one after another), after a warm-up, on one pinned CPU with a
fixed thread count, each figure reported with its confidence interval.

Timing variants one after another lets whatever else runs on a shared
machine decide which one looks fastest; interleaving makes every variant
see the same moments of noise, and the interval says how much of a
difference the data supports (see components.intervals).

On a CPU a call is timed by the calling thread's CPU clock. Every runtime
computes on that one thread (THREADS), so the clock counts the call's whole
cost (cache misses and frequency included) but not the milliseconds the
scheduler gives other processes in between, which on a shared machine
decided the wall-clock p99 of a 50-microsecond call. On a GPU the kernels
run off the CPU: there it is wall time after synchronising.
"""

from __future__ import annotations

import gc
import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from kubeloop.components.intervals import Estimate, quantile_interval
from kubeloop.components.variants import THREADS, Predict


@dataclass(frozen=True)
class Latency:
    batch_size: int
    p50: Estimate
    p99: Estimate
    """Milliseconds per call, with their intervals."""
    calls: int
    rounds: int

    @property
    def throughput(self) -> float:
        """Rows per second at the median latency."""
        return self.batch_size / (self.p50.value / 1000)


@contextmanager
def measuring() -> Iterator[str]:
    """Pin this process to one CPU (where the machine allows), fix torch's
    threads and hold the garbage collector; all restored afterwards. Yields
    what it did, for the report."""
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    allowed = _affinity()
    pinned = None
    if allowed and len(allowed) > 1:
        # The last CPU: interrupts and most system work favour CPU 0.
        try:
            os.sched_setaffinity(0, {max(allowed)})
            pinned = max(allowed)
        except OSError:
            pass
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield (f"{THREADS} thread(s) per runtime, " + (f"pinned to CPU {pinned}" if pinned is not None
                                                         else "not pinned (affinity not settable here)")
               + ", each call timed by the thread's CPU clock (wall clock on a GPU)")
    finally:
        if collecting:
            gc.enable()
        if pinned is not None:
            os.sched_setaffinity(0, allowed)
        torch.set_num_threads(threads)


def _affinity() -> set[int] | None:
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return None


def measure_interleaved(predicts: dict[str, Predict], pool: np.ndarray, batch_size: int, *,
                        device: torch.device | None = None, warmup: int = 30, rounds: int = 20,
                        min_calls: int = 400, max_calls: int = 3000, seconds: float = 0.4) -> dict[str, Latency]:
    """Time each predict on batch_size rows drawn in turn from pool, round
    by round: every round gives each variant one block of calls, starting
    with a different variant each round. A block's length is set from the
    warm-up so each variant gets about `seconds` in all (within
    min_calls..max_calls calls)."""
    batches = [np.ascontiguousarray(pool[i:i + batch_size]) for i in range(0, len(pool) - batch_size + 1, batch_size)]
    if not batches:
        raise ValueError(f"the pool has fewer than {batch_size} rows")
    gpu = device is not None and device.type == "cuda"
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    clock = time.perf_counter_ns if gpu else time.thread_time_ns
    names = list(predicts)
    blocks = {}
    for name in names:
        per_call = np.median(_timed(predicts[name], batches, warmup, 0, sync, clock))  # also compiles, fills caches
        per_round = seconds * 1e9 / rounds / max(per_call, 1.0)
        blocks[name] = int(min(max(per_round, math.ceil(min_calls / rounds)), max(1, max_calls // rounds)))
    overhead = _clock_cost(clock)
    samples: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(_timed(predicts[name], batches, blocks[name], r, sync, clock))
    out = {}
    for name in names:
        ms = np.maximum(np.stack(samples[name]) - overhead, 0) / 1e6
        out[name] = Latency(batch_size, quantile_interval(ms, 0.5), quantile_interval(ms, 0.99), ms.size, rounds)
    return out


def _clock_cost(clock) -> float:  # noqa: ANN001
    """What reading the clock adds to a timed call (the thread CPU clock is
    a system call, about a microsecond), taken off every sample."""
    pairs = np.empty(200, dtype=np.int64)
    for i in range(len(pairs)):
        start = clock()
        pairs[i] = clock() - start
    return float(np.median(pairs))


def _timed(predict: Predict, batches: list[np.ndarray], calls: int, offset: int, sync, clock) -> np.ndarray:  # noqa: ANN001
    times = np.empty(calls, dtype=np.int64)
    for i in range(calls):
        x = batches[(offset * calls + i) % len(batches)]
        start = clock()
        predict(x)
        sync()
        times[i] = clock() - start
    return times


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
