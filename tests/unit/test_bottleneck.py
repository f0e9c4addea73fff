"""The bottleneck verdict of a training loop, from plain measurements."""

from __future__ import annotations

import pytest

from kubeloop.components.bottleneck import (
    COPY_BOUND, COPY_BOUND_SHARE, DEVICE_BOUND, HOST_BOUND, LOADER_BOUND, LOADER_BOUND_SHARE,
    LOW_UTILISATION_PERCENT, SHORT_STEP_SECONDS, LoopTimes, build_report, diagnose, metrics_of, shares,
)

SLOW_STEP = SHORT_STEP_SECONDS * 10
EPS = 1e-9


def share(loader: float = 0.0, copy: float = 0.0) -> dict[str, float]:
    return {"loader": loader, "copy": copy, "step": 1.0 - loader - copy, "other": 0.0}


def verdict(loader: float = 0.0, copy: float = 0.0, step_seconds: float = SLOW_STEP, device: str = "cuda:0",
            utilisation: float | None = 90.0, workers: int = 2, pin: bool = True) -> str:
    return diagnose(share(loader, copy), step_seconds, device, utilisation, workers, pin).name


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"loader": LOADER_BOUND_SHARE}, LOADER_BOUND),
    ({"loader": LOADER_BOUND_SHARE - EPS}, DEVICE_BOUND),
    ({"copy": COPY_BOUND_SHARE}, COPY_BOUND),
    ({"copy": COPY_BOUND_SHARE - EPS}, DEVICE_BOUND),
    # Both over their thresholds: the larger share is the one to fix first.
    ({"loader": 0.35, "copy": 0.40}, COPY_BOUND),
    ({"loader": 0.40, "copy": 0.35}, LOADER_BOUND),
    ({"utilisation": LOW_UTILISATION_PERCENT - EPS}, HOST_BOUND),
    ({"utilisation": LOW_UTILISATION_PERCENT}, DEVICE_BOUND),
    # A measured utilisation outranks the step-length rule.
    ({"utilisation": 95.0, "step_seconds": SHORT_STEP_SECONDS / 10}, DEVICE_BOUND),
    ({"utilisation": None, "step_seconds": SHORT_STEP_SECONDS - EPS}, HOST_BOUND),
    ({"utilisation": None, "step_seconds": SHORT_STEP_SECONDS}, DEVICE_BOUND),
    ({"device": "cpu", "utilisation": None, "step_seconds": SHORT_STEP_SECONDS / 2}, HOST_BOUND),
    ({"device": "cpu", "utilisation": None}, DEVICE_BOUND),
])
def test_each_verdict_and_its_edges(kwargs, expected):
    assert verdict(**kwargs) == expected


def test_the_advice_is_one_sentence_that_names_the_verdict_and_what_to_change():
    loader = diagnose(share(loader=0.5), SLOW_STEP, "cuda:0", 90.0, 0, False).advice
    assert loader == "loader-bound: 50% of the loop waits on the DataLoader; raise workers (now 0) and pin memory."
    # Pinned memory is advice for a GPU only.
    assert "pin" not in diagnose(share(loader=0.5), SLOW_STEP, "cpu", None, 0, False).advice
    copy = diagnose(share(copy=0.3), SLOW_STEP, "cuda:0", 90.0, 4, True).advice
    assert copy.startswith("copy-bound: 30% ") and "pin" not in copy and "larger batch" in copy
    host = diagnose(share(), SLOW_STEP, "cuda:0", 12.0, 4, True).advice
    assert host == "host-bound: the GPU is busy 12% of the time, mostly fixed per-step cost; use a larger batch."
    for advice in (loader, copy, host, diagnose(share(), SLOW_STEP, "cpu", None, 0, False).advice):
        assert advice.count(".") == 1 and advice.endswith(".")


def test_shares_add_up_to_one_with_what_no_part_covers_as_other():
    parts = shares(LoopTimes(wall=10.0, loader=2.0, copy=1.0, step=6.0, steps=10, samples=640))
    assert parts == pytest.approx({"loader": 0.2, "copy": 0.1, "step": 0.6, "other": 0.1})
    assert shares(LoopTimes(0.0, 0.0, 0.0, 0.0, 0, 0)) == {"loader": 0.0, "copy": 0.0, "step": 0.0, "other": 0.0}


def test_the_report_carries_the_gpu_figures_only_where_measured():
    times = LoopTimes(wall=2.0, loader=1.0, copy=0.0, step=0.9, steps=100, samples=6400)
    cpu = build_report(times, "cpu", None, 0, False)
    assert cpu["verdict"] == LOADER_BOUND and cpu["samples_per_second"] == pytest.approx(3200.0)
    assert cpu["mean_step_ms"] == pytest.approx(9.0)
    assert cpu["host_to_device"].startswith("none") and cpu["gpu_memory_mib"] == "not available"
    assert set(metrics_of(cpu)) == {"bottleneck.loader_share", "bottleneck.copy_share", "bottleneck.step_share",
                                    "bottleneck.other_share", "bottleneck.samples_per_second",
                                    "bottleneck.mean_step_ms"}
    gpu = build_report(times, "cuda:0", 75.0, 4, True, {"peak_allocated": 120.5, "peak_reserved": 256.0})
    metrics = metrics_of(gpu)
    assert metrics["bottleneck.gpu_utilisation_percent"] == 75.0
    assert metrics["bottleneck.gpu_memory_peak_allocated_mib"] == 120.5
    assert metrics["bottleneck.gpu_memory_peak_reserved_mib"] == 256.0
