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

The same thread looks again at objects waiting on their backend (Pods
starting, a model loading): 1 s after the reconcile that found them waiting,
then 2, 4, 8 and every 10 s, and at once when one of their Pods changes (the
operator's Pod watch pokes them). kopf's retries did this before: at each
try kopf wrote its retry state onto the object, and 5,000 services waiting
on their Pods made 100 PATCHes a second for half an hour.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable

log = logging.getLogger("kubeloop.operator")

WAIT_SECONDS = (1.0, 10.0)
"""A waiting object's first look again and the longest gap between looks."""


def _wait(waits: int) -> float:
    first, longest = WAIT_SECONDS
    return min(longest, first * 2 ** max(0, waits))


def _named(meta: dict) -> dict:
    return {k: meta[k] for k in ("name", "namespace", "uid")}


class ResyncPace:
    def __init__(self, seconds: float, per_second: float, clock: Callable[[], float] = time.monotonic):
        self.seconds = seconds
        self.per_second = per_second
        self.clock = clock
        self._steady: dict[str, tuple[dict, float]] = {}
        """uid -> (name, namespace and uid, when last reconciled or taken), least recent first:
        an entry is removed before it is put back, so insertion order is time order."""
        self._waiting: dict[str, tuple[dict, float, int]] = {}
        """uid -> (name, namespace and uid, when to look again, how many looks found it waiting)."""
        self._poked: dict[str, dict] = {}
        """Known objects to look at next, ahead of any other."""
        self._uids: dict[tuple[str, str], str] = {}
        """(namespace, name) -> uid of every steady or waiting object, for pokes by name."""
        self._lock = threading.Lock()

    def interval(self) -> float:
        """How often each steady object is resynced now."""
        return max(self.seconds, len(self._steady) / self.per_second)

    def reconciled(self, meta: dict, steady: bool, waiting: bool = False) -> None:
        """The object was just reconciled: steady or not now, waiting on its backend or not."""
        uid, named, now = meta["uid"], _named(meta), self.clock()
        with self._lock:
            self._steady.pop(uid, None)
            if steady:
                self._steady[uid] = (named, now)
            if waiting:
                waits = self._waiting[uid][2] + 1 if uid in self._waiting else 0
                self._waiting[uid] = (named, now + _wait(waits), waits)
            else:
                self._waiting.pop(uid, None)
            if steady or waiting:
                self._uids[(named["namespace"], named["name"])] = uid
            else:
                self._uids.pop((named["namespace"], named["name"]), None)

    def poke(self, namespace: str, name: str) -> None:
        """Something the object depends on changed (one of its Pods): look
        at it next, and if it still waits, again a second later."""
        with self._lock:
            uid = self._uids.get((namespace, name))
            if uid is None:
                return  # not known here: kopf's handlers have it
            if uid in self._waiting:
                named, due, _ = self._waiting[uid]
                self._waiting[uid] = (named, due, -1)
            else:
                named = self._steady[uid][0]
            self._poked[uid] = named

    def forget(self, uid: str) -> None:
        with self._lock:
            named = (self._steady.pop(uid, None) or self._waiting.pop(uid, None) or (None,))[0]
            self._waiting.pop(uid, None)
            self._poked.pop(uid, None)
            if named is not None:
                self._uids.pop((named["namespace"], named["name"]), None)

    def tracks(self, uid: str) -> bool:
        """Whether the resync thread looks at the object (steady or waiting)."""
        with self._lock:
            return uid in self._steady or uid in self._waiting

    def steady(self) -> int:
        return len(self._steady)

    def waiting(self) -> int:
        return len(self._waiting)

    def take_due(self, limit: int) -> list[dict]:
        """Up to `limit` objects to look at: the poked, then the waiting
        whose time has come (the longest due first), then the steady not
        reconciled for an interval (least recent first). Each is taken as if
        looked at now: one whose resync fails comes round again later, not at once."""
        with self._lock:
            now = self.clock()
            due = dict(list(self._poked.items())[:limit])
            for uid in due:
                del self._poked[uid]
            waited = sorted((when, uid) for uid, (_, when, _) in self._waiting.items() if when <= now)
            for _, uid in waited[:max(0, limit - len(due))]:
                due.setdefault(uid, self._waiting[uid][0])
            for uid in due:
                if uid in self._waiting:
                    named, _, waits = self._waiting[uid]
                    self._waiting[uid] = (named, now + WAIT_SECONDS[1], waits)
            self._take_steady(due, limit, now)
            return list(due.values())

    def _take_steady(self, due: dict[str, dict], limit: int, now: float) -> None:
        cutoff = now - self.interval()
        for uid, (named, last) in self._steady.items():
            if len(due) >= limit or last > cutoff:
                break
            due.setdefault(uid, named)
        for uid in due:
            if uid in self._steady:
                self._steady[uid] = (self._steady.pop(uid)[0], now)


class ResyncThread:
    """The thread that resyncs steady and waiting objects: every second, the due ones
    (at most per_second) on `workers` threads, the next second's only once
    these are done, so a slow API server slows the resyncs instead of
    queueing them."""

    def __init__(self, pace: ResyncPace, resync: Callable[[dict], None], workers: int = 4):
        self.pace, self.resync, self.workers = pace, resync, workers
        self._stop = threading.Event()
        self._context: contextvars.Context | None = None
        self._starting = threading.Lock()

    def start(self, context: contextvars.Context | None = None) -> "ResyncThread":
        """Start the thread, once; each resync runs in a copy of `context`
        (by default the caller's). kopf keeps its event queue in context
        variables of the handlers it runs, and a new thread starts with none:
        started from a handler, resyncs can post events as the handler does."""
        with self._starting:
            if self._context is None:
                self._context = context or contextvars.copy_context()
                threading.Thread(target=self._run, name="resync", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        allowance = 0.0
        """Resyncs owed: per_second more each second, so a budget under one a second still resyncs."""
        with ThreadPoolExecutor(self.workers, thread_name_prefix="resync") as pool:
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
