"""InferenceService: resolve the model versions, place them on the fleet,
converge the serving backend, and report where and how it serves."""

from __future__ import annotations

from kubeloop.api.base import ModelRef
from kubeloop.api.refs import ObjectRef
from kubeloop.api.serving import InferenceServiceSpec, InferenceServiceStatus, Placement, TrafficSplit
from kubeloop.gpu.placement import PlacementDecision, plan
from kubeloop.operator.conditions import Observation
from kubeloop.operator.ports import Ports
from kubeloop.operator.reconcilers.common import Outcome, backoff, finish
from kubeloop.registry import tags
from kubeloop.registry.base import ModelVersion, RegistryUnavailable
from kubeloop.serving.base import ServedVersion, ServingRequest, ServingUnavailable

KIND = "InferenceService"
REQUIRED = ["ModelResolved", "Placed", "Deployed"]
LOCAL = PlacementDecision(True, "cpu", "the local backend serves on this machine's CPU; GPU sharing applies "
                                       "to the kubernetes backend")


def reconcile_inference_service(ref: ObjectRef, spec: InferenceServiceSpec, status: InferenceServiceStatus,
                                ports: Ports, attempt: int = 0) -> Outcome[InferenceServiceStatus]:
    backend_name = spec.backend or ports.default_serving_backend
    backend = ports.serving.get(backend_name)
    if backend is None:
        obs = [Observation("Deployed", "False", "BackendNotConfigured",
                           f"the operator has no '{backend_name}' serving backend")]
        new = finish(status, obs, ref.generation, REQUIRED, phase="Failed")
        return Outcome(new)

    try:
        primary = _resolve(ports, spec.model)
        splits = {role: _resolve_split(ports, spec.model, split)
                  for role, split in (("canary", spec.canary), ("shadow", spec.shadow)) if split}
    except RegistryUnavailable as exc:
        obs = [Observation("ModelResolved", "Unknown", "RegistryUnavailable", str(exc))]
        new = finish(status, obs, ref.generation, REQUIRED)
        return Outcome(new, retry_after=backoff(attempt), retry_reason=str(exc))
    if primary is None:
        obs = [Observation("ModelResolved", "False", "ModelNotFound",
                           f"{spec.model.uri} does not exist in the registry")]
        new = finish(status, obs, ref.generation, REQUIRED, phase="Pending")
        return Outcome(new)
    missing = [f"{role} {_split_uri(spec.model, s)}" for role, s in (("canary", spec.canary),
               ("shadow", spec.shadow)) if s and splits.get(role) is None]
    observations = [Observation("ModelResolved", "True" if not missing else "False",
                                "Resolved" if not missing else "ModelNotFound",
                                f"{spec.model.uri} is version {primary.version}"
                                + (f"; not found: {', '.join(missing)}" if missing else ""))]

    footprint = primary.tags.get(tags.GPU_MEMORY_MIB)
    if backend_name == "local":
        placement = LOCAL
    else:
        placement = plan(spec.gpu, int(footprint) if footprint else None, ports.fleet() if spec.gpu else [],
                         replicas=spec.replicas)
    if not placement.feasible:
        observations.append(Observation("Placed", "False", "NoFittingCapacity", placement.reason))
        new = finish(status, observations, ref.generation, REQUIRED, phase="Failed",
                     placement=_placement_status(placement))
        return Outcome(new)
    observations.append(Observation("Placed", "True", "Capacity" if not placement.waiting_for_capacity
                                    else "WaitingForCapacity", placement.reason))

    canary = splits.get("canary")
    # A canary that failed readiness stays out until the spec names another.
    rolled_back = status.rolled_back_version if canary and canary.version == status.rolled_back_version else None
    if rolled_back:
        canary = None
    versions = [ServedVersion("primary", primary, 100 - (spec.canary.percent if canary else 0))]
    if canary:
        versions.append(ServedVersion("canary", canary, spec.canary.percent))
    if splits.get("shadow"):
        versions.append(ServedVersion("shadow", splits["shadow"], spec.shadow.percent))
    request = ServingRequest(ref, spec, tuple(versions), placement)
    try:
        served = backend.ensure(request)
    except ServingUnavailable as exc:
        observations.append(Observation("Deployed", "Unknown", "BackendUnavailable", str(exc)))
        new = finish(status, observations, ref.generation, REQUIRED, placement=_placement_status(placement))
        return Outcome(new, retry_after=backoff(attempt), retry_reason=str(exc))

    observations.append(Observation(
        "Deployed", "True" if served.primary_ready else "False",
        "Available" if served.primary_ready else "RollingOut", served.message))
    if "canary" in served.rolled_back:
        rolled_back = canary.version
    if rolled_back:
        observations.append(Observation("CanaryReady", "False", "RolledBack",
                                        served.message or f"version {rolled_back} failed readiness; "
                                        "the primary serves all traffic"))
    elif canary:
        ok = served.ready.get("canary", False)
        observations.append(Observation("CanaryReady", "True" if ok else "False", "Ready" if ok else "RollingOut",
                                        f"version {canary.version} gets {spec.canary.percent}% of requests"))
    degraded = bool(missing) or bool(rolled_back) or any(
        not ok for role, ok in served.ready.items() if role != "primary")
    phase = "Ready" if served.primary_ready and not degraded else "Degraded" if served.primary_ready else "Pending"
    new = finish(
        status, observations, ref.generation, REQUIRED, phase=phase, url=served.url,
        model_version=primary.version,
        canary_version=canary.version if canary and not rolled_back else None,
        rolled_back_version=rolled_back,
        shadow_version=splits["shadow"].version if splits.get("shadow") else None,
        placement=_placement_status(placement), ready_replicas=served.ready_replicas,
    )
    if not spec.canary:
        new = new.model_copy(update={"conditions": [c for c in new.conditions if c.type != "CanaryReady"]})
    return Outcome(new)


def _resolve(ports: Ports, ref: ModelRef) -> ModelVersion | None:
    return ports.registry.resolve(ref.name, ref.version, ref.alias)


def _resolve_split(ports: Ports, model: ModelRef, split: TrafficSplit) -> ModelVersion | None:
    return ports.registry.resolve(model.name, split.version, split.alias)


def _split_uri(model: ModelRef, split: TrafficSplit) -> str:
    return f"models:/{model.name}@{split.alias}" if split.alias else f"models:/{model.name}/{split.version}"


def _placement_status(decision: PlacementDecision) -> Placement:
    resource = next(iter(decision.resources), None)
    return Placement(mode=decision.mode, resource=resource, product=decision.product,
                     nodes=list(decision.nodes), reason=decision.reason)
