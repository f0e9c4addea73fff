"""GPU placement as Dynamic Resource Allocation (resource.k8s.io/v1) asks for
it (pure): where a cluster's GPUs are published as devices by NVIDIA's DRA
driver (`gpu.nvidia.com`: whole GPUs of type `gpu`, MIG partitions of type
`mig`, with their product, profile and memory), the planner's choice becomes
a device request with a CEL selector instead of an extended resource, and the
scheduler allocates a device that matches it.

The same decision drives both paths, so a model lands on the same kind of
slice either way: the MIG profile (or whole GPU) of the chosen product, with
at least the footprint's memory. MPS shares stay with the device plugin.
"""

from __future__ import annotations

from kubeloop.gpu.placement import PlacementDecision

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
