"""MIG geometry: whether a set of GPU instances fits on one GPU.

A GPU has 8 memory slices (4 on an A30) and 7 compute slices (4). Each
profile occupies a run of memory slices that may only start at the slots
NVIDIA allows (`nvidia-smi mig -lgipp`), and the compute slices of all
instances must not exceed the GPU's. Counting slices alone is not enough:
a 4g and a 3g instance fit together, but two 3g instances and a 2g do not.
"""

from __future__ import annotations

import hashlib
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


# mig-parted's named configurations that do not follow the all-<profile> pattern.
BALANCED = {
    "NVIDIA-A100-SXM4-40GB": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1},
    "NVIDIA-A100-SXM4-80GB": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
    "NVIDIA-H100-80GB-HBM3": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
}


class LayoutError(ValueError):
    """The demanded instances do not fit on the node's GPUs."""


def pack(model: GpuModel, gpus: int, demand: dict[str, int], fill: bool = True) -> list[dict[str, int]]:
    """MIG devices per GPU that hold the demanded instances (largest first,
    each on the least used GPU that takes it, so the GPUs stay alike); with
    fill, the space left on each GPU is filled with the smallest profile, as a
    mig-parted layout would be."""
    wanted = sorted((model.profile(name) for name, n in demand.items() for _ in range(n)),
                    key=lambda p: (-p.memory_slices, -p.compute_slices))
    if any(p is None for p in wanted):
        raise LayoutError(f"{model.product} has no MIG profile among {sorted(demand)}")
    layouts: list[list[MigProfile]] = [[] for _ in range(gpus)]
    for profile in wanted:
        candidates = [layout for layout in layouts if fits_on_one_gpu(model, layout + [profile])]
        if candidates:
            min(candidates, key=lambda layout: sum(p.memory_slices for p in layout)).append(profile)
        else:
            raise LayoutError(f"{sum(demand.values())} MIG instances {demand} do not fit on {gpus} {model.product}")
    smallest = min(model.mig_profiles, key=lambda p: (p.memory_slices, p.compute_slices))
    for layout in layouts:
        while fill and fits_on_one_gpu(model, layout + [smallest]):
            layout.append(smallest)
    return [_count(layout) for layout in layouts]


def _count(layout: list[MigProfile]) -> dict[str, int]:
    out: dict[str, int] = {}
    for profile in layout:
        out[profile.name] = out.get(profile.name, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: kv[0]))


def standard_configs(model: GpuModel) -> dict[str, dict[str, int]]:
    """mig-parted's standard layouts for a product, one GPU each."""
    configs = {}
    if model.product in BALANCED:
        configs["all-balanced"] = dict(BALANCED[model.product])
    for profile in model.mig_profiles:
        configs[f"all-{profile.name}"] = {profile.name: profile.max_per_gpu}
    return configs


def layout_error(model: GpuModel, layout: dict[str, int]) -> str | None:
    """Why one GPU's MIG devices are not a layout NVIDIA allows (an unknown
    profile, more compute or memory slices than the GPU has, or instances
    whose allowed start slots collide), or None when they are."""
    unknown = sorted(name for name in layout if model.profile(name) is None)
    if unknown:
        return f"{model.product} has no MIG profile {', '.join(unknown)}"
    profiles = [model.profile(name) for name, count in layout.items() for _ in range(count)]
    compute = sum(p.compute_slices for p in profiles)
    if compute > model.compute_slices:
        return f"{_show(layout)} needs {compute} compute slices; {model.product} has {model.compute_slices}"
    if not fits_on_one_gpu(model, profiles):
        return f"{_show(layout)} cannot be placed on one {model.product}: their allowed start slots collide"
    return None


def _show(layout: dict[str, int]) -> str:
    return " + ".join(f"{count}x {name}" for name, count in sorted(layout.items()))


def choose_layout(model: GpuModel, gpus: int, demand: dict[str, int], current: str | None = None,
                  homogeneous: bool = False) -> tuple[str, list[dict[str, int]]]:
    """The node's current configuration if it holds the demand, else the
    first standard one that does, else a custom packing; every layout
    returned passes layout_error. homogeneous (a node under the MIG single
    strategy, whose GPUs are all sliced one way): only all-<profile>
    layouts, with the smallest profile that holds every demanded instance."""
    if homogeneous:
        return _homogeneous(model, gpus, demand)
    configs = standard_configs(model)
    order = ([current] if current in configs else []) + [n for n in configs if n != current]
    for name in order:
        layout = configs[name]
        if all(layout.get(profile, 0) * gpus >= count for profile, count in demand.items()):
            return name, _checked(model, [dict(layout)] * gpus)
    layouts = pack(model, gpus, demand)
    return config_name(model, layouts), _checked(model, layouts)


def _homogeneous(model: GpuModel, gpus: int, demand: dict[str, int]) -> tuple[str, list[dict[str, int]]]:
    wanted = [model.profile(name) for name in demand]
    if any(p is None for p in wanted):
        raise LayoutError(f"{model.product} has no MIG profile among {sorted(demand)}")
    need_mib = max(p.memory_mib for p in wanted)
    instances = sum(demand.values())
    for profile in sorted(model.mig_profiles, key=lambda p: (p.memory_mib, p.compute_slices)):
        if profile.memory_mib >= need_mib and profile.max_per_gpu * gpus >= instances:
            return f"all-{profile.name}", _checked(model, [{profile.name: profile.max_per_gpu}] * gpus)
    raise LayoutError(f"{instances} MIG instances {demand} need more than one profile or more GPUs: "
                      f"the single strategy slices all {gpus} GPU(s) of {model.product} one way")


def _checked(model: GpuModel, layouts: list[dict[str, int]]) -> list[dict[str, int]]:
    for layout in layouts:
        error = layout_error(model, layout)
        if error:
            raise LayoutError(f"kubeloop would advise an invalid layout ({error}); please report this")
    return layouts


def config_name(model: GpuModel, layouts: list[dict[str, int]]) -> str:
    """The mig-parted configuration name for per-GPU layouts: a standard one
    (all-balanced, all-1g.10gb, ...) when they match it, else a custom name."""
    first = layouts[0] if layouts else {}
    if all(layout == first for layout in layouts):
        if first == BALANCED.get(model.product):
            return "all-balanced"
        if len(first) == 1:
            (name, count), = first.items()
            if count == model.profile(name).max_per_gpu:
                return f"all-{name}"
    digest = hashlib.sha256(repr(layouts).encode()).hexdigest()[:8]
    return f"kubeloop-{digest}"


def mig_parted_config(name: str, layouts: list[dict[str, int]]) -> dict:
    """A mig-parted configuration (the ConfigMap's config.yaml) for the layouts."""
    entries: list[dict] = []
    for index, layout in enumerate(layouts):
        entries.append({"devices": [index], "mig-enabled": True, "mig-devices": dict(layout)})
    return {"version": "v1", "mig-configs": {name: entries}}
