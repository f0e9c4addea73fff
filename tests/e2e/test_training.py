"""TrainingJob end to end: the operator runs the Kubeflow pipeline with kfp's
local runner, and MLflow ends up with a registered version and its lineage."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from kubeloop.api.constants import API_VERSION
from kubeloop.components.bottleneck import VERDICTS
from tests.support.faults import training_job as job
from tests.support.forked import ForkLog
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def operator(platform, namespace, start_operator):
    env = platform.env()
    op = start_operator([namespace], KUBELOOP_REGISTRY="mlflow", MLFLOW_TRACKING_URI=env["MLFLOW_TRACKING_URI"],
                        KUBELOOP_FEAST_REPO=env["KUBELOOP_FEAST_REPO"], KUBELOOP_PIPELINE_BACKENDS="local,noop",
                        KUBELOOP_PIPELINE_BACKEND="local")
    op.wait_for_log("Initial authentication has finished")
    return op


def get(kube, namespace, name):
    return kube.get(API_VERSION, "TrainingJob", name, namespace)


def finished(kube, namespace, name, timeout=300):
    return wait_for(lambda: (o := get(kube, namespace, name)) and o.get("status", {}).get("phase")
                    in ("Succeeded", "Failed") and o, timeout=timeout, interval=1, what=f"{name} finished")


def test_example_trains_registers_and_does_not_train_twice(platform, kube, kubectl, namespace, operator):
    fork_log = ForkLog(platform.dir)
    client = MlflowClient(platform.env()["MLFLOW_TRACKING_URI"])
    obj = job(namespace, "fraud")
    model_name = obj["spec"]["modelName"]
    kubectl("apply", "-f", "-", input=yaml.safe_dump(obj))
    running = wait_for(lambda: (o := get(kube, namespace, "fraud")) and o.get("status", {}).get("phase") == "Running"
                       and o, timeout=60, what="the run started")
    # Killed while the pipeline runs: the restarted operator follows the same
    # run (recorded in status, found again by name) instead of starting another.
    operator.kill()
    operator.start().wait_for_log("Initial authentication has finished")
    done = finished(kube, namespace, "fraud")
    status = done["status"]
    assert status["runId"] == running["status"]["runId"]
    assert status["phase"] == "Succeeded", status
    assert status["model"] == {**status["model"], "name": model_name, "version": "1"}
    assert status["metrics"]["auc"] > 0.7
    assert status["runUrl"].startswith("file://") and status["model"]["runUrl"].startswith("http://127.0.0.1")
    version = client.get_model_version(model_name, "1")
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert version.tags["git_sha"].startswith(sha)
    assert version.tags["run_id"] == version.run_id
    assert len(version.tags["dataset_hash"]) == 16
    assert set(json.loads(version.tags["feature_views"])) == set(obj["spec"]["features"]["featureViews"])
    assert version.tags["kubeloop.pipeline_run"] == status["runId"]
    assert client.get_model_version_by_alias(model_name, "challenger").version == "1"
    run = client.get_run(version.run_id)
    assert run.data.tags["env.torch"] and run.data.params["hyperparameters.epochs"] == "2"
    assert float(run.data.tags["dataset.dropped_by_ttl"]) > 0
    # Where the run's time went: a verdict, shares that add up, the report and the profiler's trace.
    assert run.data.tags["bottleneck.verdict"] in VERDICTS
    shares = [run.data.metrics[f"bottleneck.{k}_share"] for k in ("loader", "copy", "step", "other")]
    assert sum(shares) == pytest.approx(1.0, abs=1e-6)
    assert {a.path for a in client.list_artifacts(version.run_id, "bottleneck")} == {
        "bottleneck/bottleneck.json", "bottleneck/trace.json.gz"}

    # Reproduced from its lineage by the CLI: the same rows (dataset hash),
    # auc within the stated 0.01, and nothing registered (checked below).
    reproduced = subprocess.run([sys.executable, "-m", "kubeloop.cli", "reproduce", model_name, "1", "--json",
                                 "--tolerance", "0.01"], capture_output=True, text=True, timeout=300,
                                env={**os.environ, **platform.env()})
    assert reproduced.returncode == 0, reproduced.stdout[-3000:] + reproduced.stderr[-3000:]
    report = json.loads(reproduced.stdout)
    assert report["dataset"] == {"name": "dataset hash", "recorded": version.tags["dataset_hash"],
                                 "now": version.tags["dataset_hash"], "changed": False}
    auc = next(m for m in report["metrics"] if m["name"] == "auc")
    assert auc["checked"] and auc["delta"] <= 0.01 and report["verdict"] == "reproduced"
    assert client.get_run(report["run_id"]).data.tags["kubeloop.reproduces"] == f"{model_name}/1"

    # The same spec again: no new run, no new version (nor from the reproduction).
    kubectl("apply", "-f", "-", input=yaml.safe_dump(obj))
    kubectl("annotate", "-n", namespace, "trainingjob", "fraud", "touched=yes")
    operator.stop()
    # A restarted operator reconciles the object again: it resumes it, or, when
    # the stopped one had not yet handled the annotation, updates it (seen in CI).
    operator.start()
    wait_for(lambda: "Resuming is processed" in operator.log() or "Updating is processed" in operator.log(),
             timeout=60, what="the restarted operator reconciling the object")
    again = get(kube, namespace, "fraud")
    assert again["status"]["runId"] == status["runId"]
    assert len(client.search_model_versions(f"name = '{model_name}'")) == 1

    # A changed spec trains again and registers version 2.
    obj["spec"]["seed"] = 43
    kubectl("apply", "-f", "-", input=yaml.safe_dump(obj))
    wait_for(lambda: get(kube, namespace, "fraud")["status"].get("runId") != status["runId"], timeout=30,
             what="a new run")
    changed = finished(kube, namespace, "fraud")
    assert changed["status"]["phase"] == "Succeeded" and changed["status"]["model"]["version"] == "2"
    assert changed["status"]["observedGeneration"] == changed["metadata"]["generation"]
    # Local path: each run's five steps were forked from the platform's warm
    # interpreter (kubeloop.forkserver), through both operator restarts.
    forked = fork_log.since()
    assert len(re.findall(r"kfp.dsl.executor_main \(pid \d+\) exited with 0\n", forked)) >= 10, forked


def test_a_failing_step_fails_the_job_and_the_operator_carries_on(kube, kubectl, namespace, operator):
    broken = job(namespace, "broken")
    broken["spec"]["features"]["featureViews"] = ["card_activity", "does_not_exist"]
    kubectl("apply", "-f", "-", input=yaml.safe_dump(broken))
    done = finished(kube, namespace, "broken", timeout=180)
    assert done["status"]["phase"] == "Failed"
    cond = next(c for c in done["status"]["conditions"] if c["type"] == "RunSucceeded")
    assert cond["reason"] == "PipelineFailed"
    assert "step training-data" in cond["message"] and "'does_not_exist' is not a feature view" in cond["message"]
    # kopf posts events from a queue of its own, after the status.
    wait_for(lambda: any(e["type"] == "Warning" and "does_not_exist" in e["message"]
                         for e in kube.list("v1", "Event", namespace)), timeout=30, what="the Warning event")

    healthy = job(namespace, "after", backend="noop")
    kubectl("apply", "-f", "-", input=yaml.safe_dump(healthy))
    assert finished(kube, namespace, "after", timeout=30)["status"]["phase"] == "Succeeded"
    assert operator.running()
