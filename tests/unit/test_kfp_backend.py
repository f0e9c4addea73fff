"""The kfp backend against a fake KFP REST API (no KFP server runs here:
its runs need ML Metadata's C++ server): it submits the compiled IR once per
run name, maps states, and reads what a run registered from the registry.
These prove the cluster path's contract, not a run on Kubeflow."""

from __future__ import annotations

import pytest

from kubeloop.api.training import TrainingJobSpec
from kubeloop.pipelines.backends.base import BackendUnavailable, RunRequest
from kubeloop.pipelines.backends.kfp import KfpBackend
from kubeloop.pipelines.environment import StepEnvironment
from tests.support.fake_kfp import FakeKfp

SPEC = TrainingJobSpec.model_validate({"modelName": "fraud", "features": {"featureViews": ["card_activity"], "labels": {"source": "transactions", "column": "is_fraud"}},
                                       "resources": {"gpu": {"count": 1, "product": "NVIDIA-L4"}}})


@pytest.fixture
def kfp_api():
    with FakeKfp() as fake:
        yield fake


@pytest.fixture
def backend(kfp_api):
    outcomes = {"ns-fraud-abc": {"model": {"name": "fraud", "version": "4"}, "metrics": {"auc": 0.9}}}
    return KfpBackend(kfp_api.url, outcomes=lambda name: outcomes.get(name, {}), ui="http://kfp.example",
                      feast_repo="gs://features", tracking_uri="http://mlflow.mlflow", namespace="team-a",
                      git_sha="1a2b3c", steps=StepEnvironment(image="registry.example/components:1a2b3c",
                                                              mlflow_secret="mlflow-credentials"))


def request(name: str = "ns-fraud-abc") -> RunRequest:
    return RunRequest(name=name, pipeline="training", arguments={"spec": SPEC.to_json(), "owner": "ns/fraud",
                                                                  "spec_hash": "abc"})


def test_submit_creates_one_run_with_the_jobs_compute(kfp_api, backend):
    status = backend.submit(request())
    assert status.phase == "Pending" and status.url == f"http://kfp.example/#/runs/details/{status.run_id}"
    run = kfp_api.runs[status.run_id]
    assert run["display_name"] == "ns-fraud-abc"
    params = run["runtime_config"]["parameters"]
    assert params["pipeline_run"] == "ns-fraud-abc" and params["tracking_uri"] == "http://mlflow.mlflow"
    executor = run["pipeline_spec"]["pipeline_spec"]["deploymentSpec"]["executors"]["exec-train"]
    assert executor["container"]["resources"]["accelerator"]["resourceCount"] == "1"
    again = backend.submit(request())
    assert again.run_id == status.run_id and len(kfp_api.runs) == 1


def test_the_run_carries_the_operators_git_sha_image_and_secret_but_not_the_stores_text(kfp_api, backend):
    """The store's feature_store.yaml reaches the steps mounted from its
    ConfigMap (tests/unit/test_pipeline_ir.py), never as a run parameter."""
    store_text = '{"config": "registry: postgresql://feast:hunter2@db/registry"}'
    submitted = RunRequest(name="ns-fraud-abc", pipeline="training", arguments={
        "spec": SPEC.to_json(), "owner": "ns/fraud", "spec_hash": "abc", "feature_store": store_text})
    run = kfp_api.runs[backend.submit(submitted).run_id]
    params = run["runtime_config"]["parameters"]
    assert params["git_sha"] == "1a2b3c" and "feature_store" not in params
    executors = run["pipeline_spec"]["pipeline_spec"]["deploymentSpec"]["executors"]
    assert {e["container"]["image"] for e in executors.values()} == {"registry.example/components:1a2b3c"}
    platform = run["pipeline_spec"]["platform_spec"]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert platform["exec-register"]["secretAsEnv"][0]["secretName"] == "mlflow-credentials"
    assert "hunter2" not in str(run)


def test_states_and_outcomes(kfp_api, backend):
    run_id = backend.submit(request()).run_id
    kfp_api.set_state(run_id, "RUNNING")
    assert backend.status(run_id).phase == "Running"
    kfp_api.set_state(run_id, "SUCCEEDED")
    done = backend.status(run_id)
    assert done.phase == "Succeeded" and done.outputs["model"]["version"] == "4"
    other = backend.submit(request("ns-other-def")).run_id
    kfp_api.set_state(other, "FAILED", error="step train: OOMKilled")
    assert backend.status(other).error == "step train: OOMKilled"


def test_success_without_a_registered_model_is_a_failure(kfp_api, backend):
    run_id = backend.submit(request("ns-empty-000")).run_id
    kfp_api.set_state(run_id, "SUCCEEDED")
    status = backend.status(run_id)
    assert status.phase == "Failed" and "registered nothing" in status.error


def test_cancel_terminates(kfp_api, backend):
    run_id = backend.submit(request()).run_id
    backend.cancel(run_id)
    assert kfp_api.runs[run_id]["state"] == "CANCELED"
    assert backend.status(run_id).phase == "Failed"


def test_an_unreachable_server_is_unavailable_not_a_crash(kfp_api, backend):
    kfp_api.down = True
    with pytest.raises(BackendUnavailable):
        backend.submit(request())
    kfp_api.down = False
    assert backend.submit(request()).phase == "Pending"
