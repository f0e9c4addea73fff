"""The operator against the live control plane: status on every example,
and convergence without duplicates when it is killed midway."""

from __future__ import annotations


import pytest
from mlflow import MlflowClient

from kubeloop.api.constants import API_VERSION
from kubeloop.cli.demo import load_examples
from kubeloop.paths import repo_root
from kubeloop.operator.builders.pipelines import run_name, spec_hash
from kubeloop.api.refs import ObjectRef
from kubeloop.api.training import TrainingJobSpec
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e


def test_every_example_gets_status_conditions_within_seconds(kube, namespace, start_operator):
    examples = load_examples(repo_root() / "examples")
    assert {d["kind"] for d in examples} == {"TrainingJob", "OptimizedModel", "InferenceService"}
    op = start_operator([namespace])
    op.wait_for_log("Initial authentication has finished")
    for doc in examples:
        kube.create({**doc, "metadata": {**doc["metadata"], "namespace": namespace}})

    def all_reported():
        live = [kube.get(d["apiVersion"], d["kind"], d["metadata"]["name"], namespace) for d in examples]
        done = [o for o in live if o.get("status", {}).get("conditions")
                and o["status"].get("observedGeneration") == o["metadata"]["generation"]]
        return live if len(done) == len(live) else None

    live = wait_for(all_reported, timeout=20, what="conditions on every example")
    for obj in live:
        types = {c["type"] for c in obj["status"]["conditions"]}
        assert "Ready" in types, obj["kind"]
        assert obj["status"]["phase"]
    # kopf posts events from a queue of its own, after the status.
    wait_for(lambda: {e["involvedObject"]["kind"] for e in kube.list("v1", "Event", namespace)}
             >= {"TrainingJob", "OptimizedModel", "InferenceService"}, timeout=30, what="an event for every kind")


def _isvc(name: str, model: str) -> dict:
    return {"apiVersion": API_VERSION, "kind": "InferenceService", "metadata": {"name": name},
            "spec": {"model": {"name": model, "alias": "champion"}, "resources": {"cpu": "50m", "memory": "64Mi"}}}


def _training_job(name: str) -> dict:
    return {"apiVersion": API_VERSION, "kind": "TrainingJob", "metadata": {"name": name},
            "spec": {"modelName": "m", "backend": "noop", "features": {"featureViews": ["card_activity"], "labels": {"source": "transactions", "column": "is_fraud"}}}}


def _normalised(status: dict, name: str) -> dict:
    """A status with what legitimately differs between objects taken out."""
    out = {k: v for k, v in status.items() if k not in ("startedAt", "completedAt", "runId", "specHash")}
    out["conditions"] = sorted((c["type"], c["status"], c["reason"], c["message"].replace(name, "NAME"))
                               for c in status.get("conditions", []))
    for key in ("url", "grpcAddress"):
        if key in out:
            out[key] = out[key].replace(name, "NAME")
    return out


def test_killed_midway_the_operator_converges_without_duplicates(platform, kube, namespace, start_operator):
    model = f"e2e-{namespace}"
    client = MlflowClient(platform.env()["MLFLOW_TRACKING_URI"])
    client.create_registered_model(model)
    version = client.create_model_version(model, source=f"s3://models/{model}/1")
    client.set_registered_model_alias(model, "champion", version.version)
    env = {"KUBELOOP_REGISTRY": "mlflow", "MLFLOW_TRACKING_URI": platform.env()["MLFLOW_TRACKING_URI"]}

    count = 40
    names = [f"svc-{i:02d}" for i in range(count)]
    for name in names:
        kube.create({**_isvc(name, model), "metadata": {"name": name, "namespace": namespace}})
        kube.create({**_training_job(f"job-{name}"), "metadata": {"name": f"job-{name}", "namespace": namespace}})

    op = start_operator([namespace], **env)
    # The operator's own start (imports, caches) comes first: a minute and more on a loaded two-core machine.
    wait_for(lambda: kube.list("apps/v1", "Deployment", namespace), timeout=180, interval=0.02,
             what="the first Deployment")
    op.kill()
    partial = len(kube.list("apps/v1", "Deployment", namespace))
    assert partial < count, "the kill came too late to interrupt anything"

    op2 = start_operator([namespace], **env)

    def converged():
        services = [kube.get(API_VERSION, "InferenceService", n, namespace) for n in names]
        jobs = [kube.get(API_VERSION, "TrainingJob", f"job-{n}", namespace) for n in names]
        ok = all(s.get("status", {}).get("phase") == "Ready" for s in services) and all(
            j.get("status", {}).get("phase") == "Succeeded" for j in jobs)
        return (services, jobs) if ok else None

    services, jobs = wait_for(converged, timeout=300, what="every object converged")

    deployments = kube.list("apps/v1", "Deployment", namespace)
    svcs = kube.list("v1", "Service", namespace)
    assert sorted(d["metadata"]["name"] for d in deployments) == sorted(f"{n}-predictor" for n in names)
    assert sorted(s["metadata"]["name"] for s in svcs) == sorted(names)
    for d in deployments:
        owners = d["metadata"]["ownerReferences"]
        assert len(owners) == 1 and owners[0]["kind"] == "InferenceService" and owners[0]["controller"]
    for job in jobs:
        ref = ObjectRef.from_meta("TrainingJob", job["metadata"])
        digest = spec_hash(TrainingJobSpec.model_validate(job["spec"]))
        assert job["status"]["runId"] == run_name(ref, digest)

    # A control object that no kill ever touched ends in the same state.
    kube.create({**_isvc("control", model), "metadata": {"name": "control", "namespace": namespace}})
    control = wait_for(lambda: (o := kube.get(API_VERSION, "InferenceService", "control", namespace))
                       and o.get("status", {}).get("phase") == "Ready" and o, timeout=30, what="control Ready")
    expected = _normalised(control["status"], "control")
    for svc in services:
        assert _normalised(svc["status"], svc["metadata"]["name"]) == expected
    assert op2.running()
