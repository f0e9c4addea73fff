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
run off the CPU: there it is wall time after synchronising. Calls shorter
than GROUP_MS are timed in groups, so that the interrupts every call pays for
on a busy core are shared out evenly instead of deciding a tail quantile.
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
from torch import nn

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
    group: int = 1
    """Calls per timed sample (see GROUP_MS)."""

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
               + f", calls timed in groups of at least {GROUP_MS} ms by the thread's CPU clock (wall clock on a GPU)")
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


GROUP_MS = 0.5
"""Each timed sample is a group of consecutive calls lasting at least this
long, and reads as their mean. On the shared machine this was measured on,
interrupts land on a busy core about 1,700 times a second and charge 8-20
microseconds each to the running thread: one call of 8 microseconds in a
hundred is hit, so the p99 of single calls that short sits on that cliff and
read 0.009 ms in one run and 0.03 ms in the next (winner's speedup 7.2x,
then 3.0x). A sample of half a millisecond or more holds a steady share of
interrupts. The cost: for calls shorter than this a tail quantile describes
groups of calls, not one call's own hiccups."""


def measure_interleaved(predicts: dict[str, Predict], pool: np.ndarray, batch_size: int, *,
                        device: torch.device | None = None, warmup: int = 30, rounds: int = 20,
                        min_samples: int = 400, max_samples: int = 3000,
                        seconds: float = 0.4) -> dict[str, Latency]:
    """Time each predict on batch_size rows drawn in turn from pool, round
    by round: every round gives each variant one block of samples (each a
    group of calls, see GROUP_MS), starting with a different variant each
    round. Group and block sizes are set from the warm-up so each variant
    gets about `seconds` in all (within min_samples..max_samples samples)."""
    batches = [np.ascontiguousarray(pool[i:i + batch_size]) for i in range(0, len(pool) - batch_size + 1, batch_size)]
    if not batches:
        raise ValueError(f"the pool has fewer than {batch_size} rows")
    gpu = device is not None and device.type == "cuda"
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    clock = time.perf_counter_ns if gpu else time.thread_time_ns
    names = list(predicts)
    plans = {name: _plan(predicts[name], batches, warmup, sync, clock, rounds, seconds, min_samples, max_samples)
             for name in names}
    overhead = _clock_cost(clock)
    samples: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            group, block = plans[name]
            samples[name].append(_timed(predicts[name], batches, block, group, r, sync, clock)
                                 - overhead / group)
    out = {}
    for name in names:
        ms = np.maximum(np.stack(samples[name]), 0) / 1e6
        group = plans[name][0]
        out[name] = Latency(batch_size, quantile_interval(ms, 0.5), quantile_interval(ms, 0.99),
                            ms.size * group, rounds, group)
    return out


def _plan(predict: Predict, batches: list[np.ndarray], warmup: int, sync, clock, rounds: int,  # noqa: ANN001
          seconds: float, min_samples: int, max_samples: int) -> tuple[int, int]:
    """(calls per sample, samples per round) from warm-up calls, which also
    compile and fill caches. The group is sized on the wall clock, so a call
    that waits off the CPU is not repeated for its idle time."""
    per_call = float(np.median(_timed(predict, batches, warmup, 1, 0, sync, clock)))
    wall = float(np.median(_timed(predict, batches, warmup, 1, 0, sync, time.perf_counter_ns)))
    group = max(1, math.ceil(GROUP_MS * 1e6 / max(wall, 1.0)))
    per_round = seconds * 1e9 / rounds / (group * max(per_call, 1.0))
    return group, int(min(max(per_round, math.ceil(min_samples / rounds)), max(1, max_samples // rounds)))


def _clock_cost(clock) -> float:  # noqa: ANN001
    """What reading the clock adds to a timed sample (the thread CPU clock is
    a system call, about a microsecond), taken off every sample."""
    pairs = np.empty(200, dtype=np.int64)
    for i in range(len(pairs)):
        start = clock()
        pairs[i] = clock() - start
    return float(np.median(pairs))


def _timed(predict: Predict, batches: list[np.ndarray], samples: int, group: int, offset: int,
           sync, clock) -> np.ndarray:  # noqa: ANN001
    """Nanoseconds per call of `samples` groups of `group` calls."""
    times = np.empty(samples, dtype=np.float64)
    first = offset * samples * group
    for i in range(samples):
        start = clock()
        for j in range(group):
            predict(batches[(first + i * group + j) % len(batches)])
            sync()
        times[i] = (clock() - start) / group
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


CONTEXT_MIB = 704
"""CUDA context, cuBLAS workspaces and loaded kernels: what a GPU process
costs before the model's first byte. The GPU benchmark (tests/bench/gpu_suite.py)
measured 682 MiB on an H200 (driver 580, torch 2.11 with CUDA 13), where the
512 assumed before under-counted a served MLP's whole process by 28%; this
keeps a little headroom over that figure."""


def estimated_footprint_mib(model: nn.Module, n_features: int, batch: int) -> int:
    """GPU memory a served model needs, without a GPU to ask: twice the
    weights, the widest layer's fp32 activations at batch rows (twice), and
    CONTEXT_MIB."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    widest = max([n_features] + [m.out_features for m in model.modules() if isinstance(m, nn.Linear)])
    activations = batch * widest * 4 * 2
    return int(math.ceil((2 * params + activations) / 2**20)) + CONTEXT_MIB


def footprint_mib(predict: Predict, model: nn.Module, x: np.ndarray, batch: int,
                  device: torch.device) -> tuple[int, str]:
    """The footprint placement plans with: on a GPU the allocator's peak for
    one call on batch rows of x, plus CONTEXT_MIB ("measured"); on a CPU
    estimated_footprint_mib ("estimate")."""
    measured = peak_memory_mib(predict, x[:batch], device)
    if measured is not None:
        return int(math.ceil(measured)) + CONTEXT_MIB, "measured"
    return estimated_footprint_mib(model, x.shape[1], batch), "estimate"
