"""Read the GPU fleet from the cluster for the placement planner."""

from __future__ import annotations

from collections import defaultdict

from kubeloop.api.refs import ObjectRef
from kubeloop.gpu.dra import DRIVER, free_partitions
from kubeloop.gpu.placement import NodeInfo
from kubeloop.serving.builders.workloads import LABEL_SERVING
from kubeloop.kube import Kube

GPU_PREFIX = "nvidia.com/"


def _count(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        return 0


def observe_fleet(kube: Kube, dra: bool = False, excluding: ObjectRef | None = None) -> list[NodeInfo]:
    """Nodes with their GPU labels, allocatable GPU resources, and what
    non-terminated Pods already request of them; where GPUs are claimed
    through DRA, also what each node's partitionable GPUs can still give.
    What the Pods of `excluding` (the InferenceService being placed) hold
    counts as free: it is theirs to keep, not capacity to wait for."""
    requested: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    own: set[str] = set()
    for pod in kube.list("v1", "Pod"):
        node = pod.get("spec", {}).get("nodeName")
        if not node or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        if excluding and _belongs(pod, excluding):
            own.add(pod["metadata"]["name"])
            continue
        for container in pod["spec"].get("containers", []):
            limits = container.get("resources", {}).get("limits", {})
            for name, value in limits.items():
                if name.startswith(GPU_PREFIX):
                    requested[node][name] += _count(str(value))
    partitions = _partitions(kube, excluding.namespace if excluding else None, own) if dra else {}
    nodes = []
    for node in kube.list("v1", "Node"):
        name = node["metadata"]["name"]
        allocatable = {k: _count(str(v)) for k, v in node.get("status", {}).get("allocatable", {}).items()
                       if k.startswith(GPU_PREFIX)}
        nodes.append(NodeInfo(name, node["metadata"].get("labels", {}), allocatable, dict(requested[name]),
                              partitions.get(name)))
    return nodes


def _belongs(pod: dict, ref: ObjectRef) -> bool:
    metadata = pod["metadata"]
    return metadata.get("namespace") == ref.namespace and metadata.get("labels", {}).get(LABEL_SERVING) == ref.name


def _partitions(kube: Kube, namespace: str | None, own_pods: set[str]) -> dict:
    """Node -> Partitions, from the driver's ResourceSlices and the devices
    allocated to every claim but those of own_pods (in namespace)."""
    allocated = {(result["pool"], result["device"])
                 for claim in kube.list("resource.k8s.io/v1", "ResourceClaim")
                 if not _owned_by(claim, namespace, own_pods)
                 for result in claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
                 if result.get("driver") == DRIVER}
    return free_partitions(kube.list("resource.k8s.io/v1", "ResourceSlice"), allocated)


def _owned_by(claim: dict, namespace: str | None, pods: set[str]) -> bool:
    """A claim made for one of these Pods from its template."""
    metadata = claim["metadata"]
    return metadata.get("namespace") == namespace and any(
        o.get("kind") == "Pod" and o.get("name") in pods for o in metadata.get("ownerReferences", []))
