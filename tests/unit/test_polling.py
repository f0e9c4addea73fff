"""The one polling helper (backend: none, unit)."""

from __future__ import annotations

import itertools

import pytest

from kubeloop.polling import wait_for


def test_the_first_truthy_value_is_returned():
    answers = iter([None, 0, [], "ready", "later"])
    assert wait_for(lambda: next(answers), timeout=5, interval=0.001) == "ready"


def test_after_the_timeout_the_error_names_what_and_what_was_seen():
    class StepFailed(Exception):
        pass

    calls = itertools.count()
    with pytest.raises(StepFailed, match=r"the canary ready did not happen within 0 s; saw 2 replicas"):
        wait_for(lambda: next(calls) < 0, timeout=0.05, what="the canary ready", interval=0.01,
                 seen=lambda: "2 replicas", error=StepFailed)
    with pytest.raises(TimeoutError, match=r"saw \[\]"):
        wait_for(list, timeout=0.02, interval=0.01)
    assert next(calls) > 1, "probed more than once"


def test_a_probe_that_raises_is_not_retried():
    calls = []

    def probe() -> bool:
        calls.append(1)
        raise ValueError("the API server said no")

    with pytest.raises(ValueError, match="said no"):
        wait_for(probe, timeout=5, interval=0.001)
    assert calls == [1]
