"""A model that takes long to load holds no reconcile: the local backend
starts Triton's load and returns, and a later reconcile sees it finish.
Local backend (the real tritonserver of the serving environment, python
backend); no control plane, no registry (the versions are laid out as the
backend leaves them after fetching)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from kubeloop.api.refs import ObjectRef
from kubeloop.api.serving import InferenceServiceSpec
from kubeloop import processes
from kubeloop.gpu.placement import PlacementDecision
from kubeloop.registry.base import ModelVersion
from kubeloop.serving.base import ServedVersion, ServingRequest, ServingState
from kubeloop.serving.local import InstanceState, LocalServing
from kubeloop.serving.runtime import TritonRuntime
from tests.support.waiting import wait_for

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input {{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }}
output {{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }}
"""
# initialize() waits for a file the test creates: a load as slow as the test
# wants, without a sleep standing in for it.
MODEL_PY = """import time
from pathlib import Path


class TritonPythonModel:
    def initialize(self, args):
        gate = Path({gate!r})
        deadline = time.monotonic() + 300
        while gate and not gate.exists() and time.monotonic() < deadline:
            time.sleep(0.1)

    def execute(self, requests):
        raise NotImplementedError("this model only loads")
"""
REASONABLE = 30.0
"""Far less than the 60 s a load call held the reconcile before (the bound of
"returned", not a speed claim)."""


def seed(serving: LocalServing, ref: ObjectRef, model: str, gate: Path | None) -> ServingRequest:
    """Version 1 of `model` laid out as the backend leaves a fetched version."""
    folder = serving.folder(ref)
    (folder / "configs").mkdir(parents=True)
    (folder / "configs" / "1.pbtxt").write_text(CONFIG.format(name=model))
    version = folder / "repository" / model / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(MODEL_PY.format(gate=str(gate) if gate else ""))
    spec = InferenceServiceSpec.model_validate({"model": {"name": model, "alias": "champion"}, "backend": "local"})
    return ServingRequest(ref, spec, (ServedVersion("primary", ModelVersion(model, "1", f"models:/{model}/1"), 100),),
                          PlacementDecision(True, "cpu", "local"))


@pytest.fixture
def serving(tmp_path):
    backend = LocalServing(tmp_path / "work", "http://127.0.0.1:1", runtime=TritonRuntime.discover())
    yield backend
    processes.stop_all_under(tmp_path / "work")


def test_a_slow_load_does_not_hold_the_reconcile_of_another_object(serving, tmp_path):
    """Local backend, real tritonserver: before, ensure() sat in Triton's load
    call (up to 60 s) while the model initialised, so the worker reconciling
    in turn never got to the second object and the first one's status said
    nothing until the load ended."""
    gate = tmp_path / "gate"
    slow = seed(serving, ObjectRef("InferenceService", "ml", "slow", "uid-slow", 1), "slow", gate)
    quick = seed(serving, ObjectRef("InferenceService", "ml", "quick", "uid-quick", 1), "quick", None)
    pool = ThreadPoolExecutor(1)

    def reconcile(request: ServingRequest) -> ServingState:
        # One worker reconciling the two objects in turn, as kopf's would.
        try:
            return pool.submit(serving.ensure, request).result(timeout=REASONABLE)
        except TimeoutError:
            pytest.fail(f"ensure() of {request.ref.name} held the worker over {REASONABLE:.0f} s")

    def both() -> tuple[ServingState, ServingState]:
        return reconcile(slow), reconcile(quick)

    states = wait_for(lambda: (s := both()) and s[1].primary_ready and s, timeout=180, interval=0.5,
                      what="the quick model served while the slow one loads")
    assert not states[0].primary_ready and states[0].message == "Triton is loading slow version 1"
    triton = f"http://127.0.0.1:{InstanceState.read(serving.folder(slow.ref) / 'state.json').ports['http']}"
    index = requests.post(f"{triton}/v2/repository/index", json={}, timeout=10).json()
    assert [(e["name"], e.get("state")) for e in index] == [("slow", "LOADING")], index

    gate.touch()
    done = wait_for(lambda: (s := reconcile(slow)) and s.primary_ready and s, timeout=120, interval=0.5,
                    what="the slow model ready once its load finished")
    assert done.ready == {"primary": True} and done.ready_replicas == 1
    pool.shutdown()
