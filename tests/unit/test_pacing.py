"""How often a steady object is resynced (kubeloop.operator.pacing;
backend-independent, a clock of our own). The operator at 5,000
InferenceServices is measured by `python -m tests.bench scale`."""

from __future__ import annotations

import threading

from kubeloop.operator.handlers import _steady_service, _timer_has_work, _unsteady_service
from kubeloop.operator.pacing import ResyncPace, ResyncThread


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def meta(uid: str) -> dict:
    return {"name": f"n-{uid}", "namespace": "ml", "uid": uid, "resourceVersion": "7"}


def test_a_few_steady_objects_are_resynced_every_resync_seconds_least_recent_first():
    clock = Clock()
    pace = ResyncPace(15.0, 50.0, clock)
    for uid in ("a", "b"):
        pace.reconciled(meta(uid), steady=True)
        clock.now += 1
    clock.now = 15.5
    assert pace.take_due(50) == [{"name": "n-a", "namespace": "ml", "uid": "a"}]
    clock.now = 16.0
    assert [m["uid"] for m in pace.take_due(50)] == ["b"]
    assert pace.take_due(50) == [], "taken: not due again until an interval has passed"
    clock.now = 31.0
    assert [m["uid"] for m in pace.take_due(50)] == ["a", "b"], "a was taken at 15.5, b at 16"
    assert pace.interval() == 15.0


def test_thousands_of_steady_objects_share_the_budget_of_resyncs_a_second():
    clock = Clock()
    pace = ResyncPace(15.0, 50.0, clock)
    for i in range(5000):
        pace.reconciled(meta(f"svc-{i:04d}"), steady=True)
    assert pace.interval() == 100.0
    clock.now = 99.0
    assert pace.take_due(50) == []
    resynced = []
    for second in range(100, 200):
        clock.now = float(second)
        taken = pace.take_due(50)
        assert len(taken) <= 50
        resynced += [m["uid"] for m in taken]
    assert resynced == [f"svc-{i:04d}" for i in range(5000)], "each once in 100 s, oldest first, 50 a second"


def test_an_object_that_is_not_steady_or_is_deleted_leaves_the_count():
    clock = Clock()
    pace = ResyncPace(15.0, 1.0, clock)
    for uid in "abcdefghijklmnop":  # 16 at one a second: each every 16 s
        pace.reconciled(meta(uid), steady=True)
    assert pace.interval() == 16.0
    pace.reconciled(meta("p"), steady=False)  # a canary started: kopf's timer has it again
    assert pace.interval() == 15.0 and pace.steady() == 15
    pace.forget("o")
    assert pace.steady() == 14
    clock.now = 15.0
    assert "p" not in [m["uid"] for m in pace.take_due(100)]


def test_a_waiting_object_is_looked_at_again_after_1_2_4_8_then_every_10_seconds():
    """Unit (a clock of our own): an InferenceService waiting on its Pods is
    looked at again by the resync thread, not by kopf's retries, which wrote
    their state onto the object at each try; once it stops waiting, nothing
    brings it back before its steady interval."""
    clock = Clock()
    pace = ResyncPace(15.0, 50.0, clock)
    looks = []
    pace.reconciled(meta("a"), steady=False, waiting=True)
    while clock.now < 40:
        clock.now += 0.5
        if pace.take_due(50):
            looks.append(clock.now)
            pace.reconciled(meta("a"), steady=False, waiting=True)
    assert looks == [1.0, 3.0, 7.0, 15.0, 25.0, 35.0]
    assert pace.waiting() == 1
    pace.reconciled(meta("a"), steady=True)
    assert pace.waiting() == 0
    clock.now += 14.5
    assert pace.take_due(50) == []
    clock.now += 1
    assert [m["uid"] for m in pace.take_due(50)] == ["a"]


def test_a_poked_object_goes_first_and_a_waiting_one_then_looks_again_a_second_later():
    """Unit: a poke (one of the service's Pods changed) puts a waiting or a
    steady object ahead of everything due, within the budget; a waiting one's
    backoff starts again at 1 s, so a Deployment that counts the ready Pod a
    moment after the Pod said so is seen a second later; unknown names and
    forgotten objects are ignored."""
    clock = Clock()
    pace = ResyncPace(15.0, 2.0, clock)
    for uid in ("s1", "s2", "s3"):
        pace.reconciled(meta(uid), steady=True)
    pace.reconciled(meta("w"), steady=False, waiting=True)
    for _ in range(4):
        pace.reconciled(meta("w"), steady=False, waiting=True)  # waited 5 times: next look in 10 s
    clock.now = 16.0
    pace.poke("ml", "n-w")
    pace.poke("ml", "n-s3")
    pace.poke("ml", "unknown")
    assert [m["uid"] for m in pace.take_due(2)] == ["w", "s3"], "poked first, the budget holds"
    assert [m["uid"] for m in pace.take_due(2)] == ["s1", "s2"]
    assert pace.take_due(2) == [], "s3 was taken at 16 s: not due again yet"
    pace.reconciled(meta("w"), steady=False, waiting=True)
    clock.now = 16.5
    assert pace.take_due(2) == []
    clock.now = 17.0
    assert [m["uid"] for m in pace.take_due(2)] == ["w"]
    pace.forget("w")
    pace.poke("ml", "n-w")
    clock.now = 100.0
    assert "w" not in [m["uid"] for m in pace.take_due(10)] and pace.waiting() == 0


def test_the_resync_thread_resyncs_what_is_due_and_carries_on_after_a_failure():
    """Unit (a real thread, a clock of our own): every due object is resynced
    once, one that raises does not stop the others, and stop() ends it."""
    clock = Clock()
    pace = ResyncPace(15.0, 50.0, clock)
    for uid in ("a", "b", "c"):
        pace.reconciled(meta(uid), steady=True)
    clock.now = 20.0
    seen, done = [], threading.Event()

    def resync(m: dict) -> None:
        seen.append(m["uid"])
        if len(seen) == 3:
            done.set()
        if m["uid"] == "a":
            raise RuntimeError("the API server went away")

    resyncing = ResyncThread(pace, resync).start()
    try:
        assert done.wait(10)
    finally:
        resyncing.stop()
    assert sorted(seen) == ["a", "b", "c"]


def test_resyncs_run_in_the_context_of_the_handler_that_started_them_and_start_once():
    """Unit (a real thread): kopf.event finds the operator's event queue in
    context variables that kopf sets for its handlers; a plain thread has
    none, so the first reconcile starts the resyncs with its context (a
    resync's events were lost before, and an outage went unreported)."""
    import contextvars

    queue = contextvars.ContextVar("queue")
    clock = Clock()
    pace = ResyncPace(15.0, 50.0, clock)
    pace.reconciled(meta("a"), steady=True)
    clock.now = 100.0
    seen, done = [], threading.Event()

    def resync(m: dict) -> None:
        seen.append(queue.get("none"))
        done.set()

    resyncing = ResyncThread(pace, resync)
    handlers = contextvars.Context()
    handlers.run(queue.set, "kopf's event queue")
    resyncing.start(handlers)
    resyncing.start(contextvars.Context())  # later reconciles: already started, nothing changes
    try:
        assert done.wait(5)
        assert resyncing._context is handlers
    finally:
        resyncing.stop()
    assert seen == ["kopf's event queue"]


def test_a_budget_under_one_resync_a_second_still_resyncs():
    """Unit (a real thread): at 0.5 a second the thread owes one resync every
    other second, rather than rounding half a resync down to none each second."""
    clock = Clock()
    pace = ResyncPace(15.0, 0.5, clock)
    pace.reconciled(meta("a"), steady=True)
    clock.now = 100.0
    done = threading.Event()
    resyncing = ResyncThread(pace, lambda m: done.set()).start()
    try:
        assert done.wait(5)
    finally:
        resyncing.stop()


def test_a_service_is_steady_when_ready_with_nothing_under_way_and_keeps_kopfs_timer_otherwise():
    assert _steady_service({"phase": "Ready"})
    assert _steady_service({"phase": "Ready", "rollout": {"phase": "Promoted"}, "retraining": {"state": "Promoted"}})
    assert not _steady_service({"phase": "Pending"})
    assert not _steady_service({"phase": "Ready", "canaryVersion": "3"})
    assert not _steady_service({"phase": "Ready", "rollout": {"phase": "Paused"}})
    assert not _steady_service({"phase": "Ready", "retraining": {"state": "Gating"}})
    assert _unsteady_service(None) and _unsteady_service({"phase": "Pending"})
    assert not _unsteady_service({"phase": "Ready"})


def test_kopfs_timer_leaves_alone_what_its_change_handler_or_the_resync_thread_has():
    """Unit: a timer run that queues for a thread holds up kopf's stopping of
    the timer, and kopf patched a dummy annotation onto the object every 2 s
    meanwhile (51 PATCHes a service at 5,000). So the timer does nothing for
    an object whose generation its change handler has not reconciled yet, or
    that the resync thread looks at (waiting or steady); it reconciles the
    rest (a canary under way, an outage's retry)."""
    pace = ResyncPace(15.0, 50.0, Clock())
    new, canary = {**meta("a"), "generation": 2}, {**meta("b"), "generation": 1}
    assert not _timer_has_work(pace, new, None)
    assert not _timer_has_work(pace, new, {"observedGeneration": 1})
    assert _timer_has_work(pace, new, {"observedGeneration": 2})
    pace.reconciled(new, steady=False, waiting=True)
    assert pace.tracks("a") and not _timer_has_work(pace, new, {"observedGeneration": 2})
    pace.reconciled(new, steady=True)
    assert pace.tracks("a") and not _timer_has_work(pace, new, {"observedGeneration": 2})
    pace.reconciled(canary, steady=False)
    assert not pace.tracks("b") and _timer_has_work(pace, canary, {"observedGeneration": 1})
    pace.reconciled(new, steady=False)
    assert _timer_has_work(pace, new, {"observedGeneration": 2})
    pace.reconciled(new, steady=True)
    pace.forget("a")
    assert not pace.tracks("a")
