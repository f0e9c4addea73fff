"""MIG geometry: whether a set of GPU instances fits on one GPU.

A GPU has 8 memory slices (4 on an A30) and 7 compute slices (4). Each
profile occupies a run of memory slices that may only start at the slots
NVIDIA allows (`nvidia-smi mig -lgipp`), and the compute slices of all
instances must not exceed the GPU's. Counting slices alone is not enough:
a 4g and a 3g instance fit together, but two 3g instances and a 2g do not.
"""

from __future__ import annotations

from typing import Sequence

from kubeloop.gpu.catalog import GpuModel, MigProfile


def place_on_one_gpu(model: GpuModel, profiles: Sequence[MigProfile]) -> list[int] | None:
    """Start slots for each profile (in the given order), or None if they do not fit."""
    if sum(p.compute_slices for p in profiles) > model.compute_slices:
        return None
    order = sorted(range(len(profiles)), key=lambda i: -profiles[i].memory_slices)
    starts: list[int | None] = [None] * len(profiles)
    used = [False] * model.memory_slices

    def search(k: int) -> bool:
        if k == len(order):
            return True
        profile = profiles[order[k]]
        for start in profile.starts:
            span = range(start, start + profile.memory_slices)
            if span.stop > model.memory_slices or any(used[s] for s in span):
                continue
            for s in span:
                used[s] = True
            starts[order[k]] = start
            if search(k + 1):
                return True
            for s in span:
                used[s] = False
        return False

    return [s for s in starts] if search(0) else None  # type: ignore[misc]


def fits_on_one_gpu(model: GpuModel, profiles: Sequence[MigProfile]) -> bool:
    return place_on_one_gpu(model, profiles) is not None
