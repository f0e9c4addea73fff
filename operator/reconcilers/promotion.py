"""Declarative promotion: move an alias to a version once its gates pass,
exactly once, with the verdict recorded in the registry; and the tail that
TrainingJob and OptimizedModel share once their run's state is known (the
model it registered, then its promotion)."""

from __future__ import annotations

import json
from dataclasses import asdict

from kubeloop.api.base import RegisteredModel
from kubeloop.api.conditions import ConditionType, Reason
from kubeloop.api.promotion import PromotionPolicy, alias_for
from kubeloop.api.refs import ObjectRef
from kubeloop.api.tasks import PRIMARY
from kubeloop.operator.conditions import Observation
from kubeloop.operator.reconcilers.common import Event, Outcome, S, backoff, finish
from kubeloop.pipelines.backends.base import RunStatus
from kubeloop.registry.base import ModelRegistry, RegistryUnavailable
from kubeloop.registry.promotion import GateResult, Verdict, check_gates, promote, superseded
from kubeloop.registry.tags import TASK

GATE_TAG = "kubeloop.gate.{alias}"


def gate(registry: ModelRegistry, model: str, version: str, policy: PromotionPolicy, metric: str | None) -> Verdict:
    """The gates' verdict for a version, computed once and kept on the version
    (so a failed gate is not re-judged, nor re-recorded, on every reconcile)."""
    alias = alias_for(policy.promote_to or "champion")
    candidate = registry.get_version(model, version)
    recorded = candidate.tags.get(GATE_TAG.format(alias=alias))
    if recorded:
        data = json.loads(recorded)
        return Verdict(data["passed"], [GateResult(**r) for r in data["results"]])
    metric = metric or PRIMARY[candidate.tags.get(TASK, "binary")]
    verdict = check_gates(policy.gates, candidate, registry.get_alias(model, alias), metric)
    registry.set_version_tag(model, version, GATE_TAG.format(alias=alias),
                             json.dumps({"passed": verdict.passed, "results": [asdict(r) for r in verdict.results]}))
    return verdict


def promote_when_gated(registry: ModelRegistry, model: str, version: str, policy: PromotionPolicy, by: str,
                       metric: str | None = None) -> Observation:
    """The Promoted condition after moving policy.promote_to to the version
    if its gates pass (and it is not there already); metric is what
    not-worse-than-champion compares (None: the version's task's primary
    metric). Reason RegistryUnavailable when the registry could not be
    reached."""
    try:
        return _promote_when_gated(registry, model, version, policy, by, metric)
    except RegistryUnavailable as exc:
        return Observation(ConditionType.PROMOTED, "Unknown", Reason.REGISTRY_UNAVAILABLE, str(exc))


def _promote_when_gated(registry: ModelRegistry, model: str, version: str, policy: PromotionPolicy, by: str,
                        metric: str | None) -> Observation:
    alias = alias_for(policy.promote_to)
    current = registry.get_alias(model, alias)
    if current is not None and current.version == version:
        return Observation(ConditionType.PROMOTED, "True", Reason.PROMOTED, f"{model} version {version} is {alias}")
    later = superseded(registry, model, version, alias, by)
    if later is not None:
        return Observation(ConditionType.PROMOTED, "True", Reason.PROMOTED,
                           f"{model} version {version} was made {alias}; {later.by} has since moved it to "
                           f"version {later.version} ({later.action})")
    verdict = gate(registry, model, version, policy, metric)
    if not verdict.passed:
        return Observation(ConditionType.PROMOTED, "False", Reason.GATE_FAILED, verdict.summary())
    promote(registry, model, version, alias, by=by, reason="every promotion gate passed", verdict=verdict)
    return Observation(ConditionType.PROMOTED, "True", Reason.PROMOTED,
                       f"{model} version {version} is {alias}: {verdict.summary()}")


def registered_model(run: RunStatus) -> tuple[RegisteredModel | None, Observation]:
    """The version a run registered, with the ModelRegistered condition:
    awaited until the run succeeded; a run that succeeded without reporting
    one failed at what it was for."""
    if run.phase != "Succeeded":
        return None, Observation(ConditionType.MODEL_REGISTERED, "Unknown", Reason.AWAITING_RUN, "")
    model = run.outputs.get("model")
    if not model:
        return None, Observation(ConditionType.MODEL_REGISTERED, "False", Reason.NO_MODEL,
                                 "the run succeeded but reported no registered model")
    return (RegisteredModel.model_validate({**model, "version": str(model["version"])}),
            Observation(ConditionType.MODEL_REGISTERED, "True", Reason.REGISTERED,
                        f"{model['name']} version {model['version']}"))


def record_run(ref: ObjectRef, status: S, run: RunStatus, registry: ModelRegistry, attempt: int, *,
               required: list[str], observations: list[Observation], fields: dict, registers: bool,
               policy: PromotionPolicy | None, metric: str | None, events: list[Event] | None = None) -> Outcome[S]:
    """A pipeline-backed object's status for its run: the run's phase, the
    model it registered (where the backend registers models), promoted to
    policy.promote_to when its gates pass (metric: as promote_when_gated's).
    The registry out of reach is retried soon, without the events."""
    phase = {"Succeeded": "Succeeded", "Failed": "Failed"}.get(run.phase, "Running")
    model = None
    if registers:
        model, registered = registered_model(run)
        observations = [*observations, registered]
        if model is not None:
            fields = {**fields, "model": model}
        elif registered.reason == Reason.NO_MODEL:
            phase = "Failed"
    if phase == "Succeeded" and model is not None and policy and policy.promote_to:
        promoted = promote_when_gated(registry, model.name, model.version, policy, by=str(ref), metric=metric)
        observations = [*observations, promoted]
        if promoted.reason == Reason.REGISTRY_UNAVAILABLE:
            return Outcome(finish(status, observations, ref.generation, required, phase=phase, **fields),
                           retry_after=backoff(attempt), retry_reason=promoted.message)
    return Outcome(finish(status, observations, ref.generation, required, phase=phase, **fields), events or [])
