"""Measuring the trainer's loop: the wait on the loader, the host-to-device
copies and the steps (perf_counter around the calls the loop makes anyway;
synchronised on a GPU, where the work is asynchronous), the GPU's
utilisation and memory, and a torch profiler trace of a few steps.
kubeloop.components.bottleneck turns the figures into a verdict."""

from __future__ import annotations

import gzip
import logging
import shutil
from contextlib import contextmanager
from pathlib import Path
from time import perf_counter
from typing import Iterator

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from kubeloop.components.bottleneck import LoopTimes, build_report

log = logging.getLogger(__name__)

TRACE = "trace.json.gz"
# Why: the trace is for a look at a few steps in a browser (chrome://tracing,
# Perfetto), not an archive; a model big enough to make 3 steps' trace larger
# than this gets the timings only.
MAX_TRACE_BYTES = 8 * 2**20
WAIT_STEPS, WARMUP_STEPS, ACTIVE_STEPS = 1, 1, 3
# Why: NVML reports the busy share over its own last sample period (1/6 s to
# 1 s), so reading it every step would cost a driver call for the same figure.
UTILISATION_EVERY = 25
_END = object()


class LoopMeter:
    """Times a training loop. On the first epoch it measures, a torch profiler
    records a few steps (when trace_dir is given); those steps, which pay the
    profiler's and the run's one-off costs (worker start, allocator growth),
    are left out of the figures when the run has other steps to count."""

    def __init__(self, device: torch.device, trace_dir: Path | None, total_steps: int):
        self.device, self.cuda = device, device.type == "cuda"
        self.trace_dir, self.trace_note = trace_dir, "not recorded"
        self.window = WAIT_STEPS + WARMUP_STEPS + ACTIVE_STEPS
        self.excluded = self.window if total_steps > self.window else 0
        self._nvml, self._profiler, self._seen = self.cuda, None, 0
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(device)
        self._reset()

    def _reset(self) -> None:
        self.wall = self.loader = self.copy = self.step = 0.0
        self.steps = self.samples = 0
        self.utilisation: list[float] = []
        self._epoch_started = perf_counter()

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    @contextmanager
    def epoch(self, data: Iterator) -> Iterator[Iterator]:
        """The epoch's batches, each wait on the loader timed; the first epoch
        is profiled. The profiler stops here even when a step raises."""
        self._epoch_started = perf_counter()
        if self._seen == 0 and self.trace_dir is not None:
            self._profiler = self._start_profiler(len(data))
        try:
            yield self._batches(data)
            self._sync()
            self.wall += perf_counter() - self._epoch_started
        finally:
            self._stop_profiler()

    def _batches(self, data: Iterator) -> Iterator:
        started = perf_counter()
        batches = iter(data)
        self.loader += perf_counter() - started
        while True:
            started = perf_counter()
            batch = next(batches, _END)
            self.loader += perf_counter() - started
            if batch is _END:
                return
            yield batch

    @contextmanager
    def timed(self, part: str) -> Iterator[None]:
        """Adds the block's time to part ("copy" or "step"); on a GPU after
        a synchronize, so asynchronous work is charged where it was queued."""
        started = perf_counter()
        yield
        self._sync()
        setattr(self, part, getattr(self, part) + perf_counter() - started)

    def count(self, samples: int) -> None:
        """Called after each step."""
        self.steps += 1
        self.samples += samples
        self._seen += 1
        if self._profiler is not None:
            self._profiler.step()
        if self._nvml and self.steps % UTILISATION_EVERY == 1:
            self._read_utilisation()
        if self._seen == self.excluded:
            self._stop_profiler()
            self._reset()

    def _read_utilisation(self) -> None:
        try:
            self.utilisation.append(float(torch.cuda.utilization(self.device)))
        except Exception as e:  # no pynvml/amdsmi, or NVML refused: the run goes on without the figure
            log.info("GPU utilisation not available: %s", e)
            self._nvml = False

    def _start_profiler(self, steps_in_epoch: int) -> profile:
        # An epoch too short for the whole schedule still records its last
        # steps (warming up on its first when it has two or more).
        wait, warmup = ((WAIT_STEPS, WARMUP_STEPS) if steps_in_epoch >= self.window
                        else (0, WARMUP_STEPS if steps_in_epoch > 1 else 0))
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        profiler = profile(activities=activities, schedule=schedule(wait=wait, warmup=warmup, active=ACTIVE_STEPS,
                                                                    repeat=1), on_trace_ready=self._export)
        profiler.start()
        return profiler

    def _stop_profiler(self) -> None:
        if self._profiler is not None:
            profiler, self._profiler = self._profiler, None
            profiler.stop()

    def _export(self, profiler: profile) -> None:
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        raw, path = self.trace_dir / "trace.json", self.trace_dir / TRACE
        profiler.export_chrome_trace(str(raw))
        with raw.open("rb") as src, gzip.open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
        size = path.stat().st_size
        if size > MAX_TRACE_BYTES:
            path.unlink()
            self.trace_note = f"omitted: {size} bytes gzipped, over {MAX_TRACE_BYTES}"
        else:
            self.trace_note = TRACE

    @property
    def trace(self) -> Path | None:
        return self.trace_dir / TRACE if self.trace_note == TRACE else None

    def report(self, num_workers: int, pin_memory: bool, **extra: object) -> dict | None:
        """The bottleneck report, or None when no step was measured (a run
        resumed after its last epoch)."""
        if self.steps == 0:
            return None
        utilisation = sum(self.utilisation) / len(self.utilisation) if self.utilisation else None
        times = LoopTimes(self.wall, self.loader, self.copy, self.step, self.steps, self.samples)
        report = build_report(times, str(self.device), utilisation, num_workers, pin_memory, self._memory(),
                              self.excluded)
        return {**report, "trace": self.trace_note, **extra}

    def _memory(self) -> dict[str, float] | None:
        if not self.cuda:
            return None
        return {"peak_allocated": torch.cuda.max_memory_allocated(self.device) / 2**20,
                "peak_reserved": torch.cuda.max_memory_reserved(self.device) / 2**20}
