"""An InferenceService judged by its outcomes: the outcome job started when
due (late labels joined to logged predictions), what its latest run found
as status.performance, and the rollout of a challenger advanced on what
the front measured and on the labels that arrived."""

from __future__ import annotations

import math

from kubeloop.api.conditions import ConditionType, Reason
from kubeloop.api.constants import ANNOTATION_ROLLOUT
from kubeloop.api.outcomes import LiveMetric, PerformanceStatus, Rollout, RolloutStatus, RolloutStep
from kubeloop.api.refs import ObjectRef
from kubeloop.api.serving import InferenceServiceSpec
from kubeloop.api.signature import ModelSignature
from kubeloop.api.tasks import METRICS, PRIMARY, produces
from kubeloop.api.times import epoch, iso, seconds
from kubeloop.monitoring.outcomes.sequential import Stream
from kubeloop.monitoring.outcomes.traffic import AnalysisUnavailable
from kubeloop.operator.conditions import Observation
from kubeloop.operator.ports import Ports
from kubeloop.operator.reconcilers import rollout as rollouts
from kubeloop.registry.base import ModelVersion
from kubeloop.registry.promotion import metrics_of
from kubeloop.serving.base import ServedVersion, ServingBackend

CONDITION = ConditionType.OUTCOMES_MONITORED


def judged_metric(spec: InferenceServiceSpec, task: str) -> str:
    """The metric outcomes are judged on: the spec's, else the task's primary;
    a metric the task does not produce is an invalid spec (ValueError)."""
    metric = spec.monitoring.performance.metric or PRIMARY[task]
    if not produces(task, metric):
        raise ValueError(f"spec.monitoring.performance.metric {metric!r} is not a {task} metric: use one of "
                         f"{', '.join(METRICS[task])}")
    return metric


def observe_outcomes(ref: ObjectRef, spec: InferenceServiceSpec, versions: list[ServedVersion],
                     pair: tuple[str, str] | None, backend: ServingBackend,
                     ports: Ports) -> tuple[PerformanceStatus | None, list[Observation]]:
    """Start the outcome job when it is due; report what the latest one found."""
    monitoring = spec.monitoring
    if monitoring is None or monitoring.ground_truth is None:
        return None, []
    if ports.outcomes is None:
        return None, [Observation(CONDITION, "False", Reason.NO_MONITOR, "the operator runs no outcome jobs")]
    log = backend.request_log(ref, spec)
    if log is None:
        return None, [Observation(CONDITION, "False", Reason.NO_REQUEST_LOG, "labels join logged predictions: enable "
                                  "spec.requestLogging")]
    primary = versions[0].model
    signature = ModelSignature.from_tags(primary.tags)
    try:
        metric = judged_metric(spec, signature.task)
    except ValueError as exc:
        return None, [Observation(CONDITION, "False", Reason.INVALID_SPEC, str(exc))]
    latest = ports.outcomes.latest(ref)
    due = latest is None or ports.clock() - latest.get("at", 0) >= seconds(monitoring.performance.schedule)
    if due and not ports.outcomes.running(ref):
        ports.outcomes.start(ref, outcome_job(ref, spec, versions, pair, log, metric, signature))
    return performance(latest, spec)


def outcome_job(ref: ObjectRef, spec: InferenceServiceSpec, versions: list[ServedVersion],
                pair: tuple[str, str] | None, log: str, metric: str, signature: ModelSignature) -> dict:
    """What the outcome job judges (kubeloop.monitoring.outcomes.job.OutcomeJob)."""
    truth, performance_spec = spec.monitoring.ground_truth, spec.monitoring.performance
    return {
        "service": f"{ref.namespace}/{ref.name}", "model": versions[0].model.name, "task": signature.task,
        "metric": metric, "request_log": log, "labels": truth.location,
        "ground_truth": {"key_column": truth.key_column, "row_column": truth.row_column,
                         "label_column": truth.label_column, "timestamp_column": truth.timestamp_column,
                         "max_delay_seconds": seconds(truth.max_delay),
                         "sample_rate": spec.request_logging.sample_rate},
        "window_seconds": seconds(performance_spec.window), "min_rows": performance_spec.min_rows,
        "max_drop": performance_spec.max_drop,
        "versions": {v.model.version: {"role": v.role, "trained": _trained(v.model, metric)}
                     for v in versions if v.role != "shadow"},
        "threshold": signature.threshold if signature.threshold is not None else 0.5,
        "classes": list(signature.classes), "pair": list(pair) if pair else [],
    }


def _trained(version: ModelVersion, metric: str) -> float | None:
    value = metrics_of(version).get(metric)
    return value if value is not None and math.isfinite(value) else None


def performance(latest: dict | None, spec: InferenceServiceSpec) -> tuple[PerformanceStatus, list[Observation]]:
    """status.performance and its condition from the latest result."""
    if latest is None:
        message = "the first outcome job is running"
        return PerformanceStatus(message=message), [Observation(CONDITION, "Unknown", Reason.FIRST_RUN, message)]
    at = iso(latest["at"])
    if "error" in latest:
        return PerformanceStatus(last_run_at=at, message=latest["error"]), [
            Observation(CONDITION, "False", Reason.OUTCOME_JOB_FAILED, latest["error"])]
    live = [_live(version, entry) for version, entry in latest.get("versions", {}).items()]
    status = PerformanceStatus(last_run_at=at, metric=latest.get("metric"), versions=live,
                               labels=latest.get("labels", {}), decayed=decayed(latest, spec),
                               report=latest.get("report"))
    primary = next((m for m in live if m.role == "primary"), None)
    if primary is None or primary.rows < spec.monitoring.performance.min_rows:
        rows = primary.rows if primary else 0
        message = f"{rows} labelled predictions of the primary (at least {spec.monitoring.performance.min_rows})"
        return status.model_copy(update={"message": message}), [
            Observation(CONDITION, "Unknown", Reason.NOT_ENOUGH_LABELS, message)]
    summary = (f"{status.metric} {primary.value:.4g} [{primary.low:.4g}, {primary.high:.4g}] over {primary.rows} "
               f"labelled predictions of version {primary.version} (trained: {primary.trained})")
    verdict = Reason.DECAYED if status.decayed else Reason.HOLDING
    return status, [Observation(CONDITION, "True", verdict, summary)]


def _live(version: str, entry: dict) -> LiveMetric:
    live = entry.get("live") or {}
    return LiveMetric(version=version, role=entry.get("role", "primary"), rows=entry.get("rows", 0),
                      value=live.get("value"), low=live.get("low"), high=live.get("high"),
                      trained=entry.get("trained"))


def decayed(latest: dict, spec: InferenceServiceSpec) -> bool:
    """What KubeloopConceptDrift fires on: the primary's drop clear of maxDrop
    with confidence, over enough labelled rows."""
    performance_spec = spec.monitoring.performance
    for entry in latest.get("versions", {}).values():
        low = (entry.get("drop") or {}).get("low")
        if entry.get("role") == "primary" and low is not None and entry.get("rows", 0) >= performance_spec.min_rows:
            return low > performance_spec.max_drop
    return False


# -- rollouts ---------------------------------------------------------------

def rollout_of(spec: InferenceServiceSpec, retrained: bool) -> Rollout | None:
    """The rollout a challenger goes through: spec.rollout, else for a
    retrained version one step at the retraining's canary share."""
    if spec.rollout is not None:
        return spec.rollout
    if retrained:
        return Rollout(steps=[RolloutStep(weight=max(1, spec.retraining.canary_percent),
                                          duration=spec.retraining.canary_duration)])
    return None


def advance_rollout(ref: ObjectRef, rollout: Rollout, current: RolloutStatus | None, champion: str,
                    challenger: str, ports: Ports, serving: bool = True) -> RolloutStatus:
    """The rollout of this challenger, one reconcile further (serving:
    whether the challenger answered its share at the last look)."""
    now = ports.clock()
    action = ref.annotations.get(ANNOTATION_ROLLOUT)
    if current is None or current.challenger != challenger:
        return rollouts.start(rollout, champion, challenger, now, action)
    if current.phase in rollouts.FINAL:
        return current
    evidence = rollouts.Evidence(traffic=_traffic(ref, current, now, ports), losses=_losses(current, ports, ref))
    return rollouts.advance(rollout, current, evidence, now, action, serving)


def _traffic(ref: ObjectRef, current: RolloutStatus, now: float, ports: Ports):  # noqa: ANN202
    if ports.traffic is None:
        return None
    try:
        return ports.traffic.sample(f"{ref.namespace}/{ref.name}", current.champion, current.challenger,
                                    now - epoch(current.step_started_at), rollouts.LATENCY_SETTLE)
    except AnalysisUnavailable:
        return None


def _losses(current: RolloutStatus, ports: Ports, ref: ObjectRef) -> rollouts.PairedLosses | None:
    latest = ports.outcomes.latest(ref) if ports.outcomes else None
    pairs = (latest or {}).get("pairs")
    if not pairs or (pairs["champion"], pairs["challenger"]) != (current.champion, current.challenger):
        return None
    return rollouts.PairedLosses(**{arm: Stream(**stream) for arm, stream in pairs["losses"].items()})


def rollout_observation(status: RolloutStatus) -> Observation:
    good = status.phase != "Aborted"
    return Observation(ConditionType.ROLLOUT_HEALTHY, "True" if good else "False", status.phase, status.message)
