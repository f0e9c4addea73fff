"""Where a training run's time went, and what to change (pure).

The trainer measures its loop (kubeloop.components.profiling); this module
turns the measurements into shares of the loop's wall time, a verdict and
one sentence of advice. No torch, no I/O: plain numbers in, plain data out.
"""

from __future__ import annotations

from dataclasses import dataclass

LOADER_BOUND = "loader-bound"
COPY_BOUND = "copy-bound"
HOST_BOUND = "host-bound"
DEVICE_BOUND = "device-bound"
VERDICTS = (LOADER_BOUND, COPY_BOUND, HOST_BOUND, DEVICE_BOUND)

# Why these numbers: a loop is worth fixing on its input side when a large
# part of it is spent not computing. Waiting on the loader for 30% of the loop
# means more workers or pinned memory would win back more than any model-side
# change could; the host-to-device copy is a smaller, cheaper-to-hide cost
# (pinned memory overlaps it with compute), so 20% of the loop already says it
# is not being hidden.
LOADER_BOUND_SHARE = 0.30
COPY_BOUND_SHARE = 0.20
# Why: a GPU that is busy less than 40% of the time while neither loader nor
# copy holds it back is starved by the host (Python, the optimiser's
# per-parameter work, kernel launches of ~5-10 us each).
LOW_UTILISATION_PERCENT = 40.0
# Why: where utilisation cannot be read (no GPU, no NVML), a step shorter than
# 2 ms is mostly that same fixed per-step cost, whatever the device; a larger
# batch spreads it over more samples.
SHORT_STEP_SECONDS = 0.002


@dataclass(frozen=True)
class LoopTimes:
    """A training loop's measurements, summed over the steps counted."""

    wall: float  # seconds of the loops, start of each epoch's first batch wait to its end
    loader: float  # waiting on the DataLoader's next batch
    copy: float  # host-to-device copies of the batches
    step: float  # forward, backward and optimiser step (synchronised on a GPU)
    steps: int
    samples: int


@dataclass(frozen=True)
class Verdict:
    name: str
    advice: str


def shares(times: LoopTimes) -> dict[str, float]:
    """Each part's share of the wall time; `other` is what none of them
    covers (bookkeeping between steps), so the four add up to 1."""
    if times.wall <= 0:
        return {"loader": 0.0, "copy": 0.0, "step": 0.0, "other": 0.0}
    parts = {k: min(1.0, max(0.0, getattr(times, k) / times.wall)) for k in ("loader", "copy", "step")}
    return {**parts, "other": max(0.0, 1.0 - sum(parts.values()))}


def diagnose(share: dict[str, float], step_seconds: float, device: str, utilisation: float | None,
             num_workers: int, pin_memory: bool) -> Verdict:
    """The loop's bottleneck and one sentence on what to change.
    step_seconds is the mean step; utilisation the GPU's busy percent (None
    where it was not measured)."""
    gpu = device.startswith("cuda")
    if share["loader"] >= LOADER_BOUND_SHARE and share["loader"] >= share["copy"]:
        return Verdict(LOADER_BOUND, _loader_advice(share["loader"], num_workers, pin_memory, gpu))
    if share["copy"] >= COPY_BOUND_SHARE:
        pin = "pin memory, " if not pin_memory else ""
        return Verdict(COPY_BOUND, f"copy-bound: {share['copy']:.0%} of the loop copies batches to the GPU; "
                                   f"{pin}use a larger batch or keep the dataset on the device.")
    starved = utilisation < LOW_UTILISATION_PERCENT if utilisation is not None else step_seconds < SHORT_STEP_SECONDS
    if starved:
        busy = f"the GPU is busy {utilisation:.0f}% of the time" if utilisation is not None else \
            f"steps take {step_seconds * 1000:.2f} ms"
        return Verdict(HOST_BOUND, f"host-bound: {busy}, mostly fixed per-step cost; use a larger batch.")
    where = "the GPU" if gpu else "the CPU"
    return Verdict(DEVICE_BOUND, f"device-bound: {where} spends the loop computing steps, as it should; "
                                 "a faster device, lower precision or a smaller model is what would speed it up.")


def _loader_advice(share: float, num_workers: int, pin_memory: bool, gpu: bool) -> str:
    pin = " and pin memory" if gpu and not pin_memory else ""
    return f"loader-bound: {share:.0%} of the loop waits on the DataLoader; raise workers (now {num_workers}){pin}."


def build_report(times: LoopTimes, device: str, utilisation: float | None, num_workers: int, pin_memory: bool,
                 gpu_memory: dict[str, float] | None = None, excluded_steps: int = 0) -> dict:
    """The report logged with the run (bottleneck.json): shares, rates, the
    GPU's figures where there is one, the verdict and its advice."""
    share = shares(times)
    step_seconds = times.step / times.steps if times.steps else 0.0
    verdict = diagnose(share, step_seconds, device, utilisation, num_workers, pin_memory)
    gpu = device.startswith("cuda")
    return {
        "verdict": verdict.name, "advice": verdict.advice, "device": device,
        "shares": share, "seconds": {"wall": times.wall, "loader": times.loader, "copy": times.copy,
                                     "step": times.step},
        "steps": times.steps, "excluded_steps": excluded_steps, "samples": times.samples,
        "samples_per_second": times.samples / times.wall if times.wall > 0 else 0.0,
        "mean_step_ms": step_seconds * 1000,
        # On the CPU .to(device) returns the same tensors: there is no copy to time.
        "host_to_device": "synchronised copy to the GPU" if gpu else "none: the model runs on the CPU",
        "gpu_utilisation_percent": utilisation if utilisation is not None else "not available",
        "gpu_memory_mib": gpu_memory or "not available",
    }


def metrics_of(report: dict) -> dict[str, float]:
    """The report's numbers as MLflow metrics (bottleneck.*)."""
    out = {f"bottleneck.{k}_share": v for k, v in report["shares"].items()}
    out["bottleneck.samples_per_second"] = report["samples_per_second"]
    out["bottleneck.mean_step_ms"] = report["mean_step_ms"]
    if isinstance(report["gpu_utilisation_percent"], float | int):
        out["bottleneck.gpu_utilisation_percent"] = float(report["gpu_utilisation_percent"])
    if isinstance(report["gpu_memory_mib"], dict):
        out.update({f"bottleneck.gpu_memory_{k}_mib": v for k, v in report["gpu_memory_mib"].items()})
    return out
