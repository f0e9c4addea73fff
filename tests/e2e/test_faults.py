"""Faults injected into real components, and what the platform loses: the
operator stopped gracefully mid-run, the API server restarted, MLflow
stopped, tritonserver killed. Every test here runs the local backends (local
pipelines, local Triton) against the live control plane; none is evidence
for the cluster backends.

One TrainingJob's run (about five minutes here: four steps, each a fresh
Python process) goes through the first three faults in turn, so the suite
trains once for all of them."""

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
from tests.support.forked import forked_steps, held
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_one_run_through_a_graceful_restart_an_api_server_restart_and_two_mlflow_outages(
        platform, kube, namespace, local_operator):
    """Local backends, in the order a run meets them:

    1. SIGTERM to the operator while the run trains (a rolling update). Before, the
       worker had inherited the operator's PROMETHEUS_MULTIPROC_DIR, which feast
       removes when the operator exits normally, and the next step failed.
    2. kube-apiserver stopped and started while the run trains and while an
       InferenceService's Triton starts: one run, one Triton, one router.
    3. MLflow stopped while the steps write to it: they wait (before, the operator's
       fail-fast client settings reached them and the run failed in seconds).
    4. MLflow stopped while the operator promotes: a condition says so, and the
       promotion completes once MLflow is back, with one audit entry.
    """
    op = local_operator()
    job = training_job(namespace, "faults")
    job["spec"]["hyperparameters"]["epochs"] = 20
    job["spec"]["promotion"] = {"registerAs": "challenger", "promoteTo": "champion",
                                "gates": {"metrics": [{"metric": "auc", "min": 0.5}]}}
    model = job["spec"]["modelName"]
    kube.create(job)

    def job_status() -> dict:
        return status_of(kube, "TrainingJob", namespace, "faults")

    def progress() -> str:
        return run_state(op.work, job_status()).get("progress") or ""

    # The train step is held (SIGSTOP) through parts 1 and 2, so that it
    # outlasts them on any machine: sixty epochs had ended before part 3 on a
    # fast one, and 240 had not reached part 3 in seven minutes on a slow one.
    wait_for(lambda: "step train" in progress(), timeout=300, interval=0.5, what="the run in its train step")
    run_id = job_status()["runId"]
    train = wait_for(lambda: forked_steps(platform.dir), timeout=60, interval=0.2, what="the train step forked")
    with held(train):
        # 1. A graceful restart while the run trains.
        op.stop()
        assert op.proc.returncode is not None
        op.start().wait_for_log("Initial authentication has finished", timeout=60)

        # 2. The API server restarted mid-training and mid-serving.
        served_model = registered_model(platform, namespace, "served")
        kube.create(inference_service(namespace, served_model))
        wait_for(lambda: "starting" in condition(status_of(kube, "InferenceService", namespace, "fraud"),
                                                 "Deployed").get("message", ""),
                 timeout=120, interval=0.2, what="Triton starting")
        assert run_state(op.work, job_status()).get("phase") == "Running"
        platform.restart_process("kube-apiserver")
        wait_for(kube.healthy, timeout=60, what="the API server back")

    # 3. MLflow stopped while the steps write to it.
    wait_for(lambda: "step evaluate" in progress() or "step register" in progress(), timeout=400, interval=0.2,
             what="the run reaching the steps that write to MLflow")
    worker_log = op.work / "runs" / run_id / "worker.log"

    def steps_meet_the_outage() -> None:
        wait_for(lambda: "Connection refused" in worker_log.read_text(errors="replace"), timeout=120,
                 interval=0.5, what="a step meeting the outage")
        # Hold the operator until the run has finished, so that its promotion
        # (not a reconcile that came first) is what meets the second outage.
        os.kill(op.pid, signal.SIGSTOP)

    uri = platform.env()["MLFLOW_TRACKING_URI"]
    try:
        platform.restart_process("mlflow", stopped=steps_meet_the_outage)
        wait_for(lambda: _healthy(uri), timeout=90, what="MLflow back")
        wait_for(lambda: run_state(op.work, job_status()).get("phase") in ("Succeeded", "Failed"), timeout=400,
                 interval=0.5, what="the run finished")
        assert run_state(op.work, job_status())["phase"] == "Succeeded", run_state(op.work, job_status())

        # 4. MLflow stopped while the operator promotes.
        def promotion_waits() -> None:
            os.kill(op.pid, signal.SIGCONT)
            wait_for(lambda: condition(job_status(), "Promoted").get("reason") == "RegistryUnavailable",
                     timeout=120, interval=0.5, what="the promotion waiting with a condition")

        platform.restart_process("mlflow", stopped=promotion_waits)
    finally:
        os.kill(op.pid, signal.SIGCONT)
    wait_for(lambda: _healthy(uri), timeout=90, what="MLflow back")

    done = wait_for(lambda: (s := job_status()) and condition(s, "Promoted").get("status") == "True" and s,
                    timeout=300, interval=1, what="promoted")
    assert done["phase"] == "Succeeded" and done["runId"] == run_id
    assert [p.name for p in (op.work / "runs").iterdir()] == [run_id]
    client = MlflowClient(uri)
    assert len(client.search_model_versions(f"name = '{model}'")) == 1
    assert client.get_model_version_by_alias(model, "champion").version == "1"
    assert [(e.action, e.alias, e.version) for e in audit_trail(MlflowRegistry(uri), model)] == [
        ("promote", "champion", "1")]
    served = wait_for(lambda: (s := status_of(kube, "InferenceService", namespace, "fraud")).get("phase") == "Ready"
                      and s, timeout=120, interval=0.5, what="serving")
    assert infer(served["url"], served_model).status_code == 200
    assert served_processes(op.work) == {"tritonserver": 1, "router": 1}
    assert op.running()


def _healthy(uri: str) -> bool:
    try:
        return requests.get(f"{uri}/health", timeout=2).ok
    except requests.RequestException:
        return False


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
        return any(e["reason"] == "ContainersFailing" and f"pid {triton.pid}) was not running: restarted it" in e["message"]
                   for e in kube.list("v1", "Event", namespace))

    wait_for(outage_event, timeout=60, what="the outage reported")
    back = wait_for(lambda: (s := status_of(kube, "InferenceService", namespace, "fraud")).get("phase") == "Ready"
                    and s, timeout=120, interval=0.5, what="serving again")
    assert condition(back, "Deployed")["status"] == "True"
    assert wait_for(lambda: infer(back["url"], model).status_code == 200, timeout=30, what="answers again")
    fresh = InstanceState.read(state_path).record("tritonserver")
    assert fresh.pid != triton.pid and fresh.running()
    assert served_processes(op.work) == {"tritonserver": 1, "router": 1}
