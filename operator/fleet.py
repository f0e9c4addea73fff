"""Read the GPU fleet from the cluster for the placement planner."""

from __future__ import annotations

from collections import defaultdict

from kubeloop.gpu.placement import NodeInfo
from kubeloop.operator.kube import Kube

GPU_PREFIX = "nvidia.com/"


def _count(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        return 0


def observe_fleet(kube: Kube) -> list[NodeInfo]:
    """Nodes with their GPU labels, allocatable GPU resources, and what
    non-terminated Pods already request of them."""
    requested: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for pod in kube.list("v1", "Pod"):
        node = pod.get("spec", {}).get("nodeName")
        if not node or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for container in pod["spec"].get("containers", []):
            limits = container.get("resources", {}).get("limits", {})
            for name, value in limits.items():
                if name.startswith(GPU_PREFIX):
                    requested[node][name] += _count(str(value))
    nodes = []
    for node in kube.list("v1", "Node"):
        name = node["metadata"]["name"]
        allocatable = {k: _count(str(v)) for k, v in node.get("status", {}).get("allocatable", {}).items()
                       if k.startswith(GPU_PREFIX)}
        nodes.append(NodeInfo(name, node["metadata"].get("labels", {}), allocatable, dict(requested[name])))
    return nodes
