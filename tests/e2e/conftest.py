"""End-to-end fixtures: kubectl and the operator as a real process."""

from __future__ import annotations

import subprocess

import pytest

from kubeloop.dev.binaries import binary
from tests.support.operator import OperatorProcess


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
def start_operator(platform, tmp_path):
    """Start the operator (noop pipelines, in-memory registry unless overridden)
    watching the given namespaces; stopped after the test."""
    started: list[OperatorProcess] = []

    def start(namespaces: list[str], **env: str) -> OperatorProcess:
        defaults = {"KUBELOOP_REGISTRY": "memory", "KUBELOOP_PIPELINE_BACKENDS": "noop",
                    "KUBELOOP_PIPELINE_BACKEND": "noop",
                    "KUBELOOP_RESYNC_SECONDS": "2", "KUBELOOP_WORK_DIR": str(tmp_path / "work")}
        op = OperatorProcess(platform.kubeconfig, tmp_path / "operator", {**defaults, **env}, namespaces)
        started.append(op.start())
        return op

    yield start
    for op in started:
        op.stop()
