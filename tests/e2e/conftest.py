"""End-to-end fixtures: kubectl and the operator as a real process."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from kubeloop.api.constants import API_VERSION
from kubeloop.dev.binaries import binary
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_for

MODULE_SECONDS = {
    "test_real_node.py": 4636, "test_outcomes.py": 579, "test_loop.py": 486, "test_fault_kills.py": 484,
    "test_byo.py": 427, "test_serving_pools.py": 370, "test_faults.py": 301, "test_serving_placement.py": 300,
    "test_optimization.py": 256, "test_training.py": 171, "test_feature_freshness.py": 154, "test_operator.py": 112,
    "test_data_validation.py": 96, "test_registry_events.py": 94, "test_platform.py": 82,
    "test_online_features.py": 74, "test_serving_local.py": 73, "test_fault_router.py": 67,
    "test_front_conformance.py": 32, "test_fault_flood.py": 31, "test_chart.py": 28, "test_audit.py": 26,
    "test_fault_memory.py": 18, "test_chart_monitoring.py": 6, "test_fleet_view.py": 1, "test_validation.py": 1,
}
"""Each module's seconds in `.ci/run` on a fresh machine, 2026-12-07 (its
tests and the fixtures that took over 30 s; the real node's waited for
every image's first build). Over two workers the last module to finish sets the run's
end, and a worker takes the next module while its current one still has two
tests to run: so every module goes longest first, and the short ones fill
in at the end beside the real node's. A module not listed counts as a
minute."""
UNMEASURED_SECONDS = 60


def pytest_collection_modifyitems(config, items):
    """Split over workers (make test), each module runs whole on one worker,
    the longest first (the real node's images are built by then: make test
    starts the e2e tests once its prebuild is done). The sort is stable: a
    module's tests keep their order."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: -MODULE_SECONDS.get(item.path.name, UNMEASURED_SECONDS))


_STARTED = time.monotonic()
# A long test that passes still says where its minutes went: the lines it
# printed with a step's seconds (tests.support.stories.timed_steps), which
# pytest would otherwise keep to itself.
SHOW_STEPS_AFTER_S = 120
# A module's platform or served versions set up (or torn down) inside a
# test's setup count in the run's time too.
SHOW_FIXTURES_AFTER_S = 30
TIMED_STEP = re.compile(r"\(\d+ s\)")
MAX_STEPS = 40


def pytest_runtest_logreport(report):
    """One line as each e2e test ends, with its seconds and, on failure, its
    error: a run cut off by CI's limit still says which test failed and which
    took the time (pytest's own summary comes only at the end)."""
    if report.when != "call" and not report.failed and report.duration < SHOW_FIXTURES_AFTER_S:
        return
    writer = _terminal()
    if writer is None:
        return
    elapsed = time.monotonic() - _STARTED
    gateway = getattr(getattr(report, "node", None), "gateway", None)  # the xdist worker that ran it
    worker = f"{gateway.id} " if gateway is not None else ""
    line = (f"[{elapsed / 60:5.1f} min] {worker}{report.outcome.upper()} {report.nodeid} {report.when} "
            f"({report.duration:.0f} s)")
    writer.write_line(line)
    if report.failed:
        text = report.longreprtext.splitlines()
        errors = [t for t in text if t.startswith("E ")][:3] or text[-1:]
        for error in errors:
            writer.write_line(f"    {error[:300]}")
    elif report.duration >= SHOW_STEPS_AFTER_S:
        for step in [line for line in report.capstdout.splitlines() if TIMED_STEP.search(line)][:MAX_STEPS]:
            writer.write_line(f"    {step[:200]}")


_CONFIG: list = []


def pytest_configure(config):
    _CONFIG.append(config)


def _terminal():
    return _CONFIG[0].pluginmanager.get_plugin("terminalreporter") if _CONFIG else None


# Read at import, before any fixture: a module- or session-scoped fixture
# that registers a model runs before a function-scoped one could look.
_MLFLOW_TRACKING_URI_AT_START = os.environ.get("MLFLOW_TRACKING_URI")


@pytest.fixture(autouse=True)
def _mlflow_tracking_left_as_found():
    """Registering a model (kubeloop's components, in the test's process)
    sets mlflow's global tracking URI, and with it the process's
    MLFLOW_TRACKING_URI: left set, the next test on the worker talked to the
    last one's MLflow (a real-node test's platform) and failed a runs:/
    download with a 404. Each test starts and ends with the worker's own."""
    import mlflow

    mlflow.set_tracking_uri(_MLFLOW_TRACKING_URI_AT_START)
    yield
    mlflow.set_tracking_uri(_MLFLOW_TRACKING_URI_AT_START)


@pytest.fixture(scope="session")
def kubectl(platform):
    """Run the kubectl of the pinned Kubernetes version against the platform."""

    def run(*args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([str(binary("kubectl")), f"--kubeconfig={platform.kubeconfig}", *args],
                                input=input, capture_output=True, text=True, timeout=60)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed:\n{result.stderr}")
        return result

    return run


@pytest.fixture
def start_operator(platform, kube, tmp_path):
    """Start the operator (noop pipelines, in-memory registry unless overridden)
    watching the given namespaces; stopped after the test, once it has stopped
    what its InferenceServices run outside Kubernetes (local Triton servers)."""
    started: list[OperatorProcess] = []

    def start(namespaces: list[str], **env: str) -> OperatorProcess:
        defaults = {"KUBELOOP_REGISTRY": "memory", "KUBELOOP_PIPELINE_BACKENDS": "noop",
                    "KUBELOOP_PIPELINE_BACKEND": "noop",
                    "KUBELOOP_RESYNC_SECONDS": "2", "KUBELOOP_WORK_DIR": str(tmp_path / "work"),
                    # The platform's fork server, shared by the session's tests (their work dirs differ).
                    "KUBELOOP_STATE_DIR": str(platform.dir)}
        logs = tmp_path / ("operator" if not started else f"operator-{len(started)}")
        op = OperatorProcess(platform.kubeconfig, logs, {**defaults, **env}, namespaces)
        started.append(op.start())
        return op

    yield start
    for op in started:
        try:
            if op.running():
                _delete_inference_services(kube, op.namespaces)
        finally:
            op.stop()


@pytest.fixture
def local_operator(platform, namespace, start_operator, tmp_path):
    """The operator with every local backend and the platform's MLflow and
    Feast, watching the test's namespace (or another, with a work folder of
    its own)."""
    env = platform.env()

    def start(watch: str = namespace, work: Path = tmp_path / "work", **extra: str):
        op = start_operator([watch], KUBELOOP_REGISTRY="mlflow", MLFLOW_TRACKING_URI=env["MLFLOW_TRACKING_URI"],
                            KUBELOOP_FEAST_REPO=env["KUBELOOP_FEAST_REPO"], KUBELOOP_PIPELINE_BACKENDS="local",
                            KUBELOOP_PIPELINE_BACKEND="local", KUBELOOP_SERVING_BACKENDS="local",
                            KUBELOOP_SERVING_BACKEND="local", KUBELOOP_WORK_DIR=str(work), **extra)
        op.wait_for_log("Initial authentication has finished", timeout=60)
        op.work = work
        return op

    return start


def _delete_inference_services(kube, namespaces: list[str]) -> None:
    for namespace in namespaces:
        for isvc in kube.list(API_VERSION, "InferenceService", namespace):
            kube.delete(API_VERSION, "InferenceService", isvc["metadata"]["name"], namespace)
        wait_for(lambda namespace=namespace: not kube.list(API_VERSION, "InferenceService", namespace),
                 timeout=60, what=f"the InferenceServices of {namespace} cleaned up by the operator")
