"""The operator SIGKILLed at random points while a TrainingJob trains, an
OptimizedModel optimises its model and an InferenceService serves it (local
backends: local pipelines, local Triton; the cluster backends are not
exercised here).

Scale: 8 kills, each after a random 3-20 s (seed printed), during a run of
the three examples shrunk to fit a shared two-core machine (2 epochs, two
optimisation techniques, batch sizes 1 and 8). The undisturbed run these are
compared with is what test_training, test_optimization and test_serving_local
check: the same phases and conditions, one registered version per object,
one Triton and one router."""

from __future__ import annotations

import copy
import random
import time
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from kubeloop.api.constants import API_VERSION
from kubeloop.registry.mlflow import MlflowRegistry
from kubeloop.registry.promotion import audit_trail
from tests.support.faults import condition, served_processes, status_of, training_job
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
KILLS = 8
OPTIMIZED = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "optimizedmodel.yaml").read_text())


def examples(namespace: str) -> tuple[dict, dict, dict]:
    job = training_job(namespace, "fraud")
    model = job["spec"]["modelName"]
    job["spec"]["promotion"] = {"registerAs": "challenger", "promoteTo": "champion",
                                "gates": {"metrics": [{"metric": "auc", "min": 0.5}]}}
    om = copy.deepcopy(OPTIMIZED)
    om["metadata"] = {"name": "fraud-cpu", "namespace": namespace}
    om["spec"].update(source={"name": model, "alias": "champion"}, techniques=["onnx", "dynamic-int8"],
                      batchSizes=[1, 8], registeredName=f"{model}-cpu",
                      latencySLO={"percentile": "p99", "milliseconds": 1000, "batchSize": 8},
                      promotion={"registerAs": "challenger"})
    isvc = {"apiVersion": API_VERSION, "kind": "InferenceService", "metadata": {"name": "fraud", "namespace": namespace},
            "spec": {"model": {"name": model, "alias": "champion"}, "backend": "local"}}
    return job, om, isvc


def test_the_operator_killed_at_random_points_converges_without_duplicates(platform, kube, namespace,
                                                                          local_operator):
    """Local: after 8 SIGKILLs, the examples end as an undisturbed run ends."""
    seed = random.SystemRandom().randrange(2**32)
    print(f"operator kill seed: {seed}")
    rng = random.Random(seed)
    op = local_operator()
    job, om, isvc = examples(namespace)
    for obj in (job, om, isvc):
        kube.create(obj)
    for _ in range(KILLS):
        _pause(op, rng.uniform(3, 20))  # the kill lands wherever the operator happens to be
        op.kill()
        op.start().wait_for_log("Initial authentication has finished", timeout=60)

    def phases() -> tuple:
        return (status_of(kube, "TrainingJob", namespace, "fraud").get("phase"),
                status_of(kube, "OptimizedModel", namespace, "fraud-cpu").get("phase"),
                status_of(kube, "InferenceService", namespace, "fraud").get("phase"))

    final = wait_for(lambda: (p := phases()) and all(x in ("Succeeded", "Failed", "Ready", "Degraded") for x in p)
                     and p, timeout=900, interval=2, what="every object finished")
    assert final == ("Succeeded", "Succeeded", "Ready"), [
        status_of(kube, kind, namespace, name).get("conditions")
        for kind, name in (("TrainingJob", "fraud"), ("OptimizedModel", "fraud-cpu"))]
    for kind, name in (("TrainingJob", "fraud"), ("OptimizedModel", "fraud-cpu"), ("InferenceService", "fraud")):
        status = status_of(kube, kind, namespace, name)
        assert condition(status, "Ready")["status"] == "True", (kind, status["conditions"])
    model = job["spec"]["modelName"]
    client = MlflowClient(platform.env()["MLFLOW_TRACKING_URI"])
    assert len(client.search_model_versions(f"name = '{model}'")) == 1
    assert len(client.search_model_versions(f"name = '{model}-cpu'")) == 1
    assert [(e.action, e.alias) for e in audit_trail(MlflowRegistry(platform.env()["MLFLOW_TRACKING_URI"]), model)] \
        == [("promote", "champion")]
    assert len(list((op.work / "runs").iterdir())) == 2, "one pipeline run per object"
    assert served_processes(op.work) == {"tritonserver": 1, "router": 1}


def _pause(op, seconds: float) -> None:  # noqa: ANN001 - OperatorProcess
    """Let the operator work for a while (chooses a kill point; nothing is checked after it)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and op.running():
        time.sleep(0.2)
