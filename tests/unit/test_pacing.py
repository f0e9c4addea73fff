"""How often a steady object's timer reconciles it (kubeloop.operator.pacing;
backend-independent, a clock of our own). The operator at 5,000
InferenceServices is measured by `python -m tests.bench scale`."""

from __future__ import annotations

from kubeloop.operator.handlers import _steady_service
from kubeloop.operator.pacing import ResyncPace


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_few_objects_are_reconciled_at_every_timer_firing():
    clock = Clock()
    pace = ResyncPace(15.0, 50.0, clock)
    for uid in ("a", "b"):
        pace.reconciled(uid)
    clock.now = 14.0  # a timer firing a second early is still on time
    assert pace.due("a", steady=True) and pace.interval() == 15.0


def test_thousands_of_steady_objects_share_the_budget_of_reconciles_a_second():
    clock = Clock()
    pace = ResyncPace(15.0, 50.0, clock)
    for i in range(5000):
        pace.reconciled(f"svc-{i}")
    assert pace.interval() == 100.0
    fired = []
    for firing in range(1, 8):  # the timer fires every 15 s
        clock.now = 15.0 * firing
        if pace.due("svc-7", steady=True):
            fired.append(clock.now)
            pace.reconciled("svc-7")
    assert fired == [105.0], "every 100 s, the timer's next firing after that"
    assert pace.due("svc-7", steady=False), "work under way keeps the timer's own pace"
    assert pace.due("new", steady=True), "never reconciled: due"


def test_a_deleted_object_leaves_the_count():
    pace = ResyncPace(15.0, 1.0, Clock())
    for uid in ("a", "b", "c", "d", "e", "f"):  # 6 objects at one a second: each every 15 s still
        pace.reconciled(uid)
    pace.reconciled("g")
    pace.reconciled("h")
    assert pace.interval() == 15.0
    for uid in ("i", "j", "k", "l", "m", "n", "o", "p"):
        pace.reconciled(uid)
    assert pace.interval() == 16.0
    pace.forget("p")
    assert pace.interval() == 15.0


def test_a_service_is_steady_when_ready_with_nothing_under_way():
    assert _steady_service({"phase": "Ready"})
    assert _steady_service({"phase": "Ready", "rollout": {"phase": "Promoted"}, "retraining": {"state": "Promoted"}})
    assert not _steady_service({"phase": "Pending"})
    assert not _steady_service({"phase": "Ready", "canaryVersion": "3"})
    assert not _steady_service({"phase": "Ready", "rollout": {"phase": "Paused"}})
    assert not _steady_service({"phase": "Ready", "retraining": {"state": "Gating"}})
