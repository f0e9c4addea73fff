"""GPU placement as DRA asks for it, and the fleet as NVIDIA's DRA driver
publishes it (unit: plain data; the real scheduler allocating the claims is
proven in tests/e2e/test_serving_placement.py)."""

from __future__ import annotations

import re

from kubeloop.api.serving import ServingGPU
from kubeloop.dev.fleet import build_resource_slices, load_fleet
from kubeloop.gpu.dra import MIG_CLASS, device_request
from kubeloop.gpu.placement import CPU, NodeInfo, plan
from kubeloop.serving.builders.workloads import ServingImages, build_children
from tests.unit.test_builders_serving import REF, V1, spec
from tests.unit.test_placement import GiB, fleet, gpu


def test_a_mig_decision_becomes_a_request_for_that_profile_of_that_product_with_the_memory():
    decision = plan(ServingGPU(sharing="mig"), 8 * GiB, fleet())
    request = device_request(decision)
    assert request["exactly"]["deviceClassName"] == MIG_CLASS and request["exactly"]["count"] == 1
    cel = request["exactly"]["selectors"][0]["cel"]["expression"]
    assert "productName == 'NVIDIA-H100-80GB-HBM3'" in cel and "profile == '1g.10gb'" in cel
    assert "compareTo(quantity('8192Mi')) >= 0" in cel


def test_whole_gpus_are_counted_and_mps_and_cpu_stay_with_the_device_plugin():
    whole = device_request(plan(ServingGPU(sharing="exclusive", count=2), 30 * GiB, fleet()))
    assert whole["exactly"]["deviceClassName"] == "gpu.nvidia.com" and whole["exactly"]["count"] == 2
    assert device_request(plan(ServingGPU(sharing="mps"), 4 * GiB, fleet())) is None
    assert device_request(CPU) is None


def test_with_dra_the_pod_claims_its_slice_from_a_template_instead_of_an_extended_resource():
    decision = plan(ServingGPU(sharing="mig"), 8 * GiB, fleet())
    children = build_children(REF, spec(), {"primary": (V1, 100)}, decision, ServingImages(gpu_allocation="dra"))
    template = next(c for c in children if c["kind"] == "ResourceClaimTemplate")
    assert template["spec"]["spec"]["devices"]["requests"] == [device_request(decision)]
    pod = next(c for c in children if c["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert pod["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": template["metadata"]["name"]}]
    triton = pod["containers"][0]
    assert triton["resources"]["claims"] == [{"name": "gpu"}]
    assert not any(k.startswith("nvidia.com/") for k in triton["resources"]["limits"])
    plugin = build_children(REF, spec(), {"primary": (V1, 100)}, decision, ServingImages())
    assert not [c for c in plugin if c["kind"] == "ResourceClaimTemplate"]
    assert plugin[0]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"] == "1"


def test_the_fleet_publishes_its_mig_devices_and_whole_gpus_but_not_mps_shares():
    slices = {s["spec"]["nodeName"]: s for s in build_resource_slices(load_fleet().nodes)}
    assert sorted(slices) == ["gpu-a100-mig-single", "gpu-h100-mig-mixed", "gpu-l40s"]
    h100 = slices["gpu-h100-mig-mixed"]["spec"]["devices"]
    assert len(h100) == 8 * 4  # all-balanced: 2x 1g.10gb, 2g.20gb, 3g.40gb per GPU
    assert all(re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", d["name"]) for d in h100)
    big = next(d for d in h100 if d["attributes"]["profile"]["string"] == "3g.40gb")
    assert big["attributes"]["type"] == {"string": "mig"} and big["capacity"]["memory"] == {"value": "40320Mi"}
    assert big["attributes"]["architecture"] == {"string": "hopper"}
    assert big["attributes"]["cudaComputeCapability"] == {"version": "9.0.0"}
    assert {d["attributes"]["type"]["string"] for d in slices["gpu-l40s"]["spec"]["devices"]} == {"gpu"}


def _consumed(device: dict) -> dict[str, int]:
    return {name: int(c["value"]) for name, c in device["consumesCounters"][0]["counters"].items()}


def _fits_together(model, devices: list[dict]) -> bool:  # noqa: ANN001 - GpuModel
    """What the scheduler computes: the counters the devices consume, summed, within the GPU's."""
    from kubeloop.gpu.dra import counter_set_counters

    available = {name: int(c["value"]) for name, c in counter_set_counters(model).items()}
    used: dict[str, int] = {}
    for device in devices:
        for name, n in _consumed(device).items():
            used[name] = used.get(name, 0) + n
    return all(n <= available[name] for name, n in used.items())


def test_partitionable_gpus_are_counter_sets_and_every_profile_placement_a_device():
    """Unit (pure): one H200 as NVIDIA's DRA driver offers MIG without a
    fixed layout: a slice with its counter set (8 memory slices, 7 compute),
    a slice with the whole GPU and every profile at every allowed start."""
    from kubeloop.gpu.catalog import gpu_model
    from kubeloop.gpu.dra import partitionable_slices

    h200 = gpu_model("NVIDIA-H200")
    slices = partitionable_slices("gpu-h200-0", h200, 1)
    assert [sorted(s["spec"]) for s in slices] == [["driver", "nodeName", "pool", "sharedCounters"],
                                                   ["devices", "driver", "nodeName", "pool"]]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {2}
    devices = {d["name"]: d for d in slices[1]["spec"]["devices"]}
    assert len(devices) == 1 + sum(len(p.starts) for p in h200.mig_profiles) == 19
    assert _consumed(devices["gpu-0-3g-71gb-at-4"]) == {"memory-4": 1, "memory-5": 1, "memory-6": 1, "memory-7": 1,
                                                         "compute": 3}
    assert _consumed(devices["gpu-0"]) == {**{f"memory-{s}": 1 for s in range(8)}, "compute": 7}
    assert devices["gpu-0-1g-18gb-at-6"]["attributes"]["profile"] == {"string": "1g.18gb"}


def test_what_the_counters_let_share_a_gpu_is_a_layout_nvidia_allows():
    """Unit (pure): for every pair of partitions of one GPU, the scheduler's
    counter arithmetic admits them together only if the catalogue's MIG
    rules accept that layout; and every standard mig-parted layout can be
    made of partitions the counters admit together."""
    from kubeloop.gpu.catalog import gpu_model
    from kubeloop.gpu.dra import partitionable_slices
    from kubeloop.gpu.mig import layout_error, standard_configs

    for product in ("NVIDIA-H200", "NVIDIA-A100-SXM4-40GB", "NVIDIA-A30"):
        model = gpu_model(product)
        migs = [d for d in partitionable_slices("n", model, 1)[1]["spec"]["devices"]
                if d["attributes"]["type"]["string"] == "mig"]
        for a in migs:
            for b in migs:
                if a is not b and _fits_together(model, [a, b]):
                    pa, pb = a["attributes"]["profile"]["string"], b["attributes"]["profile"]["string"]
                    layout = {pa: 2} if pa == pb else {pa: 1, pb: 1}
                    assert layout_error(model, layout) is None, (a["name"], b["name"])
        for name, layout in standard_configs(model).items():
            assert _admitted(model, migs, [p for p, n in layout.items() for _ in range(n)]), (product, name)


def _admitted(model, migs: list[dict], wanted: list[str], taken: tuple = ()) -> bool:  # noqa: ANN001
    if not wanted:
        return True
    for device in migs:
        if device["attributes"]["profile"]["string"] == wanted[0] and device not in taken \
                and _fits_together(model, [*taken, device]) and _admitted(model, migs, wanted[1:], (*taken, device)):
            return True
    return False


def test_many_gpus_spread_over_slices_within_the_apis_limits():
    from kubeloop.gpu.catalog import gpu_model
    from kubeloop.gpu.dra import MAX_COUNTER_SETS_PER_SLICE, MAX_DEVICES_PER_SLICE, partitionable_slices

    slices = partitionable_slices("big", gpu_model("NVIDIA-H100-80GB-HBM3"), 9)
    counters = [s for s in slices if "sharedCounters" in s["spec"]]
    devices = [d for s in slices for d in s["spec"].get("devices", [])]
    assert [len(s["spec"]["sharedCounters"]) for s in counters] == [MAX_COUNTER_SETS_PER_SLICE, 1]
    assert all(len(s["spec"].get("devices", [])) <= MAX_DEVICES_PER_SLICE for s in slices)
    assert len(devices) == 9 * 19 and len({d["name"] for d in devices}) == len(devices)
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}
    assert len({s["metadata"]["name"] for s in slices}) == len(slices)


def test_a_partitionable_fleet_gpu_is_published_through_dra_only():
    """Unit (pure): a fleet node whose GPUs are partitionable advertises no
    device-plugin capacity and is published as counter sets and placements;
    a fixed MIG layout or sharing cannot be partitionable too."""
    import pytest
    from pydantic import ValidationError

    from kubeloop.dev.fleet import GpuSpec, NodeSpec, build_node

    spec = NodeSpec(name="h200-0", gpu=GpuSpec(product="NVIDIA-H200", count=2, partitionable=True))
    node = build_node(spec, load_fleet())
    assert not any(k.startswith("nvidia.com/") for k in node["status"]["capacity"])
    assert node["metadata"]["labels"]["nvidia.com/gpu.deploy.device-plugin"] == "false"
    slices = build_resource_slices([spec])
    assert [len(s["spec"].get("sharedCounters", [])) for s in slices] == [2, 0]
    assert len(slices[1]["spec"]["devices"]) == 2 * 19
    with pytest.raises(ValidationError, match="partitionable"):
        GpuSpec(product="NVIDIA-L40S", count=1, partitionable=True)
    with pytest.raises(ValidationError, match="partitionable"):
        GpuSpec(product="NVIDIA-H200", count=1, partitionable=True,
                mig={"strategy": "single", "config": "all-1g.18gb", "devices": {"1g.18gb": 7}})


def _partitionable_h200(allocated: set[str] = frozenset(), gpus: int = 1) -> NodeInfo:
    """The fleet plus one partitionable H200 node, as the operator reads it
    with DRA: its slices, less the devices named as allocated."""
    from kubeloop.gpu.catalog import gpu_model
    from kubeloop.gpu.dra import free_partitions, partitionable_slices

    slices = partitionable_slices("gpu-h200-0", gpu_model("NVIDIA-H200"), gpus)
    pool = slices[0]["spec"]["pool"]["name"]
    [(node, partitions)] = free_partitions(slices, {(pool, d) for d in allocated}).items()
    return NodeInfo(node, {"nvidia.com/gpu.product": "NVIDIA-H200"}, {}, {}, partitions)


def test_free_partitions_are_what_the_counters_left_by_allocated_devices_still_admit():
    """Unit (pure): an empty H200 gives each profile its MIG maximum; with a
    4g.71gb allocated at slot 0, what is left is the other half (a 3g at 4,
    three 1g.18gb at 4-6 within the 3 compute slices left), and no whole GPU;
    a second GPU adds its own."""
    empty = _partitionable_h200().partitions
    assert empty.product == "NVIDIA-H200"
    assert empty.free == {"gpu": 1, "1g.18gb": 7, "1g.35gb": 4, "2g.35gb": 3, "3g.71gb": 2, "4g.71gb": 1,
                          "7g.141gb": 1}
    half = _partitionable_h200({"gpu-0-4g-71gb-at-0"}).partitions
    assert half.free == {"gpu": 0, "1g.18gb": 3, "1g.35gb": 2, "2g.35gb": 1, "3g.71gb": 1, "4g.71gb": 0,
                         "7g.141gb": 0}
    two = _partitionable_h200({"gpu-0-3g-71gb-at-4"}, gpus=2).partitions
    assert two.free["3g.71gb"] == 3 and two.free["7g.141gb"] == 1 and two.free["gpu"] == 1


def test_slices_without_counter_sets_are_not_partitionable():
    from kubeloop.gpu.dra import free_partitions

    assert free_partitions(build_resource_slices(load_fleet().nodes), set()) == {}


def test_the_planner_cuts_the_smallest_partition_that_holds_the_model_and_waits_when_none_is_left():
    """Unit (pure): 60 GiB on H200s holds in a 3g.71gb (the 4g and 7g hold
    it too, with more of the GPU); the decision is a MIG partition of that
    node, claimed through DRA by product and profile; once both 3g
    placements are taken it waits for capacity rather than calling it free.
    Without partitions (the device-plugin view) no H200 exists."""
    h200 = gpu(sharing="mig", product="NVIDIA-H200", memoryMib=60 * GiB)
    decision = plan(h200, None, [*fleet(), _partitionable_h200()])
    assert decision.feasible and not decision.waiting_for_capacity
    assert (decision.mode, decision.profile, decision.nodes) == ("mig", "3g.71gb", ("gpu-h200-0",))
    assert "partition of an NVIDIA-H200 (cut at allocation)" in decision.reason
    cel = device_request(decision)["exactly"]["selectors"][0]["cel"]["expression"]
    assert "profile == '3g.71gb'" in cel and "productName == 'NVIDIA-H200'" in cel
    full = plan(h200, None, [_partitionable_h200({"gpu-0-3g-71gb-at-0", "gpu-0-3g-71gb-at-4"})])
    assert full.feasible and full.waiting_for_capacity and full.profile == "3g.71gb"
    assert not plan(h200, None, fleet()).feasible
