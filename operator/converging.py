"""One reconcile of one object: parse its spec and status, call its
reconciler, write the status that changed; one at a time per object, from
the object as it is now (kopf-free but for its retry signal; the handlers
call it)."""

from __future__ import annotations

import copy
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

import kopf
from pydantic import BaseModel, ValidationError

from kubeloop.api.conditions import ConditionType, Reason
from kubeloop.api.refs import ObjectRef
from kubeloop.api.resources import Kind
from kubeloop.operator.conditions import Observation, merge_conditions, now
from kubeloop.kube import KubeError
from kubeloop.operator.ports import Objects, Ports
from kubeloop.operator.reconcilers.common import Event, Outcome, transition_events

Reconciler = Callable[..., Outcome]


class ObjectLocks:
    """A lock per object, for reconciles that run in kopf's thread pool."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    def of(self, uid: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(uid, threading.Lock())

    @contextmanager
    def last(self, uid: str) -> Iterator[None]:
        """Hold the object's lock for the last time (its deletion), then forget it."""
        with self.of(uid):
            yield
        with self._guard:
            self._locks.pop(uid, None)


def converge(kind: Kind, reconciler: Reconciler, meta: dict, ports: Ports, locks: ObjectLocks,
             retry: int = 0) -> Outcome | None:
    """Reconcile the object under its lock, and write its status before
    letting go. None when it is gone, or being deleted (a reconcile now would
    start again what the delete handler just stopped).

    kopf hands a handler the body it had when it queued it, and runs timers
    beside change handlers: a reconcile that held the lock meanwhile may have
    written status since. So it starts from the object as it is now, and the
    next reconcile starts from what this one wrote."""
    with locks.of(meta["uid"]):
        latest = _read(ports.objects, kind, meta)
        if latest is None or latest["metadata"].get("deletionTimestamp"):
            return None
        meta, status = latest["metadata"], latest.get("status")
        outcome = reconcile(kind, reconciler, meta, latest.get("spec", {}), status, ports, retry)
        _write_status(ports.objects, kind, meta, status_changes(status, outcome.status.to_wire()))
    return outcome


def reconcile(kind: Kind, reconciler: Reconciler, meta: dict, spec: dict, status: dict | None,
              ports: Ports, retry: int = 0) -> Outcome:
    """Parse, reconcile, and map an invalid spec to a condition (no handler I/O)."""
    ref = ObjectRef.from_meta(kind.kind, meta)
    current, dropped = parse_status(kind, status)
    try:
        parsed = kind.spec.model_validate(spec)
    except ValidationError as exc:
        message = "; ".join(
            f"spec.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors())
        invalid = Observation(ConditionType.READY, "False", Reason.INVALID_SPEC, message)
        conditions = merge_conditions(current.conditions, [invalid], ref.generation, now())
        new = current.model_copy(update={"conditions": conditions, "phase": "Failed",
                                         "observed_generation": ref.generation})
        return Outcome(new, [Event("Warning", Reason.INVALID_SPEC, message)])
    outcome = reconciler(ref, parsed, current, ports, attempt=retry)
    if dropped:
        message = (f"status fields that failed validation were reset: {', '.join(dropped)}; "
                   "everything else was kept")
        reset = Observation(ConditionType.STATUS_VALID, "False", Reason.INVALID_STATUS, message)
        conditions = merge_conditions(outcome.status.conditions, [reset], ref.generation, now())
        outcome.status = outcome.status.model_copy(update={"conditions": conditions})
    outcome.events = outcome.events + transition_events(kind.kind, current, outcome.status)
    return outcome


def parse_status(kind: Kind, status: dict | None) -> tuple[BaseModel, list[str]]:
    """The typed status, and the fields left out because they failed validation
    (a hand edit, a status written by another version): each bad field or list
    item goes, the rest is kept (a retrain in its canary survives a bad
    readyReplicas)."""
    data = copy.deepcopy(status or {})
    dropped: list[str] = []
    for _ in range(64):
        try:
            return kind.status.model_validate(data), dropped
        except ValidationError as exc:
            removed = [path for err in exc.errors() if (path := _remove(data, err["loc"]))]
        if not removed:
            break
        dropped += [p for p in removed if p not in dropped]
    return kind.status(), dropped + ["(the rest)"]


def _remove(data: dict, loc: tuple) -> str | None:
    """Delete what loc points at, or the nearest thing above it that exists (a
    missing required field takes its parent); a list item goes whole (a
    condition without its status means nothing). Its path, or None."""
    index = next((i for i, key in enumerate(loc) if isinstance(key, int)), None)
    deepest = len(loc) if index is None else index + 1
    for depth in range(deepest, 0, -1):
        parent = data
        try:
            for key in loc[:depth - 1]:
                parent = parent[key]
            del parent[loc[depth - 1]]
        except (KeyError, IndexError, TypeError):
            continue
        return "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in loc[:depth]).lstrip(".")
    return None


def status_changes(old: dict | None, new: dict) -> dict:
    """The status fields that changed, as a merge patch: removed ones as
    None, which the patch deletes, at any depth (a merge patch merges nested
    objects, so a field dropped from one, like drift.message after a run that
    evaluated, would otherwise stay)."""
    old = old or {}
    changes = {}
    for key, value in new.items():
        before = old.get(key)
        if before == value:
            continue
        nested = isinstance(value, dict) and isinstance(before, dict)
        changes[key] = status_changes(before, value) if nested else value
    changes.update({key: None for key in old if key not in new and old[key] is not None})
    return changes


def _read(objects: Objects, kind: Kind, meta: dict) -> dict | None:
    try:
        return objects.get(kind.api_version, kind.kind, meta["name"], meta["namespace"])
    except KubeError as exc:
        raise kopf.TemporaryError(f"reading {kind.kind} {meta['name']}: {exc}", delay=5) from None


def _write_status(objects: Objects, kind: Kind, meta: dict, changes: dict) -> None:
    if not changes:
        return
    try:
        objects.merge_patch(kind.api_version, kind.kind, meta["name"], {"status": changes}, meta["namespace"],
                            subresource="status")
    except KubeError as exc:
        raise kopf.TemporaryError(f"writing the status of {kind.kind} {meta['name']}: {exc}", delay=5) from None
