"""The placement planner against the fleet file, as plain data."""

from __future__ import annotations

import pytest

from kubeloop.api.serving import ServingGPU
from kubeloop.dev.fleet import build_nodes, load_fleet
from kubeloop.gpu.placement import NodeInfo, plan

GiB = 1024


def fleet(requested: dict[str, dict[str, int]] | None = None) -> list[NodeInfo]:
    infos = []
    for node in build_nodes(load_fleet()):
        name = node["metadata"]["name"]
        allocatable = {k: int(v) for k, v in node["status"]["allocatable"].items() if k.startswith("nvidia.com/")}
        infos.append(NodeInfo(name, node["metadata"]["labels"], allocatable, (requested or {}).get(name, {})))
    return infos


def gpu(**fields) -> ServingGPU:
    return ServingGPU.model_validate(fields)


@pytest.mark.parametrize("request_, footprint, resource, selector, node", [
    ({"sharing": "mig"}, 8 * GiB, "nvidia.com/mig-1g.10gb",
     {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/mig.strategy": "mixed"}, "gpu-h100-mig-mixed"),
    ({"sharing": "mig"}, 15 * GiB, "nvidia.com/mig-2g.20gb",
     {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/mig.strategy": "mixed"}, "gpu-h100-mig-mixed"),
    ({"sharing": "mig"}, 4 * GiB, "nvidia.com/gpu",
     {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"}, "gpu-a100-mig-single"),
    ({"sharing": "mps"}, 4 * GiB, "nvidia.com/gpu",
     {"nvidia.com/gpu.product": "NVIDIA-L4-SHARED", "nvidia.com/gpu.sharing-strategy": "mps"}, "gpu-l4-mps"),
    ({"sharing": "exclusive"}, 30 * GiB, "nvidia.com/gpu",
     {"nvidia.com/gpu.product": "NVIDIA-L40S"}, "gpu-l40s"),
    ({"sharing": "auto"}, 30 * GiB, "nvidia.com/mig-3g.40gb",
     {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/mig.strategy": "mixed"}, "gpu-h100-mig-mixed"),
    # A 1/7 MIG slice is a smaller share of a GPU than a 1/4 MPS share.
    ({"sharing": "auto"}, 5 * GiB, "nvidia.com/mig-1g.10gb",
     {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/mig.strategy": "mixed"}, "gpu-h100-mig-mixed"),
])
def test_smallest_fitting_capacity_is_chosen(request_, footprint, resource, selector, node):
    decision = plan(gpu(**request_), footprint, fleet())
    assert decision.feasible, decision.reason
    assert decision.resources == {resource: 1}
    assert decision.node_selector == selector
    assert decision.nodes == (node,)
    assert decision.tolerations[0]["key"] == "nvidia.com/gpu"
    assert f"{footprint} MiB" in decision.reason


def test_mps_placement_sets_the_mps_limits():
    decision = plan(gpu(sharing="mps", mps={"activeThreadPercentage": 30}), 4 * GiB, fleet())
    assert decision.env == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
                            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={int(4 * GiB * 1.1)}M"}


def test_an_mps_memory_limit_is_the_pinned_limit_and_what_must_hold_the_model():
    limited = gpu(sharing="mps", mps={"activeThreadPercentage": 25, "memoryLimitMib": 5000})
    decision = plan(limited, 4 * GiB, fleet())
    assert decision.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=5000M"
    assert "(5000 MiB)" in decision.reason
    # A share capped below the footprint cannot hold it, though the GPU's quarter could.
    too_small = plan(limited, 5 * GiB, fleet())
    assert not too_small.feasible and "holds 5000 MiB" in too_small.reason
    assert plan(gpu(sharing="mps"), 5 * GiB, fleet()).feasible


def test_impossible_request_is_infeasible_with_a_reason():
    decision = plan(gpu(sharing="mig", mig={"profile": "1g.10gb"}), 80 * GiB, fleet())
    assert not decision.feasible
    assert "81920 MiB does not fit MIG profile 1g.10gb" in decision.reason
    assert "9984 MiB" in decision.reason


def test_a_named_product_and_profile_are_honoured():
    decision = plan(gpu(sharing="mig", product="NVIDIA-H100-80GB-HBM3", mig={"profile": "3g.40gb"}), GiB, fleet())
    assert decision.resources == {"nvidia.com/mig-3g.40gb": 1}
    missing = plan(gpu(sharing="mig", product="NVIDIA-A100-SXM4-80GB"), GiB, fleet())
    assert not missing.feasible and "no MIG slice on NVIDIA-A100-SXM4-80GB" in missing.reason


def test_full_nodes_are_avoided_while_others_have_room():
    full = {"gpu-h100-mig-mixed": {"nvidia.com/mig-1g.10gb": 16}}
    decision = plan(gpu(sharing="mig"), 8 * GiB, fleet(full))
    assert decision.resources == {"nvidia.com/mig-2g.20gb": 1}
    assert not decision.waiting_for_capacity


def test_unknown_footprint_is_assumed_and_said():
    decision = plan(gpu(sharing="mig"), None, fleet())
    assert "assumed" in decision.reason and decision.footprint_mib == 2048


def test_no_gpu_means_cpu():
    decision = plan(None, None, fleet())
    assert decision.mode == "cpu" and decision.resources == {}


def test_suggested_layouts_keep_a_config_that_holds_the_demand_and_replace_one_that_does_not():
    from kubeloop.gpu.placement import suggest_layouts

    nodes = fleet()
    small = (gpu(sharing="mig"), 8 * GiB, 3)
    # No H100 here is partitioned with 4g.40gb slices: re-partitioning must add them.
    large = (gpu(sharing="mig", product="NVIDIA-H100-80GB-HBM3", mig={"profile": "4g.40gb"}), GiB, 2)
    assert not plan(*large[:2], nodes).feasible
    keep = suggest_layouts([small], nodes)
    assert [(l.node, l.current, l.suggested) for l in keep] == [("gpu-h100-mig-mixed", "all-balanced", "all-balanced")]
    change = suggest_layouts([small, large], nodes)[0]
    assert change.suggested not in ("all-balanced", "-") and change.error is None
    assert sum(l.get("4g.40gb", 0) for l in change.layouts) >= 2
    assert sum(l.get("1g.10gb", 0) for l in change.layouts) >= 3
    # Nine 4g.40gb slices fit no valid layout of any node: no advice, and the plan says no more than that.
    assert suggest_layouts([(large[0], GiB, 9)], nodes) == []
    too_many = plan(large[0], GiB, nodes, replicas=9)
    assert too_many.relayout is None and "fits after" not in too_many.reason


def test_a_model_no_slice_holds_fits_after_a_valid_relayout_and_the_status_says_where():
    """Unit: 60 GB fits no current slice (the H100's largest is 3g.40gb under
    all-balanced) but a 7g.80gb slice would: the decision names the node,
    the layout (valid for the H100, keeping room for what its Pods hold) and
    what the drain moves."""
    from kubeloop.gpu.mig import layout_error
    from kubeloop.gpu.catalog import gpu_model

    nodes = fleet({"gpu-h100-mig-mixed": {"nvidia.com/mig-1g.10gb": 2}})
    decision = plan(gpu(sharing="mig"), 60 * GiB, nodes)
    assert not decision.feasible and decision.relayout is not None
    relayout = decision.relayout
    assert relayout.node == "gpu-h100-mig-mixed" and relayout.profile == "7g.80gb"
    assert relayout.moves == {"nvidia.com/mig-1g.10gb": 2}
    h100 = gpu_model("NVIDIA-H100-80GB-HBM3")
    assert all(layout_error(h100, layout) is None for layout in relayout.layouts)
    assert sum(layout.get("7g.80gb", 0) for layout in relayout.layouts) == 1
    assert sum(layout.get("1g.10gb", 0) for layout in relayout.layouts) >= 2
    assert (f"fits after relabelling node gpu-h100-mig-mixed to nvidia.com/mig.config={relayout.config}"
            in decision.reason and "2x nvidia.com/mig-1g.10gb" in decision.reason)


def test_a_single_strategy_node_is_advised_a_homogeneous_layout():
    """Unit: the A100 under the MIG single strategy (all 1g.5gb today) must
    hold a 15 GiB model: the advice slices all its GPUs as 3g.20gb, not the
    mixed all-balanced that strategy cannot advertise."""
    from kubeloop.gpu.placement import suggest_layouts

    nodes = fleet()
    single = [n for n in nodes if n.labels.get("nvidia.com/mig.strategy") == "single"]
    assert [n.name for n in single] == ["gpu-a100-mig-single"]
    request = (gpu(sharing="mig", product="NVIDIA-A100-SXM4-40GB"), 15 * GiB, 1)
    assert not plan(*request[:2], nodes).feasible
    [advice] = [layout for layout in suggest_layouts([request], nodes) if layout.node == "gpu-a100-mig-single"]
    assert advice.error is None and advice.suggested == "all-3g.20gb", advice
    assert all(layout == {"3g.20gb": 2} for layout in advice.layouts)
