"""The local pipeline backend's run bookkeeping, with a worker that sleeps."""

from __future__ import annotations

import os
import signal

import pytest

from kubeloop.pipelines.backends.base import RunRequest
from kubeloop.pipelines.backends.local import LocalBackend, LocalContext, read_state
from kubeloop.pipelines.worker import step_error
from tests.support.waiting import wait_for


@pytest.fixture
def backend(tmp_path):
    return LocalBackend(tmp_path, LocalContext("/repo", "http://mlflow"), worker="tests.support.sleepy_worker")


def request(seconds: float, name: str = "ns-job-abc") -> RunRequest:
    return RunRequest(name=name, pipeline="training", arguments={"seconds": seconds})


def test_a_run_is_submitted_once_and_followed_to_the_end(backend):
    first = backend.submit(request(0.5))
    pid = read_state(backend.run_dir(first.run_id))["pid"]
    again = backend.submit(request(0.5))
    assert again.run_id == first.run_id and read_state(backend.run_dir(first.run_id))["pid"] == pid
    done = wait_for(lambda: (s := backend.status(first.run_id)).finished and s, timeout=20)
    assert done.phase == "Succeeded" and done.outputs == {"slept": 0.5}
    assert done.url == f"file://{backend.run_dir(first.run_id)}"


def test_a_restarted_operator_finds_the_run_by_name(backend, tmp_path):
    run = backend.submit(request(0.2))
    restarted = LocalBackend(tmp_path, backend.context, worker="tests.support.sleepy_worker")
    assert restarted.status(run.run_id) is not None
    assert wait_for(lambda: (s := restarted.status(run.run_id)).finished and s).phase == "Succeeded"
    assert restarted.status("unknown-run") is None


def test_a_dead_worker_fails_the_run(backend):
    run = backend.submit(request(30))
    wait_for(lambda: backend.status(run.run_id).phase == "Running")
    os.kill(read_state(backend.run_dir(run.run_id))["pid"], signal.SIGKILL)
    failed = wait_for(lambda: (s := backend.status(run.run_id)).finished and s)
    assert failed.phase == "Failed" and "exited unexpectedly" in failed.error


def test_cancel_stops_the_worker(backend):
    run = backend.submit(request(30))
    wait_for(lambda: backend.status(run.run_id).phase == "Running")
    backend.cancel(run.run_id)
    status = backend.status(run.run_id)
    assert status.phase == "Failed" and status.error == "cancelled"


def test_the_failing_steps_exception_is_extracted():
    log = "\n".join([
        "11:00:00 - INFO - Executing task \x1b[96m'training-data'\x1b[0m",
        "    Traceback (most recent call last):",
        '      File "x.py", line 3, in f',
        "    ValueError: feature view 'nope' does not exist in project p; known views: a",
        "11:00:01 - ERROR - Task \x1b[96m'training-data'\x1b[0m finished with status \x1b[91mFAILURE\x1b[0m",
        "RuntimeError: something later",
    ])
    assert step_error(log, "training-data") == (
        "step training-data: ValueError: feature view 'nope' does not exist in project p; known views: a")


def test_a_data_validation_failure_reaches_the_condition_intact():
    """Local: the validate step's one-line message (column, rule, values) is
    what the run's error, and so the RunSucceeded condition, says."""
    from kubeloop.components.validation import Finding, describe

    findings = [Finding("credit_limit", "maxOutOfRangeShare",
                        "column 'credit_limit': 100.0% of values are outside the champion's (version 1) range "
                        "[588.3, 2.1e+04] widened by rangeTolerance 0.1 (seen 5.9e+05 to 2.1e+07; "
                        "maxOutOfRangeShare 0.01)"),
                Finding("credit_limit", "psiThreshold", "column 'credit_limit': PSI 9.1 against the champion's "
                                                        "(version 1) training data is above psiThreshold 0.25")]
    message = f"data validation failed, {describe(findings)}"
    log = "\n".join([
        "11:00:00 - INFO - Executing task \x1b[96m'validate-data'\x1b[0m",
        "    Traceback (most recent call last):",
        f"    kubeloop.components.validation.DataValidationError: {message}",
        "11:00:01 - ERROR - Task \x1b[96m'validate-data'\x1b[0m finished with status \x1b[91mFAILURE\x1b[0m",
    ])
    assert step_error(log, "validate-data") == (
        f"step validate-data: kubeloop.components.validation.DataValidationError: {message}")


def test_the_worker_and_its_steps_never_inherit_the_operators_prometheus_folder(backend, monkeypatch):
    """Local: importing feast in the operator points PROMETHEUS_MULTIPROC_DIR at a folder
    feast removes when the operator exits; a worker that inherited it failed its next
    step after a graceful operator restart."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/tmp/feast_metrics_of_the_operator")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")  # the operator's fail_fast()
    run = backend.submit(request(30))
    try:
        pid = wait_for(lambda: read_state(backend.run_dir(run.run_id)).get("pid"))
        # Read once the worker's environment is there: CI once read it empty (a process not yet
        # or no longer running its program shows none).
        environ = wait_for(lambda: open(f"/proc/{pid}/environ", "rb").read(), timeout=10,
                           what=f"worker {pid}'s environment").split(b"\0")
        assert not [v for v in environ if v.startswith(b"PROMETHEUS_MULTIPROC_DIR=")]
        assert b"PYTHONUNBUFFERED=1" in environ
        # Steps wait out an MLflow restart instead of failing the run in seconds.
        assert b"MLFLOW_HTTP_REQUEST_MAX_RETRIES=8" in environ
    finally:
        backend.cancel(run.run_id)


def test_the_steps_start_without_a_prometheus_folder_the_worker_imported(tmp_path, monkeypatch):
    """Local: the worker's kfp steps are its children; they get prometheus-client's
    single-process mode, not a folder set by something the worker imported."""
    import json
    import sys

    from kubeloop.pipelines import worker

    seen = tmp_path / "env.json"

    def pipeline(**_):
        import subprocess

        subprocess.run([sys.executable, "-c", f"import json, os; open({str(seen)!r}, 'w').write("
                        "json.dumps(sorted(k for k in os.environ if 'MULTIPROC' in k.upper())))"], check=True)

        class Task:
            output = {}
        return Task()

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "set-by-an-import"))
    monkeypatch.setattr(worker, "pipeline_function", lambda name: pipeline)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "request.json").write_text(json.dumps({"pipeline": "training", "arguments": {}}))
    monkeypatch.setattr(sys, "stdout", sys.stdout)  # main() tees stdout; put it back afterwards
    assert worker.main(run_dir) == 0
    assert json.loads(seen.read_text()) == []
