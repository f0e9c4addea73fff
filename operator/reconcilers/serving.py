"""InferenceService: resolve the model versions, place them on the fleet,
converge the serving backend, watch the inputs for drift, and carry a
drift-triggered retrain through to promotion."""

from __future__ import annotations

from dataclasses import replace

from kubeloop.api.base import ModelRef
from kubeloop.api.conditions import INFERENCE_SERVICE_CONDITIONS, ConditionType, Reason
from kubeloop.api.refs import ObjectRef
from kubeloop.api.times import epoch, iso, seconds
from kubeloop.api.outcomes import RolloutStatus
from kubeloop.api.serving import (
    DriftStatus, InferenceServiceSpec, InferenceServiceStatus, Placement, ServedTraffic, TrafficSplit,
)
from kubeloop.api.signature import ModelSignature
from kubeloop.featurestore.freshness import StoreNeed, freshness, published
from kubeloop.gpu.placement import PlacementDecision, plan
from kubeloop.operator.conditions import Observation, is_true
from kubeloop.kube import KubeError
from kubeloop.operator.ports import Ports
from kubeloop.operator.reconcilers.common import Outcome, backoff, finish
from kubeloop.operator.reconcilers.outcomes import (advance_rollout, observe_outcomes, rollout_observation,
                                                    rollout_of)
from kubeloop.operator.reconcilers.retraining import RetrainStep, advance_retraining
from kubeloop.registry import tags
from kubeloop.registry.base import ModelVersion, RegistryUnavailable
from kubeloop.registry.promotion import promote, reject
from kubeloop.serving.base import ServedVersion, ServingBackend, ServingRequest, ServingState, ServingUnavailable

KIND = "InferenceService"
REQUIRED = INFERENCE_SERVICE_CONDITIONS.required
LOCAL = PlacementDecision(True, "cpu", "the local backend serves on this machine's CPU; GPU sharing applies "
                                       "to the kubernetes backend")


def reconcile_inference_service(ref: ObjectRef, spec: InferenceServiceSpec, status: InferenceServiceStatus,
                                ports: Ports, attempt: int = 0) -> Outcome[InferenceServiceStatus]:
    backend_name = spec.backend or ports.default_serving_backend
    backend = ports.serving.get(backend_name)
    if backend is None:
        obs = [Observation(ConditionType.DEPLOYED, "False", Reason.BACKEND_NOT_CONFIGURED,
                           f"the operator has no '{backend_name}' serving backend")]
        return Outcome(finish(status, obs, ref.generation, REQUIRED, phase="Failed"))
    unpooled = spec.pool and backend.pool_problem(spec.pool)
    if unpooled:
        obs = [Observation(ConditionType.DEPLOYED, "False", Reason.BACKEND_NOT_CONFIGURED, unpooled)]
        return Outcome(finish(status, obs, ref.generation, REQUIRED, phase="Failed"))
    try:
        retrain = advance_retraining(ref, spec, status, ports) if spec.retraining else None
        primary = _resolve(ports, spec.model)
        splits = {role: _resolve_split(ports, spec.model, split)
                  for role, split in (("canary", spec.canary), ("shadow", spec.shadow)) if split}
        canary_percent = spec.canary.percent if spec.canary else 0
        if retrain and retrain.canary():
            # A retrained challenger in its canary period takes the canary slot.
            splits["canary"] = ports.registry.get_version(spec.model.name, retrain.canary())
            canary_percent = spec.retraining.canary_percent
    except (RegistryUnavailable, KubeError) as exc:
        if isinstance(exc, KubeError) and not exc.transient:
            raise
        obs = [Observation(ConditionType.MODEL_RESOLVED, "Unknown", Reason.REGISTRY_UNAVAILABLE, str(exc))]
        return Outcome(finish(status, obs, ref.generation, REQUIRED), retry_after=backoff(attempt),
                       retry_reason=str(exc))
    retrained = _retrain_fields(retrain)
    observations = list(retrain.observations) if retrain else []
    if primary is None:
        observations.append(Observation(ConditionType.MODEL_RESOLVED, "False", Reason.MODEL_NOT_FOUND,
                                        f"{spec.model.uri} does not exist in the registry"))
        return Outcome(finish(status, observations, ref.generation, REQUIRED, phase="Pending", **retrained))
    missing = [f"{role} {_split_uri(spec.model, s)}" for role, s in (("canary", spec.canary),
               ("shadow", spec.shadow)) if s and splits.get(role) is None]
    observations.append(Observation(ConditionType.MODEL_RESOLVED, "True" if not missing else "False",
                                    Reason.RESOLVED if not missing else Reason.MODEL_NOT_FOUND,
                                    f"{spec.model.uri} is version {primary.version}"
                                    + (f"; not found: {', '.join(missing)}" if missing else "")))

    placement = _place(ref, spec, primary, backend_name, ports)
    if not placement.feasible:
        why = Reason.FITS_AFTER_RELAYOUT if placement.relayout else Reason.NO_FITTING_CAPACITY
        observations.append(Observation(ConditionType.PLACED, "False", why, placement.reason))
        return Outcome(finish(status, observations, ref.generation, REQUIRED, phase="Failed",
                              placement=_placement_status(placement), **retrained))
    why = Reason.WAITING_FOR_CAPACITY if placement.waiting_for_capacity else Reason.CAPACITY
    observations.append(Observation(ConditionType.PLACED, "True", why, placement.reason))

    canary = splits.get("canary")
    if canary and canary.version == primary.version:
        canary = None  # promoted: nothing left to compare
    rollout = status.rollout
    plan = rollout_of(spec, bool(retrain and retrain.canary())) if canary else None
    if plan:
        serving = status.canary_version == canary.version and is_true(status.conditions, ConditionType.CANARY_READY)
        rollout = advance_rollout(ref, plan, status.rollout, primary.version, canary.version, ports, serving)
        observations.append(rollout_observation(rollout))
        canary_percent = rollout.weight
        if rollout.phase == "Aborted":
            canary = None  # every request back to the champion; the alias stays
        if not (retrain and retrain.canary()):  # a retrain records its own verdict
            _record_verdict(ref, spec, rollout, ports)
    # A canary that failed readiness stays out until another version replaces it.
    rolled_back = status.rolled_back_version if canary and canary.version == status.rolled_back_version else None
    if rolled_back:
        canary = None
    versions = [ServedVersion("primary", primary, 100 - (canary_percent if canary else 0))]
    if canary:
        versions.append(ServedVersion("canary", canary, canary_percent))
    if splits.get("shadow"):
        versions.append(ServedVersion("shadow", splits["shadow"], spec.shadow.percent))
    try:
        served = backend.ensure(ServingRequest(ref, spec, tuple(versions), placement))
    except ServingUnavailable as exc:
        observations.append(Observation(ConditionType.DEPLOYED, "Unknown", Reason.BACKEND_UNAVAILABLE, str(exc)))
        return Outcome(finish(status, observations, ref.generation, REQUIRED,
                              placement=_placement_status(placement), **retrained),
                       retry_after=backoff(attempt), retry_reason=str(exc))

    served, unready_since = steady(status, served, primary.version, ports.clock())
    answering = None if served.primary_ready else served.answering
    observations.append(_deployed(served, answering))
    traffic = effective_traffic(versions, served)
    if "canary" in served.rolled_back:
        rolled_back = canary.version
    if rolled_back:
        observations.append(Observation(ConditionType.CANARY_READY, "False", Reason.ROLLED_BACK,
                                        served.message or f"version {rolled_back} failed readiness; "
                                        "the primary serves all traffic"))
    elif canary:
        ok = served.ready.get("canary", False)
        observations.append(Observation(ConditionType.CANARY_READY, "True" if ok else "False",
                                        Reason.READY if ok else Reason.ROLLING_OUT,
                                        _canary_share(canary, canary_percent, traffic)))
    drift, drift_obs = _monitor(ref, spec, primary, backend, ports)
    observations += drift_obs
    pair = (primary.version, canary.version) if canary and plan else None
    performance, outcome_obs = observe_outcomes(ref, spec, versions, pair, backend, ports)
    observations += outcome_obs
    fresh = _keep_fresh(ref, spec, versions, backend, ports)
    observations += fresh
    degraded = bool(missing) or bool(rolled_back) or any(
        not ok for role, ok in served.ready.items() if role != "primary")
    if answering:  # new versions still loading are a rollout, not a degradation
        degraded = bool(missing) or bool(rolled_back)
    phase = "Pending" if not (served.primary_ready or answering) else "Degraded" if degraded else "Ready"
    new = finish(
        status, observations, ref.generation, REQUIRED, phase=phase, url=served.url, grpc_address=served.grpc_address,
        canary_version=canary.version if canary and not rolled_back else None,
        rolled_back_version=rolled_back,
        shadow_version=splits["shadow"].version if splits.get("shadow") else None,
        traffic=traffic, model_version=answering or primary.version,
        placement=_placement_status(placement), ready_replicas=served.ready_replicas,
        drift=drift if spec.monitoring else None, performance=performance, rollout=rollout,
        primary_unready_since=unready_since, **retrained,
    )
    gone = {ConditionType.CANARY_READY} if not canary and not rolled_back else set()
    gone |= {ConditionType.FEATURES_FRESH} if not fresh else set()
    if gone:
        new = new.model_copy(update={"conditions": [c for c in new.conditions if c.type not in gone]})
    if not served.primary_ready or unready_since:
        # Backends start things and return; look again soon rather than at the next resync.
        return Outcome(new, waiting=served.message or "the primary version to become ready")
    return Outcome(new)


UNSTEADY_SECONDS = 30.0
"""How long the primary version that was Ready may fail its readiness
checks before the phase says so: one slow or failed check (a busy machine,
a router opening a store) is not an outage, and callers were still
answered; an outage lasts longer, or shows as dead containers at once."""


def steady(status: InferenceServiceStatus, served: ServingState, primary: str,
           now: float) -> tuple[ServingState, str | None]:
    """The backend's view with hysteresis: a primary that was Ready and is
    the same version stays ready through UNSTEADY_SECONDS of failed checks
    (unless its containers are failing, or the backend says which version
    answers while others load: a rollout, said as such). Also when the
    failures began, while they last."""
    if served.primary_ready or served.failing or served.answering \
            or status.phase not in ("Ready", "Degraded") or status.model_version != primary:
        return served, None
    since = status.primary_unready_since or iso(now)
    if now - epoch(since) >= UNSTEADY_SECONDS:
        return served, None
    message = (f"version {primary} answered until {since} and its readiness checks have failed since "
               f"({served.message or 'no reason given'}); Ready for up to {UNSTEADY_SECONDS:.0f} s of failures")
    return replace(served, ready={**served.ready, "primary": True}, message=message), since


def _record_verdict(ref: ObjectRef, spec: InferenceServiceSpec, rollout: RolloutStatus, ports: Ports) -> None:
    """A finished rollout of spec.canary in the registry: promoted, the
    served alias moves to its version (the API asks spec.model to follow an
    alias with a rollout) and the primary then resolves to it; aborted, the
    audit trail says why. Both are recorded once, however often reconciled."""
    by, model, alias = f"InferenceService {ref.namespace}/{ref.name}", spec.model.name, spec.model.alias
    if rollout.phase == "Promoted":
        current = ports.registry.get_alias(model, alias)
        if current is None or current.version != rollout.challenger:
            promote(ports.registry, model, rollout.challenger, alias, by=by, reason="rollout passed every step")
    elif rollout.phase == "Aborted":
        reject(ports.registry, model, rollout.challenger, alias, by=by, reason=f"rollout {rollout.message}")


def _retrain_fields(retrain: RetrainStep | None) -> dict:
    if retrain is None:
        return {}
    return {"retraining": retrain.retraining, "retrains": retrain.retrains, "handled_alerts": retrain.handled_alerts,
            "last_retrain_at": retrain.last_retrain_at}


def effective_traffic(versions: list[ServedVersion], served: ServingState) -> list[ServedTraffic]:
    """Each served version with the share the backend really gives it
    (what was asked, where the backend splits exactly)."""
    shares = served.traffic or {}
    return [ServedTraffic(role=v.role, version=v.model.version, percent=shares.get(v.role, v.percent))
            for v in versions if v.role not in served.rolled_back]


def _canary_share(canary: ModelVersion, asked: int, traffic: list[ServedTraffic]) -> str:
    got = next((t.percent for t in traffic if t.role == "canary"), asked)
    if got == asked:
        return f"version {canary.version} gets {asked}% of requests"
    return (f"version {canary.version} gets {got}% of requests ({asked}% asked; the split follows the ratio of "
            "ready replicas: more replicas, or a Gateway, split closer to what was asked)")


def _deployed(served: ServingState, answering: str | None) -> Observation:
    """Deployed stays True while new versions load beside one that answers,
    as a Deployment rolling out keeps its old Pods serving."""
    if served.primary_ready:
        return Observation(ConditionType.DEPLOYED, "True", Reason.AVAILABLE, served.message)
    if answering:
        return Observation(ConditionType.DEPLOYED, "True", Reason.UPDATING,
                           f"version {answering} answers until the new versions are ready: {served.message}")
    return Observation(ConditionType.DEPLOYED, "False",
                       Reason.CONTAINERS_FAILING if served.failing else Reason.ROLLING_OUT, served.message)


def _place(ref: ObjectRef, spec: InferenceServiceSpec, primary: ModelVersion, backend_name: str,
           ports: Ports) -> PlacementDecision:
    if backend_name == "local":
        return LOCAL
    footprint = primary.tags.get(tags.GPU_MEMORY_MIB)
    return plan(spec.gpu, int(footprint) if footprint else None, ports.fleet(excluding=ref) if spec.gpu else [],
                replicas=spec.replicas)


def _monitor(ref: ObjectRef, spec: InferenceServiceSpec, primary: ModelVersion, backend: ServingBackend,
             ports: Ports) -> tuple[DriftStatus | None, list[Observation]]:
    """Start the drift job when it is due; report what the latest one found."""
    if spec.monitoring is None:
        return None, []
    if ports.monitor is None:
        return None, [Observation(ConditionType.DRIFT_MONITORED, "False", Reason.NO_MONITOR,
                                  "the operator runs no drift monitor")]
    log = backend.request_log(ref, spec)
    if log is None:
        return None, [Observation(ConditionType.DRIFT_MONITORED, "False", Reason.NO_REQUEST_LOG,
                                  "nothing logs this service's requests, and the drift job reads them: enable "
                                  "spec.requestLogging (on a cluster, the operator needs a router image and an "
                                  "s3:// request log, or spec.requestLogging.destination)")]
    latest = ports.monitor.latest(ref)
    due = latest is None or ports.clock() - latest.get("at", 0) >= seconds(spec.monitoring.schedule)
    if due and not ports.monitor.running(ref):
        ports.monitor.start(ref, {
            "service": f"{ref.namespace}/{ref.name}", "model": primary.name, "version": primary.version,
            "request_log": log,
            "window_seconds": seconds(spec.monitoring.window), "threshold": spec.monitoring.drift_share_threshold,
            "features": list(spec.monitoring.features), "min_rows": spec.monitoring.min_rows,
            "columns": ModelSignature.from_tags(primary.tags).feature_columns,
            "feature_store": primary.tags.get(tags.FEATURE_STORE, ""),
        })
    if latest is None:
        return DriftStatus(message="the first drift job is running"), [
            Observation(ConditionType.DRIFT_MONITORED, "Unknown", Reason.FIRST_RUN, "the first drift job is running")]
    at = iso(latest["at"])
    if "error" in latest or "skipped" in latest:
        message = latest.get("error") or latest["skipped"]
        return DriftStatus(last_run_at=at, rows=latest.get("rows", 0), message=message), [
            Observation(ConditionType.DRIFT_MONITORED, "Unknown" if "skipped" in latest else "False",
                        Reason.NOT_ENOUGH_ROWS if "skipped" in latest else Reason.DRIFT_JOB_FAILED, message)]
    drift = DriftStatus(last_run_at=at, share=round(latest["share"], 4), drifted=latest["drifted"],
                        rows=latest["rows"], features_drifted=latest.get("features_drifted", []),
                        report=latest.get("report"))
    summary = f"{drift.share:.0%} of features drifted over {drift.rows} requests"
    verdict = Reason.DRIFTED if drift.drifted else Reason.NO_DRIFT
    return drift, [Observation(ConditionType.DRIFT_MONITORED, "True", verdict, summary)]


def _keep_fresh(ref: ObjectRef, spec: InferenceServiceSpec, versions: list[ServedVersion],
                backend: ServingBackend, ports: Ports) -> list[Observation]:
    """Have the online stores the served versions read kept materialised;
    how fresh they are (nothing when no version reads online features). On
    a backend whose serving path runs in Pods, a store recorded as a
    repository folder is neither read nor materialised: the condition says
    so, and what to do."""
    every = spec.features.materialize_every
    needs = [need for v in versions if (need := store_need(v.model.tags, seconds(every)))] \
        if every and backend.reads_online_features else []
    folders = [n for n in needs if backend.published_stores_only and not published(n.store)]
    states = ports.features.keep_fresh(ref.uid, [n for n in needs if n not in folders])
    if folders:
        return [Observation(ConditionType.FEATURES_FRESH, "False", Reason.STORE_NOT_PUBLISHED, NOT_PUBLISHED)]
    if not states:
        return []
    return [Observation(ConditionType.FEATURES_FRESH, *freshness(states, ports.clock()))]


NOT_PUBLISHED = ("a served version's feature store is recorded as a repository folder on the operator's machine: "
                 "router Pods do not read it and a materialisation Job cannot open it; publish the store's "
                 "feature_store.yaml (registry, sources and online store reachable from Pods, for example in "
                 "object storage and Redis) and record it with the version (spec.features.store of its TrainingJob)")


def store_need(version_tags: dict[str, str], interval: float) -> StoreNeed | None:
    """The store a version reads online features from, and the views it
    reads; None when it takes feature vectors only."""
    signature = ModelSignature.from_tags(version_tags)
    store = version_tags.get(tags.FEATURE_STORE, "")
    if not signature.feature_views or not store:
        return None
    return StoreNeed(store, tuple(sorted(signature.feature_views)), interval)


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
