"""Kubernetes-style conditions (pure).

A reconciler reports each aspect of an object as a condition; the Ready
condition and the phase are derived from them, never set by hand.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, Literal

from kubeloop.api.base import Condition
from kubeloop.api.conditions import ConditionType, Reason
from kubeloop.api.times import iso

Status = Literal["True", "False", "Unknown"]


@dataclass(frozen=True)
class Observation:
    """What a reconciler concluded about one condition type."""

    type: str
    status: Status
    reason: str
    message: str = ""


def now() -> str:
    return iso(time.time())


def merge_conditions(current: Iterable[Condition], observed: Iterable[Observation],
                     generation: int, timestamp: str) -> list[Condition]:
    """The new condition list: observed types replace current ones, keeping
    lastTransitionTime when the status did not change; other types are kept."""
    by_type = {c.type: c for c in current}
    for obs in observed:
        previous = by_type.get(obs.type)
        changed = previous is None or previous.status != obs.status
        by_type[obs.type] = Condition(
            type=obs.type, status=obs.status, reason=obs.reason, message=obs.message[:32768],
            last_transition_time=timestamp if changed else previous.last_transition_time,
            observed_generation=generation,
        )
    return sorted(by_type.values(), key=lambda c: (c.type != ConditionType.READY, c.type))


def ready_condition(conditions: Iterable[Condition], required: Iterable[str]) -> Observation:
    """Ready is True when every required condition is True; otherwise it
    carries the reason and message of the first that is not."""
    by_type = {c.type: c for c in conditions}
    for name in required:
        cond = by_type.get(name)
        if cond is None:
            return Observation(ConditionType.READY, "Unknown", Reason.PENDING, f"{name} not yet observed")
        if cond.status != "True":
            return Observation(ConditionType.READY, "False" if cond.status == "False" else "Unknown",
                               cond.reason, f"{name}: {cond.message}")
    return Observation(ConditionType.READY, "True", Reason.READY, "")


def condition(conditions: Iterable[Condition], name: str) -> Condition | None:
    return next((c for c in conditions if c.type == name), None)


def is_true(conditions: Iterable[Condition], name: str) -> bool:
    cond = condition(conditions, name)
    return cond is not None and cond.status == "True"
