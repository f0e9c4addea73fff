"""Keeping online stores fresh: the operator materialises, on a schedule,
every feature store that an InferenceService reads online features from.

The decisions (what is needed, when a store is due, how stale it is) are
pure functions of plain data; the Materializer runs them on a thread of its
own with a small pool of workers, so Feast never runs on kopf's event loop
and one store is never materialised twice at once. Its state is bounded by
what InferenceServices need now: a store no one needs is dropped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable

from kubeloop.api.conditions import Reason

log = logging.getLogger(__name__)

STALE_AFTER_INTERVALS = 3
"""The lag (in materialisation intervals) at which a store counts as stale:
two missed runs are tolerated, the third is an alert."""
RETRY_BASE_SECONDS = 2.0


@dataclass(frozen=True)
class StoreNeed:
    """What serving needs of one feature store: its location (StoreLocation
    JSON), the views read online, and how often to materialise them."""

    store: str
    views: tuple[str, ...]
    interval: float


@dataclass(frozen=True)
class Materialized:
    """What one run did: the store's Feast project, the end of each view's
    last materialised interval (Unix time; None when never materialised),
    as its registry tells after the run, and the run's error if it failed."""

    project: str
    ends: dict[str, float | None]
    error: str | None = None

    def summary(self, limit: int) -> str:
        """Compact JSON within limit bytes (a Pod's termination message): an
        error too long to fit is cut, the ends always stay."""
        data = {"project": self.project, "ends": self.ends, "error": self.error}
        text = json.dumps(data, separators=(",", ":"))
        keep = len(self.error or "")
        while len(text.encode()) > limit and keep > 0:
            keep = max(0, keep - (len(text.encode()) - limit) - 3)
            data["error"] = self.error[:keep] + "..."
            text = json.dumps(data, separators=(",", ":"))
        return text

    @classmethod
    def from_summary(cls, text: str) -> "Materialized":
        data = json.loads(text)
        return cls(data["project"], dict(data["ends"]), data.get("error"))


def store_key(store: str) -> str:
    """A short stable name for a store location (its JSON can hold a whole
    feature_store.yaml): its metrics' label, its Jobs' name and label."""
    return hashlib.sha256(store.encode()).hexdigest()[:12]


def published(store: str) -> bool:
    """Whether a store (StoreLocation JSON) was recorded as feature_store.yaml
    text, the form Feast's operator publishes to clients, which any Pod that
    reaches its registry, sources and online store can open; not a
    repository folder, which is a path on the operator's machine."""
    return "config" in json.loads(store)


def job_request(need: StoreNeed, end: float) -> str:
    """One run, as a Job's Pod reads it (read_job_request)."""
    return json.dumps({"store": need.store, "views": list(need.views), "end": end}, sort_keys=True)


def read_job_request(text: str) -> tuple[StoreNeed, float]:
    data = json.loads(text)
    return StoreNeed(data["store"], tuple(data["views"]), 0.0), float(data["end"])


@dataclass
class StoreState:
    """One store's schedule and the outcome of its runs."""

    need: StoreNeed
    next_run: float = 0.0
    running: bool = False
    """A run is in flight (filled in by Materializer.states)."""
    failures: int = 0
    """Consecutive failed runs (0 after a success)."""
    runs: int = 0
    failed_runs: int = 0
    project: str = ""
    ends: dict[str, float | None] = field(default_factory=dict)
    last_error: str | None = None


def merge_needs(needs: Iterable[StoreNeed]) -> dict[str, StoreNeed]:
    """One need per store: the union of the views, the shortest interval."""
    merged: dict[str, StoreNeed] = {}
    for need in needs:
        known = merged.get(need.store)
        if known is None:
            merged[need.store] = need
            continue
        views = tuple(sorted({*known.views, *need.views}))
        merged[need.store] = StoreNeed(need.store, views, min(known.interval, need.interval))
    return merged


def next_run(now: float, interval: float, failures: int) -> float:
    """When the next run starts: an interval after a success, sooner after a
    failure (exponential backoff, never later than the interval)."""
    if failures == 0:
        return now + interval
    return now + min(interval, RETRY_BASE_SECONDS * 2 ** (failures - 1))


def lag_seconds(now: float, end: float | None) -> float:
    """How far the online store is behind: from the end of the view's last
    materialised interval to now; infinite when it was never materialised."""
    return math.inf if end is None else max(0.0, now - end)


def max_lag_seconds(interval: float) -> float:
    return STALE_AFTER_INTERVALS * interval


def freshness(states: list[StoreState], now: float) -> tuple[str, str, str]:
    """The FeaturesFresh condition (status, reason, message) of a service
    that reads these stores: the worst store speaks."""
    failing = [s for s in states if s.last_error is not None]
    if failing:
        s = failing[0]
        lag = max((lag_seconds(now, e) for e in s.ends.values()), default=math.inf)
        return ("False", Reason.MATERIALIZATION_FAILED,
                f"materialising {_name(s)} failed {s.failures} time(s) in a row, retrying: {s.last_error}; "
                f"its online features are {_age(lag)} behind")
    waiting = [s for s in states if s.runs == 0]
    if waiting:
        return "Unknown", Reason.FIRST_RUN, f"the first materialisation of {_name(waiting[0])} is running"
    parts = [f"{_name(s)} up to {_age(max((lag_seconds(now, e) for e in s.ends.values()), default=0.0))} ago, "
             f"every {s.need.interval:g}s" for s in states]
    return "True", Reason.MATERIALIZED, "online store materialised: " + "; ".join(parts)


def _name(state: StoreState) -> str:
    return f"feature store {state.project}" if state.project else "the feature store"


def _age(lag: float) -> str:
    return "never materialised" if math.isinf(lag) else f"{lag:.0f}s"


Run = Callable[[StoreNeed, float], Materialized]


class Materializer:
    """Materialises the stores InferenceServices need, each on its schedule.

    `want` is called by every reconcile of a service with what it needs now
    (nothing, when it reads no online features); a store stays scheduled
    while some service wants it. Runs are `run(need, end)` calls on a pool
    of `workers` threads, at most one per store."""

    def __init__(self, run: Run, clock: Callable[[], float] = time.time, workers: int = 2, tick: float = 0.5):
        self._run = run
        self._clock = clock
        self._tick = tick
        self._lock = threading.Lock()
        self._owners: dict[str, dict[str, StoreNeed]] = {}
        self._stores: dict[str, StoreState] = {}
        self._running: set[str] = set()
        """Stores with a run in flight, kept apart from their state: a store
        dropped and wanted again while its run goes on does not run twice."""
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="materialize")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def want(self, owner: str, needs: Iterable[StoreNeed]) -> None:
        """What the owner (namespace/name) needs now; replaces what it needed before."""
        with self._lock:
            needs = list(needs)
            if needs:
                self._owners[owner] = merge_needs(needs)
            else:
                self._owners.pop(owner, None)
            self._converge()

    def forget(self, owner: str) -> None:
        self.want(owner, [])

    def states(self, stores: Iterable[str] | None = None) -> list[StoreState]:
        """Copies of the states of the named stores (all when None)."""
        with self._lock:
            keys = list(self._stores) if stores is None else [s for s in stores if s in self._stores]
            return [replace(self._stores[k], ends=dict(self._stores[k].ends), running=k in self._running)
                    for k in keys]

    def due(self) -> list[StoreNeed]:
        """Start the runs that are due; what was started."""
        now = self._clock()
        with self._lock:
            started = [s.need for key, s in self._stores.items() if key not in self._running and s.next_run <= now]
            self._running.update(n.store for n in started)
        for need in started:
            self._pool.submit(self._materialize, need, now)
        return started

    def start(self) -> "Materializer":
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="materializer", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        close = getattr(self._run, "close", None)  # a run that waits (for a Job) stops waiting
        if close is not None:
            close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _loop(self) -> None:
        while not self._stop.wait(self._tick):
            self.due()

    def _converge(self) -> None:
        wanted = merge_needs(n for needs in self._owners.values() for n in needs.values())
        for key in [k for k in self._stores if k not in wanted]:
            del self._stores[key]  # a run in flight finishes; its result is dropped
        for key, need in wanted.items():
            state = self._stores.get(key)
            if state is None:
                self._stores[key] = StoreState(need)
            elif state.need != need:
                # A shorter interval or a new view takes effect at once.
                state.need, state.next_run = need, min(state.next_run, self._clock())

    def _materialize(self, need: StoreNeed, end: float) -> None:
        try:
            result = self._run(need, end)
        except Exception as exc:  # noqa: BLE001 - a team's store fails in its own ways; said in status
            result = Materialized("", {}, f"{type(exc).__name__}: {exc}")
        now = self._clock()
        with self._lock:
            self._running.discard(need.store)
            state = self._stores.get(need.store)
            if state is None:
                return
            state.runs += 1
            state.project = result.project or state.project
            state.ends.update(result.ends)
            if result.error is None:
                state.failures, state.last_error = 0, None
            else:
                state.failures += 1
                state.failed_runs += 1
                state.last_error = result.error
                log.warning("materialising %s failed (%d in a row): %s", state.project or need.store,
                            state.failures, result.error)
            state.next_run = next_run(now, state.need.interval, state.failures)
