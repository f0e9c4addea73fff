"""The placement planner (pure): from the fleet's nodes and a model's GPU
memory footprint, choose the smallest MIG slice, MPS share or whole GPU that
holds it, and say why.

The fleet is read the way NVIDIA's device plugin and GPU Feature Discovery
describe it: MIG mixed strategy advertises one resource per profile
(nvidia.com/mig-1g.10gb); MIG single strategy advertises MIG devices as plain
nvidia.com/gpu and names the profile only in nvidia.com/gpu.product; MPS and
time-slicing advertise `replicas` shares of each GPU; otherwise nvidia.com/gpu
is a whole GPU. Placement therefore selects on labels as well as resources.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from kubeloop.api.serving import ServingGPU
from kubeloop.gpu.catalog import gpu_model

Mode = Literal["cpu", "exclusive", "mig", "mps"]
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
PRODUCT_LABEL = "nvidia.com/gpu.product"
# Without a measured footprint the planner assumes this much, and says so.
ASSUMED_FOOTPRINT_MIB = 2048
# MPS keeps this much of a share's memory free for the CUDA context.
MPS_HEADROOM = 1.1


@dataclass(frozen=True)
class Partitions:
    """What a node's partitionable GPUs (DRA) can still give: per MIG
    profile, or "gpu" for a whole GPU, how many more devices the scheduler
    could allocate beside those claims hold now."""

    product: str
    free: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeInfo:
    """What the planner needs to know about a node."""

    name: str
    labels: dict[str, str]
    allocatable: dict[str, int]
    requested: dict[str, int] = field(default_factory=dict)
    """Extended resources already requested by Pods on the node."""
    partitions: Partitions | None = None
    """Its GPUs as partitionable DRA devices, cut when a claim is allocated."""

    def free(self, resource: str) -> int:
        return self.allocatable.get(resource, 0) - self.requested.get(resource, 0)


@dataclass(frozen=True)
class Offer:
    """One kind of GPU capacity a node can give a replica."""

    mode: Mode
    node: str
    product: str
    """The base GPU product (without -MIG-... or -SHARED)."""
    resource: str
    memory_mib: int
    gpu_fraction: float
    """How much of a physical GPU one unit is: what placement minimises."""
    selector: dict[str, str]
    """Node labels that identify nodes offering exactly this capacity."""
    free: int
    profile: str | None = None
    replicas: int = 1
    partitioned: bool = False
    """A partition of a partitionable GPU, cut when its claim is allocated."""

    @property
    def label(self) -> str:
        if self.mode == "mig" and self.partitioned:
            return f"a MIG {self.profile} partition of an {self.product} (cut at allocation)"
        if self.mode == "mig":
            return f"MIG {self.profile} of an {self.product}"
        if self.mode == "mps":
            return f"an MPS share (1/{self.replicas}) of an {self.product}"
        return f"a whole {self.product}"


@dataclass(frozen=True)
class PlacementDecision:
    """The outcome: what to request, where, and why."""

    feasible: bool
    mode: Mode
    reason: str
    resources: dict[str, int] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    product: str | None = None
    profile: str | None = None
    nodes: tuple[str, ...] = ()
    footprint_mib: int | None = None
    waiting_for_capacity: bool = False
    relayout: "Relayout | None" = None
    """Infeasible now, but a valid MIG layout of this node would hold it."""


@dataclass(frozen=True)
class Relayout:
    """A node whose GPUs, re-partitioned, would hold a request: the
    mig-parted configuration to label it with, and what the Pods there hold
    now (the drain moves them; the layout keeps room for them)."""

    node: str
    config: str
    layouts: tuple[dict[str, int], ...]
    profile: str
    moves: dict[str, int]

    def describe(self) -> str:
        held = ", ".join(f"{n}x {r}" for r, n in sorted(self.moves.items())) or "nothing"
        return (f"fits after relabelling node {self.node} to nvidia.com/mig.config={self.config} "
                f"(a {self.profile} slice; drain the node first, moving what its Pods hold: {held})")


CPU = PlacementDecision(True, "cpu", "no GPU requested: served on CPU")


def offers(nodes: list[NodeInfo]) -> list[Offer]:
    """Every kind of GPU capacity in the fleet, one offer per node and kind."""
    found: list[Offer] = []
    for node in nodes:
        if node.partitions is not None:
            found += _partition_offers(node.name, node.partitions)
            continue
        labels = node.labels
        product_label = labels.get(PRODUCT_LABEL, "")
        model = gpu_model(product_label) if product_label else None
        if model is None:
            continue
        strategy = labels.get("nvidia.com/mig.strategy")
        if strategy == "mixed":
            for resource in sorted(node.allocatable):
                if not resource.startswith("nvidia.com/mig-"):
                    continue
                name = resource.removeprefix("nvidia.com/mig-")
                profile = model.profile(name)
                if profile is None:
                    continue
                memory = int(labels.get(f"{resource}.memory", profile.memory_mib))
                found.append(Offer(
                    "mig", node.name, model.product, resource, memory,
                    profile.compute_slices / model.compute_slices,
                    {PRODUCT_LABEL: model.product, "nvidia.com/mig.strategy": "mixed"},
                    node.free(resource), profile=name))
        elif strategy == "single" and "-MIG-" in product_label:
            name = product_label.split("-MIG-", 1)[1].removesuffix("-SHARED")
            profile = model.profile(name)
            if profile is None:
                continue
            memory = int(labels.get("nvidia.com/gpu.memory", profile.memory_mib))
            found.append(Offer(
                "mig", node.name, model.product, "nvidia.com/gpu", memory,
                profile.compute_slices / model.compute_slices,
                {PRODUCT_LABEL: product_label}, node.free("nvidia.com/gpu"), profile=name))
        else:
            replicas = int(labels.get("nvidia.com/gpu.replicas", "1") or 1)
            memory = int(labels.get("nvidia.com/gpu.memory", model.memory_mib))
            if labels.get("nvidia.com/gpu.sharing-strategy") == "mps" and replicas > 1:
                resource = "nvidia.com/gpu.shared" if "nvidia.com/gpu.shared" in node.allocatable else "nvidia.com/gpu"
                found.append(Offer(
                    "mps", node.name, model.product, resource, memory // replicas, 1 / replicas,
                    {PRODUCT_LABEL: product_label, "nvidia.com/gpu.sharing-strategy": "mps"},
                    node.free(resource), replicas=replicas))
            elif labels.get("nvidia.com/gpu.sharing-strategy", "none") == "none":
                found.append(Offer(
                    "exclusive", node.name, model.product, "nvidia.com/gpu", memory, 1.0,
                    {PRODUCT_LABEL: product_label}, node.free("nvidia.com/gpu")))
    return found


def _partition_offers(node: str, partitions: Partitions) -> list[Offer]:
    """A partitionable node offers every profile (and the whole GPU) as
    many times as its free counters allow. The claim's selector names the
    product and profile; the node selector only the product, as GPU Feature
    Discovery labels it."""
    model = gpu_model(partitions.product)
    if model is None:
        return []
    selector = {PRODUCT_LABEL: model.product}
    found = [Offer("mig", node, model.product, f"nvidia.com/mig-{p.name}", p.memory_mib,
                   p.compute_slices / model.compute_slices, selector, partitions.free.get(p.name, 0),
                   profile=p.name, partitioned=True)
             for p in model.mig_profiles]
    found.append(Offer("exclusive", node, model.product, "nvidia.com/gpu", model.memory_mib, 1.0, selector,
                       partitions.free.get("gpu", 0), partitioned=True))
    return found


def plan(gpu: ServingGPU | None, footprint_mib: int | None, nodes: list[NodeInfo],
         replicas: int = 1) -> PlacementDecision:
    """Choose the smallest capacity that holds the footprint (pure)."""
    if gpu is None:
        return CPU
    assumed = footprint_mib is None and gpu.memory_mib is None
    need = gpu.memory_mib or footprint_mib or ASSUMED_FOOTPRINT_MIB
    note = f" (no measured footprint: {ASSUMED_FOOTPRINT_MIB} MiB assumed)" if assumed else ""
    all_offers = offers(nodes)
    wanted = [o for o in all_offers if _allowed(o, gpu)]
    if not wanted:
        return _infeasible(f"the fleet has no {_describe_request(gpu)}", need, gpu, nodes, replicas)
    if gpu.sharing == "exclusive":
        fitting = [o for o in wanted if o.memory_mib * gpu.count >= need]
    else:
        fitting = [o for o in wanted if _share_memory(o, gpu) >= need]
    if not fitting:
        largest = max(wanted, key=lambda o: o.memory_mib)
        return _infeasible(
            f"a footprint of {need} MiB does not fit {_describe_request(gpu)}: the largest "
            f"candidate, {largest.label}, holds {_share_memory(largest, gpu)} MiB", need, gpu, nodes, replicas)
    units = gpu.count if gpu.sharing == "exclusive" else 1
    free = [o for o in fitting if o.free >= units]
    pool = free or fitting
    best = min(pool, key=lambda o: (o.gpu_fraction * units, o.memory_mib, o.product, o.node))
    same = [o for o in pool if (o.mode, o.resource, o.selector) == (best.mode, best.resource, best.selector)]
    decision = PlacementDecision(
        feasible=True, mode=best.mode,
        reason=(f"{need} MiB{note} fits {best.label} ({_share_memory(best, gpu)} MiB); "
                f"smallest of {len(fitting)} fitting {'offer' if len(fitting) == 1 else 'offers'}"
                + ("" if free else "; no free capacity now, Pods wait for it")),
        resources={best.resource: units},
        node_selector=dict(best.selector),
        tolerations=(GPU_TOLERATION,),
        env=_mps_env(best, gpu, need) if best.mode == "mps" else {},
        product=best.product, profile=best.profile,
        nodes=tuple(sorted({o.node for o in same})),
        footprint_mib=need, waiting_for_capacity=not free,
    )
    return decision


def _allowed(offer: Offer, gpu: ServingGPU) -> bool:
    if gpu.product and gpu_model(gpu.product) and offer.product != gpu_model(gpu.product).product:
        return False
    if gpu.sharing == "exclusive":
        return offer.mode == "exclusive"
    if gpu.sharing == "mig":
        return offer.mode == "mig" and _profile_matches(offer, gpu)
    if gpu.sharing == "mps":
        return offer.mode == "mps"
    return offer.mode != "mig" or _profile_matches(offer, gpu)


def _profile_matches(offer: Offer, gpu: ServingGPU) -> bool:
    wanted = gpu.mig.profile if gpu.mig else "auto"
    return wanted == "auto" or offer.profile == wanted


def _share_memory(offer: Offer, gpu: ServingGPU) -> int:
    if offer.mode == "mps" and gpu.mps and gpu.mps.memory_limit_mib:
        return min(gpu.mps.memory_limit_mib, offer.memory_mib)
    return offer.memory_mib


def _mps_env(offer: Offer, gpu: ServingGPU, need: int) -> dict[str, str]:
    threads = gpu.mps.active_thread_percentage if gpu.mps else round(100 / offer.replicas)
    limit = gpu.mps.memory_limit_mib if gpu.mps and gpu.mps.memory_limit_mib else min(
        offer.memory_mib, int(need * MPS_HEADROOM))
    return {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(threads),
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={limit}M"}


def _describe_request(gpu: ServingGPU) -> str:
    product = f" on {gpu.product}" if gpu.product else ""
    if gpu.sharing == "mig":
        profile = gpu.mig.profile if gpu.mig else "auto"
        return ("MIG slice" if profile == "auto" else f"MIG profile {profile}") + product
    if gpu.sharing == "mps":
        return "MPS-shared GPU" + product
    if gpu.sharing == "exclusive":
        return "whole GPU" + product
    return "GPU capacity" + product


def _infeasible(reason: str, need: int, gpu: ServingGPU, nodes: list[NodeInfo], replicas: int) -> PlacementDecision:
    """Nothing holds the request now; where MIG may serve it, say which
    re-partitioned node would."""
    relayout = relayout_for(gpu, need, nodes, replicas) if gpu.sharing in ("mig", "auto") else None
    if relayout:
        reason = f"{reason}; {relayout.describe()}"
    return PlacementDecision(False, "cpu", reason, footprint_mib=need, relayout=relayout)


def relayout_for(gpu: ServingGPU, need: int, nodes: list[NodeInfo], replicas: int = 1) -> Relayout | None:
    """The first MIG node (by name; of the requested product) with a profile
    that holds the footprint and a valid layout (the node's strategy's: one
    profile for all GPUs under the single strategy) holding that slice
    besides every MIG device its Pods hold now."""
    from kubeloop.gpu.mig import LayoutError, choose_layout

    wanted = gpu.mig.profile if gpu.mig else "auto"
    for node in sorted(mig_nodes(nodes), key=lambda n: n.name):
        model = gpu_model(node.labels[PRODUCT_LABEL])
        if gpu.product and gpu_model(gpu.product) is not model:
            continue
        profile = model.smallest_profile(need, wanted)
        if profile is None:
            continue
        demand = held_mig_devices(node)
        demand[profile.name] = demand.get(profile.name, 0) + replicas
        try:
            config, layouts = choose_layout(model, node_gpus(node), demand, node.labels.get("nvidia.com/mig.config"),
                                            homogeneous=node.labels.get("nvidia.com/mig.strategy") == "single")
        except LayoutError:
            continue
        moves = {r: n for r, n in node.requested.items() if n and r.startswith("nvidia.com/")}
        return Relayout(node.name, config, tuple(layouts), profile.name, moves)
    return None


def mig_nodes(nodes: list[NodeInfo]) -> list[NodeInfo]:
    return [n for n in nodes if n.labels.get("nvidia.com/mig.strategy") and gpu_model(n.labels.get(PRODUCT_LABEL, ""))]


def node_gpus(node: NodeInfo) -> int:
    """Physical GPUs of a MIG node (under the single strategy GFD counts MIG devices)."""
    labels = node.labels
    if labels.get("nvidia.com/mig.strategy") == "single":
        model = gpu_model(labels[PRODUCT_LABEL])
        per_gpu = model.profile(labels[PRODUCT_LABEL].split("-MIG-", 1)[1]).max_per_gpu
        return max(1, int(labels.get("nvidia.com/gpu.count", per_gpu)) // per_gpu)
    return int(labels.get("nvidia.com/gpu.count", "1"))


def held_mig_devices(node: NodeInfo) -> dict[str, int]:
    """MIG profile -> devices the node's Pods hold now."""
    labels = node.labels
    if labels.get("nvidia.com/mig.strategy") == "single":
        held = node.requested.get("nvidia.com/gpu", 0)
        return {labels[PRODUCT_LABEL].split("-MIG-", 1)[1]: held} if held else {}
    prefix = "nvidia.com/mig-"
    return {r.removeprefix(prefix): n for r, n in node.requested.items() if r.startswith(prefix) and n}


@dataclass(frozen=True)
class NodeLayout:
    """A suggested MIG layout for one node (nvidia.com/mig.config)."""

    node: str
    product: str
    current: str | None
    suggested: str
    layouts: tuple[dict[str, int], ...]
    demand: dict[str, int]
    error: str | None = None


def suggest_layouts(requests: list[tuple[ServingGPU | None, int | None, int]],
                    nodes: list[NodeInfo]) -> list[NodeLayout]:
    """For every MIG node, the mig-parted layout that holds the MIG instances
    the requests need (gpu spec, footprint, replicas), within each GPU's
    profile limits (pure). A request the current layouts cannot place still
    counts: its smallest fitting profile on a MIG node of the right product
    is what re-partitioning should add."""
    from kubeloop.gpu.mig import LayoutError, choose_layout

    by_node: dict[str, dict[str, int]] = {}
    for spec, footprint, replicas in requests:
        if spec is None or spec.sharing not in ("mig", "auto"):
            continue
        decision = plan(spec, footprint, nodes, replicas)
        if decision.feasible and decision.mode != "mig":
            continue
        if decision.feasible:
            node, profile = decision.nodes[0], decision.profile
        elif decision.relayout:
            node, profile = decision.relayout.node, decision.relayout.profile
        else:
            continue
        counts = by_node.setdefault(node, {})
        counts[profile] = counts.get(profile, 0) + replicas
    out = []
    for node in mig_nodes(nodes):
        if node.name not in by_node:
            continue
        labels = node.labels
        model = gpu_model(labels[PRODUCT_LABEL])
        demand = by_node[node.name]
        current = labels.get("nvidia.com/mig.config")
        try:
            name, layouts = choose_layout(model, node_gpus(node), demand, current,
                                          homogeneous=labels.get("nvidia.com/mig.strategy") == "single")
            out.append(NodeLayout(node.name, model.product, current, name, tuple(layouts), demand))
        except LayoutError as exc:
            out.append(NodeLayout(node.name, model.product, current, "-", (), demand, str(exc)))
    return out
