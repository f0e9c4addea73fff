"""The fake fleet's MIG manager, its pure part (unit; the process itself runs
in every platform and is proven in tests/e2e/test_serving_placement.py)."""

from __future__ import annotations

import pytest

from kubeloop.dev.fleet import build_nodes, load_fleet
from kubeloop.dev.migmanager import APPLIED, RelayoutError, node_patches, relaid


def _spec(name: str):
    fleet = load_fleet()
    return fleet, next(n for n in fleet.nodes if n.name == name)


def test_a_relabelled_node_advertises_the_new_slices_and_drops_the_old():
    fleet, spec = _spec("gpu-h100-mig-mixed")
    live = next(n for n in build_nodes(fleet) if n["metadata"]["name"] == spec.name)
    wanted = relaid(spec, fleet, "all-7g.80gb")
    assert wanted["status"]["allocatable"]["nvidia.com/mig-7g.80gb"] == str(spec.gpu.count)
    metadata, status = node_patches(live, wanted, "all-7g.80gb")
    assert metadata["metadata"]["labels"]["nvidia.com/mig.config"] == "all-7g.80gb"
    assert metadata["metadata"]["annotations"] == {APPLIED: "all-7g.80gb"}
    allocatable = status["status"]["allocatable"]
    assert allocatable["nvidia.com/mig-1g.10gb"] is None and allocatable["nvidia.com/mig-3g.40gb"] is None
    assert allocatable["nvidia.com/mig-7g.80gb"] == str(spec.gpu.count)


@pytest.mark.parametrize("node, config, words", [
    ("gpu-h100-mig-mixed", "all-9g.99gb", "not a mig-parted layout"),
    ("gpu-a100-mig-single", "all-balanced", "single strategy"),
])
def test_a_layout_the_node_cannot_take_is_refused(node, config, words):
    fleet, spec = _spec(node)
    with pytest.raises(RelayoutError, match=words):
        relaid(spec, fleet, config)


def test_a_single_strategy_node_relaid_names_the_profile_in_its_product():
    fleet, spec = _spec("gpu-a100-mig-single")
    wanted = relaid(spec, fleet, "all-3g.20gb")
    assert wanted["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"
    assert wanted["status"]["allocatable"]["nvidia.com/gpu"] == str(spec.gpu.count * 2)
