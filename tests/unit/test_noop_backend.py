"""The no-op pipeline backend (tests and benchmarks churn thousands of
objects through it inside one operator)."""

from __future__ import annotations

import tracemalloc

from kubeloop.pipelines.backends.base import RunRequest
from kubeloop.pipelines.backends.noop import NoopBackend

RUNS = 20_000


def test_runs_leave_nothing_behind():
    """Local and cluster (the backend port): it kept every run it was given
    (about 400 bytes each), so an operator churning objects through it grew."""
    backend = NoopBackend()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(RUNS):
            assert backend.submit(RunRequest(f"run-{i}", "training", {"i": i})).phase == "Succeeded"
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 64 * 1024, f"{kept / RUNS:.0f} bytes kept per run"


def test_a_run_it_never_saw_has_succeeded():
    """Local and cluster: a restarted operator asks about runs submitted before."""
    status = NoopBackend().status("from-before")
    assert (status.run_id, status.phase, status.outputs) == ("from-before", "Succeeded", {"noop": True})
