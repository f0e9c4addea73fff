"""The local serving backend starts processes and returns: it never waits for
them inside a reconcile (which holds a kopf worker and the object's lock)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from kubeloop.api.refs import ObjectRef
from kubeloop.api.serving import InferenceServiceSpec
from kubeloop import processes
from kubeloop.gpu.placement import PlacementDecision
from kubeloop.registry.base import ModelVersion
from kubeloop.serving.base import ServedVersion, ServingRequest, ServingUnavailable, triton_name
from kubeloop.serving.local import InstanceState, LocalServing
from kubeloop.serving.repository import prune_versions

REF = ObjectRef("InferenceService", "ml", "fraud", "uid-1", 1)


@dataclass(frozen=True)
class SlowRuntime:
    """argv of a server that answers only once `go` exists."""

    go: Path

    def argv(self, repository: Path, http_port: int, grpc_port: int, metrics_port: int) -> list[str]:
        return [sys.executable, "-m", "tests.support.slow_server", str(self.go), str(http_port)]

    def env(self) -> dict[str, str]:
        # The server runs in the instance's folder: the tests package is found from the checkout. (Without
        # this it died at once, and these tests passed only while it had not yet died.)
        return {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}


def request() -> ServingRequest:
    spec = InferenceServiceSpec.model_validate({"model": {"name": "fraud", "alias": "champion"}, "backend": "local"})
    version = ModelVersion("fraud", "1", "models:/fraud/1")
    return ServingRequest(REF, spec, (ServedVersion("primary", version, 100),),
                          PlacementDecision(True, "cpu", "local"))


@pytest.fixture
def serving(tmp_path):
    backend = LocalServing(tmp_path / "work", "http://127.0.0.1:1", runtime=SlowRuntime(tmp_path / "go"))
    configs = backend.folder(REF) / "configs"
    configs.mkdir(parents=True)
    (configs / "1.pbtxt").write_text('name: "fraud"\n')  # as fetched before: no registry needed
    (backend.folder(REF) / "repository" / triton_name("fraud") / "1").mkdir(parents=True)
    yield backend
    processes.stop_all_under(tmp_path / "work")


def test_a_starting_server_is_reported_not_waited_for(serving, tmp_path):
    """Local: before, ensure() polled for up to 60 s per process inside the handler."""
    state = serving.ensure(request())
    assert not state.primary_ready and "tritonserver is starting" in state.message
    record = InstanceState.read(serving.folder(REF) / "state.json").record("tritonserver")
    assert record.running()
    again = serving.ensure(request())  # the requeued reconcile: the same process, still starting
    assert "tritonserver is starting" in again.message
    assert InstanceState.read(serving.folder(REF) / "state.json").record("tritonserver") == record


def test_a_server_that_never_answers_is_unavailable_after_the_timeout(serving, monkeypatch):
    """Local: the start time is the process's own, so a restarted operator judges it alike."""
    serving.ensure(request())
    monkeypatch.setattr("kubeloop.serving.instances.READY_TIMEOUT", 0.0)
    with pytest.raises(ServingUnavailable, match="not ready"):
        serving.ensure(request())


def test_a_killed_server_is_restarted_and_the_outage_said(serving):
    """Local: the next reconcile finds the process gone, starts another and
    says so, as a failing container (an outage the reconciler's hysteresis
    for slow checks must not hide); the reconcile after is a plain start."""
    serving.ensure(request())
    path = serving.folder(REF) / "state.json"
    first = InstanceState.read(path).record("tritonserver")
    processes.stop(first)
    state = serving.ensure(request())
    second = InstanceState.read(path).record("tritonserver")
    assert second.pid != first.pid and second.running()
    assert f"pid {first.pid}) was not running: restarted it" in state.message and state.failing
    assert json.loads(path.read_text())["loaded"] == ""
    assert not serving.ensure(request()).failing


def test_a_pruned_version_served_again_is_fetched_again(tmp_path, monkeypatch):
    """Local: pruning removed version 1's folder but kept its config, and the
    fetch looked only at the config, so an alias moved back to version 1 served
    nothing."""
    fetched: list[str] = []

    def fetch(tracking_uri, model, version, repository, backend):  # noqa: ANN001 - the registry's stand-in
        fetched.append(version)
        (repository / triton_name(model) / version).mkdir(parents=True, exist_ok=True)
        from tritonclient.grpc import model_config_pb2 as mc

        return mc.ModelConfig(name=triton_name(model))

    monkeypatch.setattr("kubeloop.serving.local.fetch_version", fetch)
    backend = LocalServing(tmp_path / "work", "http://127.0.0.1:1", runtime=SlowRuntime(tmp_path / "go"))
    folder = backend.folder(REF)
    folder.mkdir(parents=True)
    repository = folder / "repository"
    backend._fetch(repository, "fraud", folder, {"1", "2"})
    backend._fetch(repository, "fraud", folder, {"1", "2"})
    assert fetched == ["1", "2"]
    prune_versions(repository, triton_name("fraud"), ["2"])
    backend._fetch(repository, "fraud", folder, {"1", "2"})
    assert fetched == ["1", "2", "1"]
    assert (repository / triton_name("fraud") / "1").is_dir()
