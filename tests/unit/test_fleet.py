"""The fake fleet is labelled the way NVIDIA's device plugin and GFD label nodes."""

from __future__ import annotations

import pytest

from kubeloop.dev.fleet import Fleet, build_nodes, load_fleet


@pytest.fixture(scope="module")
def nodes():
    return {n["metadata"]["name"]: n for n in build_nodes(load_fleet())}


def test_mixed_strategy_advertises_each_profile(nodes):
    node = nodes["gpu-h100-mig-mixed"]
    labels, capacity = node["metadata"]["labels"], node["status"]["capacity"]
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/mig.config"] == "all-balanced"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert capacity["nvidia.com/gpu"] == "0"
    assert capacity["nvidia.com/mig-1g.10gb"] == "16"     # 8 GPUs x 2
    assert capacity["nvidia.com/mig-3g.40gb"] == "8"
    assert labels["nvidia.com/mig-1g.10gb.memory"] == "9984"


def test_single_strategy_hides_the_profile_in_the_product_label(nodes):
    node = nodes["gpu-a100-mig-single"]
    labels, capacity = node["metadata"]["labels"], node["status"]["capacity"]
    assert labels["nvidia.com/mig.strategy"] == "single"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    assert capacity["nvidia.com/gpu"] == "56"
    assert not any(k.startswith("nvidia.com/mig-") for k in capacity)
    assert labels["nvidia.com/gpu.memory"] == "4864"


def test_mps_node_advertises_replicas(nodes):
    labels = nodes["gpu-l4-mps"]["metadata"]["labels"]
    assert labels["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-L4-SHARED"
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert nodes["gpu-l4-mps"]["status"]["capacity"]["nvidia.com/gpu"] == "16"


def test_gpu_nodes_are_tainted_and_cpu_nodes_are_not(nodes):
    assert nodes["gpu-l40s"]["spec"]["taints"][0]["key"] == "nvidia.com/gpu"
    assert "taints" not in nodes["cpu-1"]["spec"]
    assert all(n["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake" for n in nodes.values())


@pytest.mark.parametrize("gpu, message", [
    ({"product": "NVIDIA-L4", "count": 1, "mig": {"strategy": "mixed", "config": "x", "devices": {"1g.5gb": 1}}},
     "no MIG support"),
    ({"product": "NVIDIA-H100-80GB-HBM3", "count": 1,
      "mig": {"strategy": "mixed", "config": "x", "devices": {"3g.40gb": 2, "2g.20gb": 1}}}, "do not fit"),
    ({"product": "NVIDIA-A100-SXM4-40GB", "count": 1,
      "mig": {"strategy": "single", "config": "x", "devices": {"1g.5gb": 1, "2g.10gb": 1}}}, "exactly one"),
])
def test_impossible_fleets_are_rejected(gpu, message):
    with pytest.raises(ValueError, match=message):
        Fleet.model_validate({"driver": "1.2.3", "cuda": "1.0", "nodes": [{"name": "n", "gpu": gpu}]})
