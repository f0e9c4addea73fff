"""How often a steady object is reconciled when nothing announced a change.

Every change reaches the operator through its watch and is reconciled at
once; a resync is there for what no event announces (a Pod gone, a model
registry alias moved where no webhook tells). Objects with work under way
keep kopf's timer, every resync_seconds. Steady objects have none: a kopf
timer is an asyncio task per object, and with 5,000 of them firing every
15 s the event loop spent its time waking timers that had nothing to do,
while the watch events of spec changes queued behind them. One thread
resyncs the steady objects instead, the least recently reconciled first, at
most per_second a second, each every max(resync_seconds, count / per_second)
(5,000 services at 50 a second: every 100 s).
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable

log = logging.getLogger("kubeloop.operator")


class ResyncPace:
    def __init__(self, seconds: float, per_second: float, clock: Callable[[], float] = time.monotonic):
        self.seconds = seconds
        self.per_second = per_second
        self.clock = clock
        self._steady: dict[str, tuple[dict, float]] = {}
        """uid -> (name, namespace and uid, when last reconciled or taken), least recent first:
        an entry is removed before it is put back, so insertion order is time order."""
        self._lock = threading.Lock()

    def interval(self) -> float:
        """How often each steady object is resynced now."""
        return max(self.seconds, len(self._steady) / self.per_second)

    def reconciled(self, meta: dict, steady: bool) -> None:
        """The object was just reconciled, and is steady or not now."""
        uid = meta["uid"]
        with self._lock:
            self._steady.pop(uid, None)
            if steady:
                self._steady[uid] = ({k: meta[k] for k in ("name", "namespace", "uid")}, self.clock())

    def forget(self, uid: str) -> None:
        with self._lock:
            self._steady.pop(uid, None)

    def steady(self) -> int:
        return len(self._steady)

    def take_due(self, limit: int) -> list[dict]:
        """Up to `limit` steady objects not reconciled for an interval,
        least recent first, each taken as if reconciled now: one whose
        resync fails comes round again an interval later, not at once."""
        with self._lock:
            now = self.clock()
            cutoff = now - self.interval()
            due = []
            for meta, last in self._steady.values():
                if last > cutoff or len(due) == limit:
                    break
                due.append(meta)
            for meta in due:
                del self._steady[meta["uid"]]
                self._steady[meta["uid"]] = (meta, now)
            return due


class SteadyResync:
    """The thread that resyncs steady objects: every second, the due ones
    (at most per_second) on `workers` threads, the next second's only once
    these are done, so a slow API server slows the resyncs instead of
    queueing them."""

    def __init__(self, pace: ResyncPace, resync: Callable[[dict], None], workers: int = 4):
        self.pace, self.resync, self.workers = pace, resync, workers
        self._stop = threading.Event()
        self._context: contextvars.Context | None = None
        self._starting = threading.Lock()

    def start(self, context: contextvars.Context | None = None) -> "SteadyResync":
        """Start the thread, once; each resync runs in a copy of `context`
        (by default the caller's). kopf keeps its event queue in context
        variables of the handlers it runs, and a new thread starts with none:
        started from a handler, resyncs can post events as the handler does."""
        with self._starting:
            if self._context is None:
                self._context = context or contextvars.copy_context()
                threading.Thread(target=self._run, name="steady-resync", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        allowance = 0.0
        """Resyncs owed: per_second more each second, so a budget under one a second still resyncs."""
        with ThreadPoolExecutor(self.workers, thread_name_prefix="steady-resync") as pool:
            while not self._stop.is_set():
                began = time.monotonic()
                allowance = min(allowance + self.pace.per_second, max(self.pace.per_second, 1.0))
                due = self.pace.take_due(int(allowance))
                allowance -= len(due)
                wait([pool.submit(self._one, meta) for meta in due])
                self._stop.wait(max(0.0, 1.0 - (time.monotonic() - began)))

    def _one(self, meta: dict) -> None:
        try:
            self._context.copy().run(self.resync, meta)
        except Exception as exc:  # noqa: BLE001 - one object's failure must not stop the others' resyncs
            log.warning("resync of %s/%s failed: %s", meta["namespace"], meta["name"], exc)
