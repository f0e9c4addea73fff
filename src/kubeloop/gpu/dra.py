"""GPU placement as Dynamic Resource Allocation (resource.k8s.io/v1) asks for
it (pure): where a cluster's GPUs are published as devices by NVIDIA's DRA
driver (`gpu.nvidia.com`: whole GPUs of type `gpu`, MIG partitions of type
`mig`, with their product, profile and memory), the planner's choice becomes
a device request with a CEL selector instead of an extended resource, and the
scheduler allocates a device that matches it.

The same decision drives both paths, so a model lands on the same kind of
slice either way: the MIG profile (or whole GPU) of the chosen product, with
at least the footprint's memory. MPS shares stay with the device plugin:
NVIDIA's DRA driver shares a GPU through MPS only among the Pods of one
claim, not between services as the device plugin's MPS replicas do.
"""

from __future__ import annotations

from collections import Counter

from kubeloop.gpu.catalog import GpuModel
from kubeloop.gpu.placement import Partitions, PlacementDecision

DRIVER = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
CLAIM = "gpu"
"""The name a serving Pod gives its claim, and its container refers to."""


def device_classes() -> list[dict]:
    """The DeviceClasses NVIDIA's DRA driver installs: whole GPUs and MIG devices."""
    return [{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
             "spec": {"selectors": [{"cel": {"expression": (
                 f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{kind}'")}}]}}
            for name, kind in ((GPU_CLASS, "gpu"), (MIG_CLASS, "mig"))]


def device_request(decision: PlacementDecision) -> dict | None:
    """The claim's device request for a MIG or whole-GPU decision (None for
    CPU and MPS): the product, and for MIG the profile and memory at least
    the footprint, as CEL over the driver's attributes and capacity."""
    if decision.mode not in ("mig", "exclusive") or not decision.feasible:
        return None
    attributes = f"device.attributes['{DRIVER}']"
    terms = [f"{attributes}.productName == '{decision.product}'"]
    if decision.mode == "mig":
        terms.append(f"{attributes}.profile == '{decision.profile}'")
    if decision.mode == "mig" and decision.footprint_mib:
        terms.append(f"device.capacity['{DRIVER}'].memory.compareTo(quantity('{decision.footprint_mib}Mi')) >= 0")
    count = next(iter(decision.resources.values()), 1)
    return {"name": CLAIM, "exactly": {
        "deviceClassName": MIG_CLASS if decision.mode == "mig" else GPU_CLASS,
        "allocationMode": "ExactCount", "count": count,
        "selectors": [{"cel": {"expression": " && ".join(terms)}}]}}


MAX_DEVICES_PER_SLICE = 64
"""resource.k8s.io/v1: a slice whose devices consume counters holds at most 64."""
MAX_COUNTER_SETS_PER_SLICE = 8


def partitionable_slices(node: str, model: GpuModel, gpus: int) -> list[dict]:
    """A node's GPUs as partitionable devices (DRAPartitionableDevices,
    beta and on in Kubernetes 1.36), the way NVIDIA's DRA driver offers MIG
    without a fixed layout (pure). Each GPU is a counter set: one counter
    per memory slice and one for its compute slices. Each device is a MIG
    profile at one of its allowed start slots (or the whole GPU), consuming
    the memory slices it covers and its compute slices, so the scheduler
    itself only allocates devices that NVIDIA's placement rules let share a
    GPU, and the GPU is partitioned when a claim is allocated, not
    beforehand by a relabel and drain."""
    counter_sets, devices = [], []
    for index in range(gpus):
        counter_set = f"gpu-{index}"
        whole_gpu = counter_set_counters(model)
        counter_sets.append({"name": counter_set, "counters": whole_gpu})
        whole = device_entry(f"gpu-{index}", "gpu", model, index, model.memory_mib)
        whole["consumesCounters"] = [{"counterSet": counter_set, "counters": whole_gpu}]
        devices.append(whole)
        for profile in model.mig_profiles:
            for start in profile.starts:
                device = device_entry(f"gpu-{index}-{profile.name.replace('.', '-')}-at-{start}", "mig", model, index,
                                    profile.memory_mib)
                device["attributes"]["profile"] = {"string": profile.name}
                device["attributes"]["placementStart"] = {"int": start}
                device["consumesCounters"] = [{"counterSet": counter_set, "counters": _counters(
                    range(start, start + profile.memory_slices), profile.compute_slices)}]
                devices.append(device)
    pieces = ([{"sharedCounters": counter_sets[k:k + MAX_COUNTER_SETS_PER_SLICE]}
               for k in range(0, len(counter_sets), MAX_COUNTER_SETS_PER_SLICE)]
              + [{"devices": devices[k:k + MAX_DEVICES_PER_SLICE]}
                 for k in range(0, len(devices), MAX_DEVICES_PER_SLICE)])
    return [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
             "metadata": {"name": f"{node}-{DRIVER}-partitionable-{k}"},
             "spec": {"driver": DRIVER, "nodeName": node,
                      "pool": {"name": f"{node}-partitionable", "generation": 1, "resourceSliceCount": len(pieces)},
                      **piece}}
            for k, piece in enumerate(pieces)]


def counter_set_counters(model: GpuModel) -> dict[str, dict]:
    """Everything one GPU's counter set holds (what the whole GPU consumes)."""
    return _counters(range(model.memory_slices), model.compute_slices)


def _counters(memory_slices: range, compute_slices: int) -> dict[str, dict]:
    return {**{f"memory-{s}": {"value": "1"} for s in memory_slices}, "compute": {"value": str(compute_slices)}}


def device_entry(name: str, kind: str, model: GpuModel, index: int, memory_mib: int) -> dict:
    """A device as NVIDIA's DRA driver describes it: type, product, architecture, CUDA capability, index, memory."""
    major, minor = model.compute_capability
    return {"name": name, "attributes": {"type": {"string": kind}, "productName": {"string": model.product},
                                         "architecture": {"string": model.family},
                                         "cudaComputeCapability": {"version": f"{major}.{minor}.0"},
                                         "index": {"int": index}},
            "capacity": {"memory": {"value": f"{memory_mib}Mi"}}}


def free_partitions(slices: list[dict], allocated: set[tuple[str, str]]) -> dict[str, Partitions]:
    """Node -> Partitions, from the driver's ResourceSlices and the devices
    claims hold now ((pool, device) pairs): each counter set's counters less
    what allocated devices consume, then for each profile how many of its
    devices fit what is left, taken by start slot (NVIDIA's start slots are
    aligned to the profile's size, so first fit packs them as tightly as
    any choice would). Nodes without counter sets are not partitionable."""
    nodes: dict[str, tuple[dict, list[tuple[str, dict]]]] = {}
    for piece in slices:
        spec = piece.get("spec", {})
        if spec.get("driver") != DRIVER or not spec.get("nodeName"):
            continue
        counters, devices = nodes.setdefault(spec["nodeName"], ({}, []))
        for counter_set in spec.get("sharedCounters", []):
            counters[counter_set["name"]] = Counter({k: int(v["value"]) for k, v in counter_set["counters"].items()})
        devices += [(spec["pool"]["name"], d) for d in spec.get("devices", []) if d.get("consumesCounters")]
    out = {}
    for node, (counters, devices) in nodes.items():
        if not counters or not devices:
            continue
        for pool, device in devices:
            if (pool, device["name"]) in allocated:
                _consume(counters, device)
        out[node] = Partitions(devices[0][1]["attributes"]["productName"]["string"], _fitting(counters, devices))
    return out


def _fitting(counters: dict[str, Counter], devices: list[tuple[str, dict]]) -> dict[str, int]:
    kinds: dict[str, list[dict]] = {}
    for _pool, device in devices:
        attributes = device["attributes"]
        kind = attributes["profile"]["string"] if attributes["type"]["string"] == "mig" else "gpu"
        kinds.setdefault(kind, []).append(device)
    free = {}
    for kind, candidates in kinds.items():
        left = {name: Counter(c) for name, c in counters.items()}
        free[kind] = 0
        for device in sorted(candidates, key=lambda d: d["attributes"].get("placementStart", {}).get("int", 0)):
            if _fits(left, device):
                _consume(left, device)
                free[kind] += 1
    return free


def _fits(counters: dict[str, Counter], device: dict) -> bool:
    return all(counters.get(use["counterSet"], Counter())[name] >= int(value["value"])
               for use in device["consumesCounters"] for name, value in use["counters"].items())


def _consume(counters: dict[str, Counter], device: dict) -> None:
    for use in device["consumesCounters"]:
        held = counters.setdefault(use["counterSet"], Counter())
        for name, value in use["counters"].items():
            held[name] -= int(value["value"])
