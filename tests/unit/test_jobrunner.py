"""The one Job runner (drift and outcome checks, materialisation): which Jobs
it prunes and what a finished Job's status means, on plain dicts; starting,
adopting and waiting over objects in memory. Each kind's own tests
(test_drift_jobs.py, test_materialize_jobs.py) pin what it builds and how it
reads its result."""

from __future__ import annotations

import json
import threading

import pytest

from kubeloop.jobrunner import JobRunner, newest_first, read_result, to_prune, unfinished
from kubeloop.kube import KubeError
from tests.unit.fakes import FakeObjects

NAMESPACE = "ml"
COMPLETE = [{"type": "Complete", "status": "True"}]
FAILED = [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "Job was active longer"}]


def _job(name: str, created: str = "", conditions: list[dict] | None = None) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"kubeloop.dev/purpose": "check"},
                         **({"creationTimestamp": created} if created else {})},
            "status": {"conditions": conditions or []}}


def _error(message: str) -> dict:
    return {"error": message}


# -- pure --------------------------------------------------------------------

def test_jobs_are_newest_first_and_those_created_in_one_second_by_name():
    jobs = [_job("b", "2026-11-24T00:01:00Z"), _job("c", "2026-11-24T00:03:00Z"), _job("a", "2026-11-24T00:01:00Z")]
    assert [j["metadata"]["name"] for j in newest_first(jobs)] == ["c", "b", "a"]


@pytest.mark.parametrize("count, pruned", [(0, []), (2, []), (3, ["j0"]), (5, ["j2", "j1", "j0"])])
def test_pruning_leaves_room_for_the_next_job_within_keep(count, pruned):
    """keep=3: the next Job and the newest two before it remain."""
    jobs = [_job(f"j{i}", f"2026-11-24T00:0{i}:00Z", COMPLETE) for i in range(count)]
    assert to_prune(list(reversed(jobs)), keep=3) == pruned
    assert to_prune(jobs, keep=1) == [j["metadata"]["name"] for j in reversed(jobs)]


def test_the_running_job_is_the_one_not_finished():
    done, failed, running = _job("done", conditions=COMPLETE), _job("failed", conditions=FAILED), _job("running")
    assert unfinished([done, failed, running]) is running
    assert unfinished([done, failed]) is None


@pytest.mark.parametrize("conditions, message, expected", [
    (COMPLETE, '{"rows": 3}', {"rows": 3}),
    (FAILED, '{"rows": 3}', {"rows": 3}),  # a Pod that failed after writing its summary: the summary says why
    (COMPLETE, "not json", {"error": "check Job j left an unreadable result: not json"}),
    (FAILED, None, {"error": "check Job j failed: DeadlineExceeded: Job was active longer"}),
    (COMPLETE, None, None),
    ([], None, None),
])
def test_what_a_jobs_status_and_summary_mean(conditions, message, expected):
    assert read_result("check", _job("j", conditions=conditions), message, json.loads, _error) == expected


def test_an_unreadable_summary_is_quoted_short():
    error = read_result("check", _job("j", conditions=COMPLETE), "x" * 5000, json.loads, _error)["error"]
    assert error.endswith("x" * 200) and len(error) < 300


# -- over objects in memory ----------------------------------------------------

@pytest.fixture
def kube():
    return FakeObjects()


def _runner(kube, keep: int = 3) -> JobRunner:
    return JobRunner(kube, NAMESPACE, "kubeloop.dev/purpose=check", "check", keep)


def _names(kube) -> list[str]:
    return sorted(name for (kind, _ns, name) in kube.objects if kind == "Job")


def test_a_job_that_exists_already_is_adopted_not_replaced(kube):
    """A 409 on create is the same run's Job (a restarted operator's): its
    name comes back, and it is the Job that is read."""
    kube.create(_job("run-1", conditions=COMPLETE))
    runner = _runner(kube)
    assert runner.start(lambda: _job("run-1")) == "run-1"
    assert _names(kube) == ["run-1"] and runner.newest_finished()["status"]["conditions"] == COMPLETE


def test_any_other_refusal_to_create_is_raised(kube):
    def refuse(obj: dict) -> dict:
        raise KubeError(403, "Forbidden", "jobs.batch is forbidden")

    kube.create = refuse
    with pytest.raises(KubeError, match="403"):
        _runner(kube).start(lambda: _job("run-1"))


def test_while_a_job_runs_starting_returns_it_and_builds_nothing(kube):
    kube.create(_job("run-1"))
    built = []
    assert _runner(kube).start(lambda: built.append(1) or _job("run-2")) == "run-1"
    assert built == [] and _names(kube) == ["run-1"]


def test_starting_prunes_the_oldest_finished_jobs_of_its_kind_only(kube):
    for i in range(4):
        kube.create(_job(f"run-{i}", f"2026-11-24T00:0{i}:00Z", COMPLETE))
    other = _job("other", "2026-11-24T00:00:00Z", COMPLETE)
    other["metadata"]["labels"] = {"kubeloop.dev/purpose": "else"}
    kube.create(other)
    _runner(kube, keep=2).start(lambda: _job("run-4", "2026-11-24T00:04:00Z"))
    assert _names(kube) == ["other", "run-3", "run-4"]


def test_waiting_returns_the_finished_job_or_why_it_never_will(kube):
    runner = _runner(kube)
    kube.create(_job("done", conditions=COMPLETE))
    assert runner.wait("done", 10, threading.Event(), poll=0.01)["metadata"]["name"] == "done"
    assert runner.wait("gone", 10, threading.Event(), poll=0.01) == "check Job gone was deleted before it finished"
    kube.create(_job("slow"))
    ticks = iter([0.0, 5.0, 11.0])
    assert runner.wait("slow", 10, threading.Event(), poll=0.01, clock=lambda: next(ticks)) == \
        "check Job slow did not finish within 10 s"
    stopped = threading.Event()
    stopped.set()
    assert runner.wait("slow", 10, stopped, poll=0.01) == "the operator stopped while check Job slow ran"


def test_a_finished_jobs_result_is_what_its_latest_pod_left(kube):
    """A retried Pod's summary, not its failed predecessor's."""
    job = _job("run-1", conditions=COMPLETE)
    kube.create(job)
    for attempt, at in enumerate(["2026-11-24T00:01:00Z", "2026-11-24T00:02:00Z"]):
        terminated = {"finishedAt": at, "message": json.dumps({"try": attempt})}
        kube.objects[("Pod", NAMESPACE, f"run-1-{attempt}")] = {
            "kind": "Pod", "metadata": {"name": f"run-1-{attempt}", "labels": {"job-name": "run-1"}},
            "status": {"containerStatuses": [{"state": {"terminated": terminated}}]}}
    assert _runner(kube).result(job, json.loads, _error) == {"try": 1}


def test_deleting_all_leaves_other_kinds(kube):
    kube.create(_job("run-1"))
    other = _job("other")
    other["metadata"]["labels"] = {"kubeloop.dev/purpose": "else"}
    kube.create(other)
    _runner(kube).delete_all()
    assert _names(kube) == ["other"]
