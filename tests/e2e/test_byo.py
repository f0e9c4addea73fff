"""Bring your own features, labels, model and task, through the operator on
the live control plane with the local backends (kfp's local runner, MLflow,
the local tritonserver behind the router, the local drift job). These prove
the local path; the cluster path of the same resources is not exercised here.

The second team is examples/maintenance: its own Feast repository (machines
and sites, not cards and merchants), named by a ConfigMap; its own PyTorch
module from a folder; a multiclass task.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import requests
import yaml
from mlflow import MlflowClient

from kubeloop.api.constants import API_VERSION
from kubeloop.api.signature import ModelSignature
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
MAINTENANCE = REPO / "examples" / "maintenance"
BYO_FRAUD = REPO / "examples" / "byo-fraud"


def example(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def tree_digest(folder: Path) -> str:
    """Every file's name and bytes under the folder."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def prepare():
    from examples.maintenance import prepare

    return prepare


@pytest.fixture
def operator(platform, namespace, start_operator, tmp_path):
    env = platform.env()
    op = start_operator([namespace], KUBELOOP_REGISTRY="mlflow", MLFLOW_TRACKING_URI=env["MLFLOW_TRACKING_URI"],
                        KUBELOOP_FEAST_REPO=env["KUBELOOP_FEAST_REPO"], KUBELOOP_PIPELINE_BACKENDS="local,noop",
                        KUBELOOP_PIPELINE_BACKEND="local", KUBELOOP_SERVING_BACKENDS="local",
                        KUBELOOP_SERVING_BACKEND="local", KUBELOOP_REQUEST_LOG=str(tmp_path / "requests"))
    op.wait_for_log("Initial authentication has finished")
    return op


def named(obj: dict, namespace: str, name: str, model: str | None = None) -> dict:
    obj = copy.deepcopy(obj)
    obj["metadata"] = {"name": name, "namespace": namespace}
    if model and "modelName" in obj["spec"]:
        obj["spec"]["modelName"] = model
    return obj


def phase_of(kube, kind: str, namespace: str, name: str, phases=("Succeeded", "Failed"), timeout: float = 420):
    return wait_for(lambda: (o := kube.get(API_VERSION, kind, name, namespace)) and
                    o.get("status", {}).get("phase") in phases and o, timeout=timeout, interval=1,
                    what=f"{kind} {name} in {phases}")


def condition(obj: dict, kind: str) -> dict:
    return next(c for c in obj["status"]["conditions"] if c["type"] == kind)


def infer(url: str, model: str, rows: np.ndarray) -> requests.Response:
    body = {"inputs": [{"name": "features", "shape": list(rows.shape), "datatype": "FP32", "data": rows.tolist()}]}
    return requests.post(f"{url}/v2/models/{model}/infer", json=body, timeout=10)


def test_a_second_team_trains_optimises_serves_and_watches_its_own_multiclass_model(
        platform, kube, kubectl, namespace, operator, prepare, tmp_path):
    from kubeloop.featurestore.store import StoreLocation
    from kubeloop.story.traffic import feature_rows

    tracking = platform.env()["MLFLOW_TRACKING_URI"]
    client = MlflowClient(tracking)
    repo = prepare.prepare(tmp_path / "maintenance").repo
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(prepare.configmap(repo)))
    before = tree_digest(repo)
    model = f"{namespace}-faults"

    job = named(example(MAINTENANCE / "trainingjob.yaml"), namespace, "faults", model)
    job["spec"]["model"]["path"] = str(MAINTENANCE / "model")
    kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
    trained = phase_of(kube, "TrainingJob", namespace, "faults")
    assert trained["status"]["phase"] == "Succeeded", trained["status"]
    assert condition(trained, "FeatureStoreResolved")["reason"] == "ConfigMap"
    metrics = trained["status"]["metrics"]
    assert {"accuracy", "macro_f1", "log_loss", "top_k_accuracy"} <= set(metrics) and "auc" not in metrics
    assert any(k.startswith("recall.") for k in metrics) and metrics["macro_f1"] > 0.5
    version = client.get_model_version(model, trained["status"]["model"]["version"])
    signature = ModelSignature.from_tags(version.tags)
    assert signature.task == "multiclass" and signature.output_name == "probabilities"
    assert sorted(signature.classes) == ["bearing", "imbalance", "none", "overheating"]
    assert signature.entities == ["machine_id", "site_id"] and set(signature.request_columns) == {"load_pct", "rpm"}
    assert version.tags["kubeloop.factory"] == "maintenance_model:build"
    assert StoreLocation.from_json(version.tags["kubeloop.feature_store"]).config is not None
    # Gated on macro_f1 and promoted; kubeloop wrote nothing into the team's repository.
    assert client.get_model_version_by_alias(model, "champion").version == version.version
    assert tree_digest(repo) == before

    optimized = named(example(MAINTENANCE / "optimizedmodel.yaml"), namespace, "faults-cpu")
    optimized["spec"]["source"]["name"] = model
    kubectl("apply", "-f", "-", input=yaml.safe_dump(optimized))
    done = phase_of(kube, "OptimizedModel", namespace, "faults-cpu")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    chosen = done["status"]["chosen"]["technique"]
    winner = next(v for v in done["status"]["variants"] if v["technique"] == chosen)
    assert winner["accepted"] and winner["reason"] == "winner"
    served = client.get_model_version(model, done["status"]["model"]["version"])
    assert ModelSignature.from_tags(served.tags) == signature

    service = named(example(MAINTENANCE / "inferenceservice.yaml"), namespace, "faults")
    service["spec"]["model"] = {"name": model, "version": served.version}
    kubectl("apply", "-f", "-", input=yaml.safe_dump(service))
    ready = phase_of(kube, "InferenceService", namespace, "faults", phases=("Ready",), timeout=120)
    url = ready["status"]["url"]
    location = StoreLocation(config=prepare.fill_config(repo))
    spec = example(MAINTENANCE / "trainingjob.yaml")["spec"]
    from kubeloop.api.training import TrainingJobSpec

    training_spec = TrainingJobSpec.model_validate(spec)
    normal = feature_rows(location, training_spec, signature.feature_columns, None, None, limit=600)
    answer = infer(url, model, normal[:5])
    assert answer.status_code == 200, answer.text
    output = answer.json()["outputs"][0]
    assert output["name"] == "probabilities" and output["shape"] == [5, 4]
    assert np.allclose(np.asarray(output["data"]).reshape(5, 4).sum(1), 1, atol=1e-4)

    # In-distribution traffic: the drift job runs and finds no drift.
    for start in range(0, len(normal), 20):
        assert infer(url, model, normal[start:start + 20]).status_code == 200
    calm = wait_for(lambda: (d := kube.get(API_VERSION, "InferenceService", "faults", namespace)["status"]
                             .get("drift", {})) and d.get("rows", 0) >= 100 and d, timeout=120, interval=2,
                    what="a drift run over the in-distribution requests")
    assert calm["drifted"] is False, calm

    # A drifted week: the same views, hotter sites and a rougher fleet.
    period = prepare.append_period(repo, days=7, drifted=True)
    drifted = feature_rows(location, training_spec, signature.feature_columns, period.period.start, None,
                           limit=1500)
    for start in range(0, len(drifted), 50):
        assert infer(url, model, drifted[start:start + 50]).status_code == 200
    moved = wait_for(lambda: (d := kube.get(API_VERSION, "InferenceService", "faults", namespace)["status"]
                              .get("drift", {})) and d.get("drifted") and d, timeout=150, interval=2,
                     what="the drift job to find the drifted week")
    assert moved["featuresDrifted"] and moved["rows"] > calm["rows"]


def test_a_binary_job_trains_the_teams_own_module_from_a_folder(platform, kube, kubectl, namespace, operator):
    client = MlflowClient(platform.env()["MLFLOW_TRACKING_URI"])
    model = f"{namespace}-wide-deep"
    job = named(example(BYO_FRAUD / "trainingjob.yaml"), namespace, "wide-deep", model)
    job["spec"]["model"]["path"] = str(BYO_FRAUD / "model")
    job["spec"]["hyperparameters"]["epochs"] = 2
    kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
    done = phase_of(kube, "TrainingJob", namespace, "wide-deep")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert done["status"]["metrics"]["auc"] > 0.7
    version = client.get_model_version(model, done["status"]["model"]["version"])
    assert version.tags["kubeloop.factory"] == "fraud_model:build" and version.tags["kubeloop.task"] == "binary"
    run = client.get_run(version.run_id)
    assert json.loads(run.data.tags["model.parameters"]) == job["spec"]["model"]["parameters"]


BROKEN = {
    "nosuchmodule:build": "cannot import nosuchmodule",
    "fraud_model:explode": "raised",
    "fraud_model:three_outputs": "must answer [batch, 1]",
}


def test_broken_factories_and_labels_fail_with_their_names(platform, kube, kubectl, namespace, operator, tmp_path):
    """Each is a Failed TrainingJob whose condition names the factory or the
    column, nothing is registered, and the operator carries on."""
    client = MlflowClient(platform.env()["MLFLOW_TRACKING_URI"])
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "fraud_model.py").write_text(
        (BYO_FRAUD / "model" / "fraud_model.py").read_text()
        + "\n\ndef explode(n_inputs, n_outputs, **parameters):\n    raise RuntimeError('out of team quota')\n"
        + "\n\ndef three_outputs(n_inputs, n_outputs, **parameters):\n    return build(n_inputs, 3, **parameters)\n")
    base = example(BYO_FRAUD / "trainingjob.yaml")
    jobs = {}
    for i, (factory, message) in enumerate(BROKEN.items()):
        job = named(base, namespace, f"broken-{i}", f"{namespace}-broken-{i}")
        job["spec"]["model"].update(factory=factory, path=str(folder))
        jobs[job["metadata"]["name"]] = (job, [factory, message])
    label = named(base, namespace, "no-label", f"{namespace}-no-label")
    label["spec"].pop("model")
    label["spec"]["features"]["labels"]["column"] = "is_chargeback"
    jobs["no-label"] = (label, ["spec.features.labels", "no column is_chargeback"])
    for job, _ in jobs.values():
        kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
    for name, (job, expected) in jobs.items():
        done = phase_of(kube, "TrainingJob", namespace, name, timeout=300)
        assert done["status"]["phase"] == "Failed", (name, done["status"])
        message = condition(done, "RunSucceeded")["message"]
        for text in expected:
            assert text in message, (name, message)
        assert not client.search_model_versions(f"name = '{job['spec']['modelName']}'")

    healthy = named(base, namespace, "after", f"{namespace}-after")
    healthy["spec"]["backend"] = "noop"
    kubectl("apply", "-f", "-", input=yaml.safe_dump(healthy))
    assert phase_of(kube, "TrainingJob", namespace, "after", timeout=60)["status"]["phase"] == "Succeeded"
    assert operator.running()
