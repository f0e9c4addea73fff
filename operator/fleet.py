"""Read the GPU fleet from the cluster for the placement planner.

What placement needs of each object is small (a Pod's node and GPU limits, a
Node's GPU labels and allocatable, a claim's allocated devices); the
reducers below keep only that, and `plan_fleet` builds the planner's view
from it with no I/O. The operator reads through `FleetView`, kept by
watches; the CLI reads once with `observe_fleet`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable

from kubeloop.api.constants import LABEL_ROLE
from kubeloop.api.refs import ObjectRef
from kubeloop.gpu.dra import DRIVER, free_partitions
from kubeloop.gpu.placement import NodeInfo
from kubeloop.kube import Informer, Kube
from kubeloop.serving.builders.workloads import LABEL_SERVING, container_troubles

GPU_PREFIX = "nvidia.com/"
DRA = "resource.k8s.io/v1"


@dataclass(frozen=True)
class PodUse:
    """A scheduled, live Pod: its GPU limits, and which InferenceService
    serves through it, in which role, with what troubles in its containers,
    and whether it is ready."""

    namespace: str
    name: str
    node: str
    serving: str | None
    gpus: tuple[tuple[str, int], ...]
    role: str | None = None
    troubles: tuple[str, ...] = ()
    ready: bool = False


@dataclass(frozen=True)
class NodeGPUs:
    name: str
    labels: dict[str, str]
    allocatable: dict[str, int]


@dataclass(frozen=True)
class ClaimUse:
    """The driver's devices a ResourceClaim holds, and the Pods it was made for."""

    namespace: str
    pods: frozenset[str]
    devices: frozenset[tuple[str, str]]


def _count(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def pod_use(pod: dict) -> PodUse | None:
    """None for a Pod placement can ignore: unscheduled, finished, or holding
    no GPU and serving nothing."""
    spec, metadata = pod.get("spec", {}), pod["metadata"]
    node = spec.get("nodeName")
    if not node or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
        return None
    gpus: dict[str, int] = defaultdict(int)
    for container in spec.get("containers", []):
        for name, value in container.get("resources", {}).get("limits", {}).items():
            if name.startswith(GPU_PREFIX):
                gpus[name] += _count(value)
    labels = metadata.get("labels", {})
    serving = labels.get(LABEL_SERVING)
    if not gpus and serving is None:
        return None
    troubles = tuple(container_troubles([pod])) if serving is not None else ()
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in pod.get("status", {}).get("conditions", []))
    return PodUse(metadata.get("namespace", ""), metadata["name"], node, serving, tuple(sorted(gpus.items())),
                  labels.get(LABEL_ROLE), troubles, ready)


def _serving_role(use: PodUse) -> tuple[str, str, str] | None:
    """Where FleetView.troubles looks a serving Pod up."""
    return (use.namespace, use.serving, use.role) if use.serving is not None else None


def node_gpus(node: dict) -> NodeGPUs:
    allocatable = {k: _count(v) for k, v in node.get("status", {}).get("allocatable", {}).items()
                   if k.startswith(GPU_PREFIX)}
    return NodeGPUs(node["metadata"]["name"], node["metadata"].get("labels", {}), allocatable)


def claim_use(claim: dict) -> ClaimUse | None:
    devices = frozenset((r["pool"], r["device"])
                        for r in claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
                        if r.get("driver") == DRIVER)
    if not devices:
        return None
    metadata = claim["metadata"]
    pods = frozenset(o.get("name") for o in metadata.get("ownerReferences", []) if o.get("kind") == "Pod")
    return ClaimUse(metadata.get("namespace", ""), pods, devices)


def driver_slice(piece: dict) -> dict | None:
    return piece if piece.get("spec", {}).get("driver") == DRIVER else None


def plan_fleet(pods: Iterable[PodUse], nodes: Iterable[NodeGPUs], claims: Iterable[ClaimUse] = (),
               slices: list[dict] | None = None, excluding: ObjectRef | None = None) -> list[NodeInfo]:
    """Nodes with their GPU labels, allocatable GPU resources, and what live
    Pods already request of them; with DRA's slices, also what each node's
    partitionable GPUs can still give. What the Pods of `excluding` (the
    InferenceService being placed) hold counts as free: it is theirs to keep,
    not capacity to wait for."""
    requested: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    own: set[str] = set()
    for pod in pods:
        if excluding and pod.namespace == excluding.namespace and pod.serving == excluding.name:
            own.add(pod.name)
            continue
        for name, count in pod.gpus:
            requested[pod.node][name] += count
    partitions = {}
    if slices is not None:
        namespace = excluding.namespace if excluding else None
        allocated = {device for claim in claims if not (claim.namespace == namespace and claim.pods & own)
                     for device in claim.devices}
        partitions = free_partitions(slices, allocated)
    return [NodeInfo(n.name, n.labels, n.allocatable, dict(requested[n.name]), partitions.get(n.name))
            for n in nodes]


def observe_fleet(kube: Kube, dra: bool = False, excluding: ObjectRef | None = None) -> list[NodeInfo]:
    """The fleet as one LIST of each kind finds it now (the CLI's one-off reads)."""
    pods = [use for pod in kube.list("v1", "Pod") if (use := pod_use(pod))]
    nodes = [node_gpus(node) for node in kube.list("v1", "Node")]
    if not dra:
        return plan_fleet(pods, nodes, excluding=excluding)
    claims = [use for claim in kube.list(DRA, "ResourceClaim") if (use := claim_use(claim))]
    slices = [piece for piece in kube.list(DRA, "ResourceSlice") if driver_slice(piece)]
    return plan_fleet(pods, nodes, claims, slices, excluding)


class FleetView:
    """The fleet kept by watches, for the operator: every reconcile of every GPU
    InferenceService places it, and a LIST of every Pod in the cluster each
    time would cost the API server the fleet's size times the services, once
    per resync."""

    def __init__(self, kube: Kube, dra: bool = False):
        self.pods = Informer(kube, "v1", "Pod", pod_use, index=_serving_role)
        self.nodes = Informer(kube, "v1", "Node", node_gpus)
        self.claims = Informer(kube, DRA, "ResourceClaim", claim_use) if dra else None
        self.slices = Informer(kube, DRA, "ResourceSlice", driver_slice) if dra else None

    def _informers(self) -> list[Informer]:
        return [i for i in (self.pods, self.nodes, self.claims, self.slices) if i is not None]

    def start(self) -> "FleetView":
        for informer in self._informers():
            informer.start()
        return self

    def stop(self) -> None:
        for informer in self._informers():
            informer.stop()

    def on_serving_pod(self, tell: Callable[[str, str], None]) -> None:
        """Call tell(namespace, service) when a service's Pod appears, goes,
        or changes what is kept of it (readiness, troubles, node), so the
        service is looked at again without polling."""

        def changed(old: PodUse | None, new: PodUse | None) -> None:
            for namespace, service in {(u.namespace, u.serving) for u in (old, new) if u and u.serving}:
                tell(namespace, service)

        self.pods.on_change = changed

    def troubles(self, ref: ObjectRef, role: str) -> list[str]:
        """What went wrong in the containers of a role's live Pods (see
        container_troubles), from the watch: a LIST of the namespace's Pods
        by label for every reconcile of every service made the API server
        filter every Pod there each time."""
        pods = self.pods.indexed((ref.namespace, ref.name, role))
        return [trouble for pod in sorted(pods, key=lambda p: p.name) for trouble in pod.troubles]

    def __call__(self, excluding: ObjectRef | None = None) -> list[NodeInfo]:
        claims = self.claims.values() if self.claims else ()
        slices = self.slices.values() if self.slices else None
        return plan_fleet(self.pods.values(), self.nodes.values(), claims, slices, excluding)
