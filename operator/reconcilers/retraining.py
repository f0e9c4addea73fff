"""Drift -> retrain -> optimise -> gate -> canary -> promote, as steps an
InferenceService's reconcile advances from whatever state it finds.

The state lives in the InferenceService's status and in the children it
creates (deterministically named, so a restart or a redelivered alert finds
them instead of creating more); every step reads the children's and the
registry's actual state.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from kubeloop.api.conditions import ConditionType, Reason
from kubeloop.api.constants import ANNOTATION_DRIFT_ALERT as DRIFT_ALERT
from kubeloop.api.constants import API_VERSION
from kubeloop.api.promotion import alias_for
from kubeloop.api.refs import ObjectRef
from kubeloop.api.serving import InferenceServiceSpec, InferenceServiceStatus, RetrainingStatus
from kubeloop.api.times import epoch, instant, iso, seconds
from kubeloop.operator.builders.retraining import (
    LABEL_RETRAIN_OF, build_retrain_job, build_retrain_optimization, retrain_name,
)
from kubeloop.operator.conditions import Observation, condition
from kubeloop.operator.ports import Ports
from kubeloop.operator.reconcilers.promotion import gate
from kubeloop.registry.promotion import promote, reject

FINAL = ("Promoted", "GateFailed", "RolledBack", "Failed")
HANDLED_LIMIT = 64


@dataclass
class RetrainStep:
    """What the retraining step changes on the InferenceService."""

    retraining: RetrainingStatus | None
    retrains: list[str]
    handled_alerts: list[str]
    last_retrain_at: str | None
    observations: list[Observation] = field(default_factory=list)

    def canary(self) -> str | None:
        """The challenger version to canary now, if any."""
        r = self.retraining
        return r.challenger if r and r.state == "Canary" else None


class InvalidAlert(ValueError):
    """The drift-alert annotation is not what the webhook writes (a hand edit)."""


def pending_alert(ref: ObjectRef) -> str | None:
    raw = ref.annotations.get(DRIFT_ALERT)
    if not raw:
        return None
    try:
        alert = json.loads(raw)
    except ValueError as exc:
        raise InvalidAlert(f"annotation {DRIFT_ALERT} is not JSON ({exc}); the webhook writes a JSON object "
                           "with fingerprint and startsAt: fix or remove it") from None
    if not isinstance(alert, dict):
        raise InvalidAlert(f"annotation {DRIFT_ALERT} is a JSON {type(alert).__name__}, not the object with "
                           "fingerprint and startsAt the webhook writes: fix or remove it")
    starts_at = alert.get("startsAt", "")
    try:
        starts_at = instant(starts_at)
    except ValueError:
        pass  # written by hand, not by the webhook: the text itself is the key
    return f"{alert.get('fingerprint', '')}@{starts_at}"


def alert_reason(ref: ObjectRef) -> str:
    """The alert that the pending annotation records (KubeloopDataDrift when
    the webhook that wrote it named none)."""
    try:
        alert = json.loads(ref.annotations.get(DRIFT_ALERT) or "{}")
    except ValueError:
        return "KubeloopDataDrift"
    return str(alert.get("alertname") or "KubeloopDataDrift") if isinstance(alert, dict) else "KubeloopDataDrift"


def advance_retraining(ref: ObjectRef, spec: InferenceServiceSpec, status: InferenceServiceStatus,
                       ports: Ports) -> RetrainStep:
    now = ports.clock()
    step = RetrainStep(status.retraining, list(status.retrains), list(status.handled_alerts), status.last_retrain_at)
    try:
        alert = pending_alert(ref)
        if condition(status.conditions, ConditionType.DRIFT_ALERT) is not None:  # it was invalid: say it is fixed
            step.observations.append(Observation(ConditionType.DRIFT_ALERT, "True", Reason.VALID, alert or ""))
    except InvalidAlert as exc:
        alert = None
        step.observations.append(Observation(ConditionType.DRIFT_ALERT, "False", Reason.INVALID_ANNOTATION, str(exc)))
    if alert and alert not in step.handled_alerts:
        _consider(ref, spec, step, alert, now, ports)
    # As many steps as the world allows now (a finished TrainingJob whose
    # version passes its gates goes straight on to its canary).
    for _ in range(len(FINAL) + 4):
        if not step.retraining or step.retraining.state in FINAL:
            break
        advanced = _advance(ref, spec, status, step.retraining, now, ports)
        if advanced == step.retraining:
            break
        step.retraining = advanced
    if step.retraining:
        r = step.retraining
        good = r.state in ("Promoted",) or r.state not in FINAL
        step.observations.append(Observation(ConditionType.RETRAINING, "True" if good else "False", r.state, r.message))
    return step


def _consider(ref: ObjectRef, spec: InferenceServiceSpec, step: RetrainStep, alert: str, now: float,
              ports: Ports) -> None:
    """Start a retrain for a new drift alert, or set it aside and say why."""
    retraining = spec.retraining
    step.handled_alerts = (step.handled_alerts + [alert])[-HANDLED_LIMIT:]
    name = retrain_name(ref, alert)
    started = ports.objects.get(API_VERSION, "TrainingJob", name, ref.namespace)
    if started:
        # This alert's job exists, though the status does not say so (written by a
        # reconcile that raced this one, or lost): take it up again, start nothing.
        _start(step, alert, name, started["metadata"].get("creationTimestamp") or iso(now), alert_reason(ref))
        return
    reason = None
    if step.retraining and step.retraining.state not in FINAL:
        reason = f"retrain {step.retraining.training_job} is still {step.retraining.state}"
    elif step.last_retrain_at and now - epoch(step.last_retrain_at) < seconds(retraining.cooldown):
        until = iso(epoch(step.last_retrain_at) + seconds(retraining.cooldown))
        reason = f"cooling down until {until} (cooldown {retraining.cooldown})"
    else:
        running = [j for j in ports.objects.list(API_VERSION, "TrainingJob", ref.namespace,
                                                 f"{LABEL_RETRAIN_OF}={ref.name}")
                   if j.get("status", {}).get("phase") not in ("Succeeded", "Failed")]
        if len(running) >= retraining.max_concurrent:
            reason = f"{len(running)} retrain(s) running (maxConcurrent {retraining.max_concurrent})"
    if reason:
        step.observations.append(Observation(ConditionType.RETRAIN_SUPPRESSED, "True", Reason.SUPPRESSED,
                                             f"drift alert {alert}: {reason}"))
        return
    ports.objects.apply(build_retrain_job(ref, spec, name, now))
    _start(step, alert, name, iso(now), alert_reason(ref))


def _start(step: RetrainStep, alert: str, name: str, at: str, reason: str) -> None:
    if name not in step.retrains:
        step.retrains = (step.retrains + [name])[-HANDLED_LIMIT:]
    step.last_retrain_at = at
    step.retraining = RetrainingStatus(state="Training", alert=alert, training_job=name, reason=reason,
                                       message=f"{reason} alert {alert} started TrainingJob {name}")
    step.observations.append(Observation(ConditionType.RETRAIN_SUPPRESSED, "False", Reason.STARTED,
                                         f"TrainingJob {name}"))


def _child(ports: Ports, kind: str, name: str, namespace: str) -> dict:
    return (ports.objects.get(API_VERSION, kind, name, namespace) or {}).get("status", {})


def _advance(ref: ObjectRef, spec: InferenceServiceSpec, status: InferenceServiceStatus, r: RetrainingStatus,
             now: float, ports: Ports) -> RetrainingStatus:
    retraining = spec.retraining
    model = spec.model.name
    by = f"InferenceService {ref.namespace}/{ref.name}"
    if r.state == "Training":
        job = _child(ports, "TrainingJob", r.training_job, ref.namespace)
        if job.get("phase") == "Failed":
            return r.model_copy(update={"state": "Failed", "message": f"TrainingJob {r.training_job} failed"})
        if job.get("phase") != "Succeeded" or not job.get("model"):
            return r
        version = job["model"]["version"]
        if retraining.optimization:
            name = f"{r.training_job}-opt"
            ports.objects.apply(build_retrain_optimization(ref, spec, name, version))
            return r.model_copy(update={"state": "Optimizing", "optimized_model": name,
                                        "message": f"version {version} trained; optimising in {name}"})
        return r.model_copy(update={"state": "Gating", "challenger": version,
                                    "message": f"version {version} trained"})
    if r.state == "Optimizing":
        om = _child(ports, "OptimizedModel", r.optimized_model, ref.namespace)
        if om.get("phase") == "Failed":
            return r.model_copy(update={"state": "Failed", "message": f"OptimizedModel {r.optimized_model} failed"})
        if om.get("phase") != "Succeeded" or not om.get("model"):
            return r
        return r.model_copy(update={"state": "Gating", "challenger": om["model"]["version"],
                                    "message": f"optimised: {om.get('chosen', {}).get('technique', '?')} is version "
                                               f"{om['model']['version']}"})
    if r.state == "Gating":
        policy = retraining.promotion
        verdict = gate(ports.registry, model, r.challenger, policy, retraining.template.tuning.metric)
        if not verdict.passed:
            reject(ports.registry, model, r.challenger, policy.promote_to or "champion", by=by,
                   reason="promotion gates failed", verdict=verdict)
            return r.model_copy(update={"state": "GateFailed", "message": verdict.summary()})
        ports.registry.set_alias(model, alias_for(policy.register_as), r.challenger)
        return r.model_copy(update={"state": "Canary", "canary_since": iso(now),
                                    "message": f"gates passed ({verdict.summary()}); rolling out"})
    if r.state == "Canary":
        return _judged(r, status, model, retraining.promotion.promote_to or "champion", by, ports)
    return r


def _judged(r: RetrainingStatus, status: InferenceServiceStatus, model: str, alias: str, by: str,
            ports: Ports) -> RetrainingStatus:
    """The challenger's rollout decides: promoted after its last step passed,
    rolled back when it failed readiness or a step's analysis."""
    if status.rolled_back_version == r.challenger:
        reject(ports.registry, model, r.challenger, alias, by=by, reason="the canary failed readiness and was rolled back")
        return r.model_copy(update={"state": "RolledBack",
                                    "message": f"version {r.challenger} failed its canary; the champion stays"})
    rollout = status.rollout
    if rollout is None or rollout.challenger != r.challenger:
        return r
    if rollout.phase == "Aborted":
        reject(ports.registry, model, r.challenger, alias, by=by, reason=f"rollout aborted: {rollout.message}")
        return r.model_copy(update={"state": "RolledBack", "message": f"version {r.challenger} {rollout.message}; "
                                                                       "the champion stays"})
    if rollout.phase == "Promoted":
        promote(ports.registry, model, r.challenger, alias, by=by, reason=f"retrain ({r.reason or 'drift'}); "
                                                                          f"{rollout.message}")
        return r.model_copy(update={"state": "Promoted", "message": f"version {r.challenger} promoted to "
                                                                    f"{alias_for(alias)}: {rollout.message}"})
    return r
