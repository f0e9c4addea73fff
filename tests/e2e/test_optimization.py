"""OptimizedModel end to end: a trained model, every variant measured, the
winner registered with its Triton repositories; bad input named in a
condition with nothing registered."""

from __future__ import annotations

import json

import pytest
import yaml
from mlflow import MlflowClient

from kubeloop.api.constants import API_VERSION
from tests.support.faults import training_job
from tests.support.namespaces import create_namespace, delete_namespace
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e
OM_EXAMPLE = yaml.safe_load(open(__file__.replace("tests/e2e/test_optimization.py", "examples/optimizedmodel.yaml")))


@pytest.fixture(scope="module")
def trained(platform, kube, tmp_path_factory):
    """A namespace, an operator, and a model its TrainingJob registered."""
    namespace = create_namespace(kube)
    env = platform.env()
    work = tmp_path_factory.mktemp("operator")
    op = OperatorProcess(platform.kubeconfig, work, {
        "KUBELOOP_REGISTRY": "mlflow", "MLFLOW_TRACKING_URI": env["MLFLOW_TRACKING_URI"],
        "KUBELOOP_FEAST_REPO": env["KUBELOOP_FEAST_REPO"], "KUBELOOP_PIPELINE_BACKENDS": "local",
        "KUBELOOP_PIPELINE_BACKEND": "local", "KUBELOOP_RESYNC_SECONDS": "2", "KUBELOOP_WORK_DIR": str(work)},
        [namespace]).start()
    job = training_job(namespace, "fraud")
    job["spec"]["hyperparameters"]["epochs"] = 3
    del job["spec"]["promotion"]
    kube.create(job)
    done = wait_for(lambda: (o := kube.get(API_VERSION, "TrainingJob", "fraud", namespace))
                    and o.get("status", {}).get("phase") in ("Succeeded", "Failed") and o,
                    timeout=400, interval=1, what="training")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    yield {"namespace": namespace, "model": done["status"]["model"]["name"],
           "version": done["status"]["model"]["version"], "operator": op,
           "client": MlflowClient(env["MLFLOW_TRACKING_URI"])}
    op.stop()
    delete_namespace(kube, namespace)


def optimized_model(trained, name: str, **spec) -> dict:
    obj = json.loads(json.dumps(OM_EXAMPLE))
    obj["metadata"] = {"name": name, "namespace": trained["namespace"]}
    obj["spec"]["source"] = {"name": trained["model"], "version": trained["version"]}
    obj["spec"]["registeredName"] = f"{trained['model']}-{name}"
    obj["spec"].update(spec)
    return obj


def finished(kube, namespace, name, timeout=400):
    return wait_for(lambda: (o := kube.get(API_VERSION, "OptimizedModel", name, namespace))
                    and o.get("status", {}).get("phase") in ("Succeeded", "Failed") and o,
                    timeout=timeout, interval=1, what=f"{name} finished")


def test_variants_are_measured_and_the_winner_is_registered(kube, trained):
    ns = trained["namespace"]
    kube.create(optimized_model(trained, "cpu"))
    status = finished(kube, ns, "cpu")["status"]
    assert status["phase"] == "Succeeded", status
    variants = {v["technique"]: v for v in status["variants"]}
    measured = [v for v in variants.values() if "latencyP99Ms" in v]
    assert len(measured) >= 5, "the source and at least four techniques"
    winner = variants[status["chosen"]["technique"]]
    assert winner["accepted"] and winner["reason"] == "winner"
    # The selection rule, not a speed figure: how much faster is the benchmark's business.
    servable = [v for v in measured if v["accepted"] and not (v.get("reason") or "").startswith("accepted, but")]
    assert_selection_rule(winner, servable, variants["source"], condition(status, "VariantChosen"))
    assert winner["speedup"] == pytest.approx(variants["source"]["latencyP99Ms"] / winner["latencyP99Ms"], rel=0.02)
    assert status["chosen"]["speedupInterval"]["low"] <= status["chosen"]["speedup"] <= \
        status["chosen"]["speedupInterval"]["high"]
    assert winner["accuracyDelta"] >= -0.01
    assert status["gpuMemoryMib"] > 0 and "preferred" in status["batching"]
    model = status["model"]
    version = trained["client"].get_model_version(model["name"], model["version"])
    assert version.tags["kubeloop.source"] == f"{trained['model']}/{trained['version']}"
    assert version.tags["kubeloop.technique"] == status["chosen"]["technique"]
    assert version.tags["kubeloop.selection"] == condition(status, "VariantChosen")["message"]
    low, high = map(float, version.tags["kubeloop.speedup_interval"].split(".."))
    assert low <= float(version.tags["kubeloop.speedup"]) <= high
    experiment = trained["client"].get_run(version.run_id).info.experiment_id
    runs = trained["client"].search_runs([experiment], f"tags.mlflow.parentRunId = '{version.run_id}' and "
                                                       f"tags.kubeloop.technique = '{status['chosen']['technique']}'")
    logged = runs[0].data.metrics  # the winner's own run: each latency with its interval
    assert logged["p99_ms.b32.low"] <= logged["p99_ms.b32"] <= logged["p99_ms.b32.high"]
    assert int(version.tags["kubeloop.gpu_memory_mib"]) == status["gpuMemoryMib"]
    assert version.tags["kubeloop.gpu_memory_source"] == "estimate"
    artifacts = {a.path for a in trained["client"].list_artifacts(version.run_id, "triton")}
    assert artifacts == {"triton/python", "triton/onnxruntime"}

    # Measured on its own, so neither run's latencies are taken under the other's load.
    kube.create(optimized_model(trained, "lossless", techniques=["dynamic-int8", "static-int8", "onnx-int8",
                                                                  "structured-pruning", "distillation"],
                                accuracyBudget={"metric": "auc", "maxDrop": 0}))
    zero = finished(kube, ns, "lossless")["status"]
    assert zero["phase"] == "Succeeded", zero
    # Every technique here changes the model's numbers: none survives a zero budget.
    for v in zero["variants"]:
        if v["technique"] != "source":
            assert not v["accepted"] and "budget is 0" in v["reason"], v
    assert zero["chosen"]["technique"] == "source"


def condition(status: dict, kind: str) -> dict:
    return next(c for c in status["conditions"] if c["type"] == kind)


def assert_selection_rule(winner: dict, servable: list[dict], source: dict, chosen: dict) -> None:
    """A variant wins only when its p99 interval lies below the source's and
    every other contender's; where intervals overlap, the winner changes the
    predictions least of those overlapping the fastest; the condition says which."""
    def interval(v):
        return v["latencyP99IntervalMs"]["low"], v["latencyP99IntervalMs"]["high"]

    for v in servable:
        assert interval(v)[0] <= v["latencyP99Ms"] <= interval(v)[1], v
    fastest = min(servable, key=lambda v: v["latencyP99Ms"])
    if winner is source:
        assert chosen["reason"] == "NoVariantMeasurablyFaster", chosen
        assert interval(fastest)[1] >= interval(source)[0] or fastest is source
        return
    assert interval(winner)[1] < interval(source)[0], "a variant wins only below the source's interval"
    tied = [v for v in servable if v is not source and interval(v)[1] < interval(source)[0]
            and not (interval(v)[0] > interval(fastest)[1] or interval(fastest)[0] > interval(v)[1])]
    if len(tied) == 1:
        assert winner is fastest and chosen["reason"] == "MeasurablyFaster", chosen
    else:
        assert chosen["reason"] == "IntervalsOverlap" and "intervals overlap" in chosen["message"], chosen
        assert winner["divergence"] <= min(v["divergence"] for v in tied) + 1e-4, (winner, tied)


def test_a_missing_source_version_is_named_and_nothing_is_registered(kube, trained):
    ns = trained["namespace"]
    obj = optimized_model(trained, "missing")
    obj["spec"]["source"]["version"] = "99"
    kube.create(obj)

    def reported():
        o = kube.get(API_VERSION, "OptimizedModel", "missing", ns)
        return next((c for c in o.get("status", {}).get("conditions", []) if c["type"] == "SourceResolved"), None)

    cond = wait_for(reported, timeout=30, what="SourceResolved")
    assert cond["status"] == "False" and cond["reason"] == "SourceNotFound"
    assert f"models:/{trained['model']}/99" in cond["message"]
    assert trained["client"].search_model_versions(f"name = '{obj['spec']['registeredName']}'") == []


def test_a_technique_the_target_cannot_run_is_named(kube, trained):
    ns = trained["namespace"]
    obj = optimized_model(trained, "t4", target={"device": "gpu", "gpuProduct": "Tesla-T4"},
                          techniques=["onnx", "bf16", "sparsity-2to4"])
    kube.create(obj)

    def reported():
        o = kube.get(API_VERSION, "OptimizedModel", "t4", ns)
        return o if o.get("status", {}).get("phase") == "Failed" else None

    status = wait_for(reported, timeout=30, what="t4 failed")["status"]
    cond = next(c for c in status["conditions"] if c["type"] == "TechniquesSupported")
    assert cond["reason"] == "UnsupportedTechnique"
    assert "bf16 needs compute capability 8.0" in cond["message"] and "sparsity-2to4" in cond["message"]
    assert "runId" not in status
    assert trained["client"].search_model_versions(f"name = '{obj['spec']['registeredName']}'") == []


def test_an_optimisation_budget_on_a_metric_the_task_lacks_is_invalid(kube, trained):
    """Local path. An OptimizedModel's task is its source's: a regression-only
    metric on the binary source is an InvalidSpec condition, with nothing run."""
    obj = optimized_model(trained, "rmse", techniques=["onnx"], accuracyBudget={"metric": "rmse", "maxDrop": 0.1})
    kube.create(obj)
    status = finished(kube, trained["namespace"], "rmse", timeout=60)["status"]
    assert status["phase"] == "Failed"
    cond = condition(status, "TechniquesSupported")
    assert cond["reason"] == "InvalidSpec" and "spec.accuracyBudget.metric 'rmse'" in cond["message"]
    assert "runId" not in status
