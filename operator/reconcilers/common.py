"""What every reconciler returns, and the pipeline-run bookkeeping that
TrainingJob and OptimizedModel share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Generic, Literal, TypeVar

from kubeloop.api.base import BaseStatus
from kubeloop.api.conditions import ConditionType, Reason
from kubeloop.operator.conditions import Observation, merge_conditions, now, ready_condition
from kubeloop.pipelines.backends.base import BackendUnavailable, PipelineBackend, RunRequest, RunStatus

S = TypeVar("S", bound=BaseStatus)

EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class Event:
    type: EventType
    reason: str
    message: str


@dataclass
class Outcome(Generic[S]):
    """A reconcile's result: the new status, events to post, whether to
    try again soon because something external was unavailable, and what
    the object waits for (its backend starting things: the operator looks
    again soon, kubeloop.operator.pacing)."""

    status: S
    events: list[Event] = field(default_factory=list)
    retry_after: float | None = None
    retry_reason: str = ""
    waiting: str = ""


def backoff(attempt: int, base: float = 2.0, cap: float = 300.0) -> float:
    """Exponential backoff for retries of unavailable external systems."""
    return min(cap, base * (2 ** max(0, attempt)))


def finish(status: S, observations: list[Observation], generation: int, required: list[str],
           **fields) -> S:
    """The status with merged conditions, a derived Ready, the given fields and
    the observed generation; lastTransitionTime moves only on changes."""
    timestamp = now()
    conditions = merge_conditions(status.conditions, observations, generation, timestamp)
    conditions = merge_conditions(conditions, [ready_condition(conditions, required)], generation, timestamp)
    return status.model_copy(update={**fields, "conditions": conditions, "observed_generation": generation})


def transition_events(kind: str, old: BaseStatus, new: BaseStatus) -> list[Event]:
    """Events for what changed between two statuses (pure): every condition
    whose status or reason moved, and the phase if it moved."""
    before = {c.type: (c.status, c.reason) for c in old.conditions}
    changed = [c for c in new.conditions
               if c.type != ConditionType.READY and before.get(c.type) != (c.status, c.reason)]
    events = [Event("Warning" if c.status == "False" else "Normal", c.reason,
                    f"{c.type}: {c.message}" if c.message else c.type) for c in changed]
    old_phase, new_phase = getattr(old, "phase", None), getattr(new, "phase", None)
    if old_phase != new_phase:
        warning = new_phase in ("Failed", "Degraded")
        summary = "; ".join(c.message for c in changed if c.message)
        events.append(Event("Warning" if warning else "Normal", str(new_phase),
                            f"{kind} is {new_phase}" + (f": {summary}" if summary else "")))
    return events


@dataclass(frozen=True)
class RunProgress:
    """Where a pipeline-backed object's run stands."""

    run: RunStatus | None
    observations: list[Observation]
    unavailable: str | None = None
    superseded: str | None = None


def follow_run(backend: PipelineBackend, current_run_id: str | None, current_hash: str | None,
               spec_hash: str, build_request: Callable[[], RunRequest]) -> RunProgress:
    """Find or start the run for this spec: the run recorded in status when the
    spec is unchanged, else (or if the backend lost it) the run the request
    names; a run of an older spec that is still going is cancelled."""
    superseded = None
    try:
        run = None
        if current_run_id and current_hash == spec_hash:
            run = backend.status(current_run_id)
        elif current_run_id:
            old = backend.status(current_run_id)
            if old is not None and not old.finished:
                backend.cancel(current_run_id)
                superseded = current_run_id
        if run is None:
            run = backend.submit(build_request())
    except BackendUnavailable as exc:
        obs = Observation(ConditionType.RUN_SUBMITTED, "Unknown", Reason.BACKEND_UNAVAILABLE, str(exc))
        return RunProgress(None, [obs], unavailable=str(exc))
    observations = [Observation(ConditionType.RUN_SUBMITTED, "True", Reason.SUBMITTED,
                                f"run {run.run_id} on the {backend.name} backend")]
    if run.phase == "Succeeded":
        observations.append(Observation(ConditionType.RUN_SUCCEEDED, "True", Reason.SUCCEEDED, run.progress or ""))
    elif run.phase == "Failed":
        observations.append(Observation(ConditionType.RUN_SUCCEEDED, "False", Reason.PIPELINE_FAILED,
                                        run.error or "the run failed"))
    else:
        observations.append(Observation(ConditionType.RUN_SUCCEEDED, "Unknown", run.phase, run.progress or ""))
    return RunProgress(run, observations, superseded=superseded)
