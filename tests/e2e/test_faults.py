"""Faults injected into real components, and what the platform loses: the
API server restarted, MLflow stopped, tritonserver killed, the operator
stopped gracefully mid-run. Every test here runs the local backends (local
pipelines, local Triton) against the live control plane; none is evidence
for the cluster backends."""

from __future__ import annotations

import os
import signal

import pytest
import requests
from mlflow import MlflowClient

from kubeloop.registry.mlflow import MlflowRegistry
from kubeloop.registry.promotion import audit_trail
from kubeloop.serving.local import InstanceState
from tests.support.faults import (
    condition, infer, inference_service, registered_model, run_state, served_processes, status_of, training_job,
)
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_a_graceful_operator_restart_mid_run_keeps_training(platform, kube, namespace, local_operator):
    """Local backend. SIGTERM (a rolling update) while the run trains: before, the
    worker had inherited the operator's PROMETHEUS_MULTIPROC_DIR, which feast removes
    when the operator exits normally, and its next step failed with FileNotFoundError."""
    op = local_operator()
    kube.create(training_job(namespace, "graceful"))
    running = wait_for(lambda: (s := status_of(kube, "TrainingJob", namespace, "graceful"))
                       and "step train" in (run_state(op.work, s).get("progress") or "") and s,
                       timeout=240, interval=0.5, what="the run in its train step")
    op.stop()
    assert op.proc.returncode is not None
    op.start().wait_for_log("Initial authentication has finished", timeout=60)
    done = wait_for(lambda: (s := status_of(kube, "TrainingJob", namespace, "graceful"))
                    .get("phase") in ("Succeeded", "Failed") and s, timeout=400, interval=1, what="the run finished")
    assert done["phase"] == "Succeeded", condition(done, "RunSucceeded")
    assert done["runId"] == running["runId"]
    client = MlflowClient(platform.env()["MLFLOW_TRACKING_URI"])
    assert len(client.search_model_versions(f"name = '{namespace}-graceful'")) == 1


def test_a_killed_tritonserver_answers_503_fast_and_is_restarted(platform, kube, namespace, local_operator):
    """Local backend. The router answers 503 at once while Triton is gone; the operator
    restarts it, says so in the status (an event per transition), and serving resumes."""
    model = registered_model(platform, namespace, "triton")
    op = local_operator()
    kube.create(inference_service(namespace, model))
    ready = wait_for(lambda: (s := status_of(kube, "InferenceService", namespace, "fraud")).get("phase") == "Ready"
                     and s, timeout=180, interval=0.5, what="serving")
    assert infer(ready["url"], model).status_code == 200
    state_path = op.work / "serving" / f"{namespace}-fraud" / "state.json"
    triton = InstanceState.read(state_path).record("tritonserver")
    os.killpg(os.getpgid(triton.pid), signal.SIGKILL)
    wait_for(lambda: not triton.running(), timeout=10, what="tritonserver gone")

    answer = infer(ready["url"], model)
    assert answer.status_code == 503 and "unavailable" in answer.text

    def outage_event() -> bool:
        return any(e["reason"] == "RollingOut" and f"pid {triton.pid}) was not running: restarted it" in e["message"]
                   for e in kube.list("v1", "Event", namespace))

    wait_for(outage_event, timeout=60, what="the outage reported")
    back = wait_for(lambda: (s := status_of(kube, "InferenceService", namespace, "fraud")).get("phase") == "Ready"
                    and s, timeout=120, interval=0.5, what="serving again")
    assert condition(back, "Deployed")["status"] == "True"
    assert wait_for(lambda: infer(back["url"], model).status_code == 200, timeout=30, what="answers again")
    fresh = InstanceState.read(state_path).record("tritonserver")
    assert fresh.pid != triton.pid and fresh.running()
    assert served_processes(op.work) == {"tritonserver": 1, "router": 1}


def test_an_api_server_restart_mid_training_and_serving_converges_without_duplicates(
        platform, kube, namespace, local_operator):
    """Local backends. kube-apiserver is stopped and started while a TrainingJob's run
    trains and while an InferenceService's Triton starts: one run, one version, one
    Triton and one router."""
    model = registered_model(platform, namespace, "served")
    op = local_operator()
    kube.create(training_job(namespace, "apifault"))
    running = wait_for(lambda: (s := status_of(kube, "TrainingJob", namespace, "apifault")).get("runId") and s,
                       timeout=120, interval=0.5, what="the run submitted")
    kube.create(inference_service(namespace, model))
    wait_for(lambda: "starting" in condition(status_of(kube, "InferenceService", namespace, "fraud"),
                                             "Deployed").get("message", ""),
             timeout=120, interval=0.2, what="Triton starting")

    platform.restart_process("kube-apiserver")
    wait_for(kube.healthy, timeout=60, what="the API server back")

    done = wait_for(lambda: (s := status_of(kube, "TrainingJob", namespace, "apifault"))
                    .get("phase") in ("Succeeded", "Failed") and s, timeout=400, interval=1, what="training finished")
    assert done["phase"] == "Succeeded", condition(done, "RunSucceeded")
    assert done["runId"] == running["runId"]
    client = MlflowClient(platform.env()["MLFLOW_TRACKING_URI"])
    assert len(client.search_model_versions(f"name = '{namespace}-apifault'")) == 1
    assert len(list((op.work / "runs").iterdir())) == 1
    served = wait_for(lambda: (s := status_of(kube, "InferenceService", namespace, "fraud")).get("phase") == "Ready"
                      and s, timeout=120, interval=0.5, what="serving")
    assert infer(served["url"], model).status_code == 200
    assert served_processes(op.work) == {"tritonserver": 1, "router": 1}
    assert op.running()


def test_mlflow_stopped_during_registration_and_promotion(platform, kube, namespace, local_operator):
    """Local backends. MLflow goes away while the pipeline registers the model, and
    again while the operator promotes it: the object waits with a condition and
    finishes once MLflow is back, with one registered version and one audit entry."""
    op = local_operator()
    job = training_job(namespace, "mlfault")
    job["spec"]["promotion"] = {"registerAs": "challenger", "promoteTo": "champion",
                                "gates": {"metrics": [{"metric": "auc", "min": 0.5}]}}
    kube.create(job)
    model = job["spec"]["modelName"]

    def progress() -> str:
        return run_state(op.work, status_of(kube, "TrainingJob", namespace, "mlfault")).get("progress") or ""

    wait_for(lambda: "step evaluate" in progress() or "step register" in progress(), timeout=300, interval=0.2,
             what="the run reaching the steps that write to MLflow")
    status = status_of(kube, "TrainingJob", namespace, "mlfault")
    worker_log = op.work / "runs" / status["runId"] / "worker.log"

    def while_down() -> None:
        # The steps meet the outage (and say so in the run's log) before MLflow returns.
        wait_for(lambda: "Connection refused" in worker_log.read_text(errors="replace"), timeout=120,
                 interval=0.5, what="a step meeting the outage")

    platform.restart_process("mlflow", stopped=while_down)
    uri = platform.env()["MLFLOW_TRACKING_URI"]
    wait_for(lambda: requests.get(f"{uri}/health", timeout=2).ok, timeout=90, what="MLflow back")

    # Hold the operator while the run finishes, so its promotion meets the second outage.
    os.kill(op.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: run_state(op.work, status).get("phase") in ("Succeeded", "Failed"), timeout=300,
                 interval=0.5, what="the run finished")
        assert run_state(op.work, status)["phase"] == "Succeeded", run_state(op.work, status).get("error")

        def promotion_blocked() -> None:
            os.kill(op.pid, signal.SIGCONT)
            wait_for(lambda: condition(status_of(kube, "TrainingJob", namespace, "mlfault"), "Promoted")
                     .get("reason") == "RegistryUnavailable", timeout=120, interval=0.5,
                     what="the promotion waiting with a condition")

        platform.restart_process("mlflow", stopped=promotion_blocked)
    finally:
        os.kill(op.pid, signal.SIGCONT)
    wait_for(lambda: requests.get(f"{uri}/health", timeout=2).ok, timeout=90, what="MLflow back")
    done = wait_for(lambda: (s := status_of(kube, "TrainingJob", namespace, "mlfault"))
                    and condition(s, "Promoted").get("status") == "True" and s, timeout=300, interval=1,
                    what="promoted")
    assert done["phase"] == "Succeeded"
    client = MlflowClient(uri)
    assert len(client.search_model_versions(f"name = '{model}'")) == 1
    assert client.get_model_version_by_alias(model, "champion").version == "1"
    trail = audit_trail(MlflowRegistry(uri), model)
    assert [(e.action, e.alias, e.version) for e in trail] == [("promote", "champion", "1")]
