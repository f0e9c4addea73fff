"""The API server itself rejects invalid objects (schema and CEL), naming the field."""

from __future__ import annotations

import pytest
import yaml

pytestmark = pytest.mark.e2e


def isvc(**spec) -> dict:
    return {"apiVersion": "kubeloop.dev/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": "bad"}, "spec": {"model": {"name": "m", "alias": "champion"}, **spec}}


def tj(**spec) -> dict:
    base = {"modelName": "m", "features": {"featureViews": ["v"], "labels": {"source": "s", "column": "label"}}}
    return {"apiVersion": "kubeloop.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "bad"},
            "spec": {**base, **spec}}


CASES = [
    (isvc(gpu={"sharing": "mig", "mig": {"profile": "9g.99gb"}}),
     ["spec.gpu.mig.profile", "MIG profile 9g.99gb does not exist"]),
    (isvc(gpu={"sharing": "mig", "product": "NVIDIA-A100-SXM4-40GB", "mig": {"profile": "1g.20gb"}}),
     ["spec.gpu.mig.profile", "MIG profile 1g.20gb does not exist on NVIDIA-A100-SXM4-40GB"]),
    (isvc(features={"materializeEvery": "0s"}),
     ["spec.features.materializeEvery", "materializeEvery must be from 1s to 1d"]),
    (isvc(features={"materializeEvery": "2d"}),
     ["spec.features.materializeEvery", "materializeEvery must be from 1s to 1d"]),
    (isvc(canary={"alias": "challenger", "percent": 150}),
     ["spec.canary.percent", "less than or equal to 100"]),
    (isvc(model={"name": "m", "alias": "champion", "version": "3"}),
     ["spec.model.version", "set exactly one of version or alias"]),
    (isvc(autoscaling={"minReplicas": 5, "maxReplicas": 2}),
     ["spec.autoscaling.minReplicas", "minReplicas must not exceed maxReplicas"]),
    (isvc(retraining={"template": {"modelName": "m", "features": {"featureViews": ["v"], "labels": {"source": "transactions", "column": "is_fraud"}}}}),
     ["spec.retraining", "set monitoring too"]),
    ({"apiVersion": "kubeloop.dev/v1alpha1", "kind": "OptimizedModel", "metadata": {"name": "bad"},
      "spec": {"source": {"name": "m", "version": "1"}, "accuracyBudget": {"maxDrop": -0.1}}},
     ["spec.accuracyBudget.maxDrop", "greater than or equal to 0"]),
    ({"apiVersion": "kubeloop.dev/v1alpha1", "kind": "OptimizedModel", "metadata": {"name": "bad"},
      "spec": {"source": {"name": "m", "version": "1"}, "target": {"device": "cpu"},
               "techniques": ["tensorrt-fp16"]}},
     ["spec.techniques", "need target.device gpu"]),
    ({"apiVersion": "kubeloop.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "bad"},
      "spec": {"modelName": "m", "features": {"featureViews": ["v"], "labels": {"source": "transactions", "column": "is_fraud"}}, "tuning": {"trials": 5}}},
     ["spec.tuning.parameters", "needs at least one entry"]),
    (tj(task="regression", promotion={"promoteTo": "champion", "gates": {"metrics": [{"metric": "auc", "min": 0.7}]}}),
     ["spec.promotion.gates.metrics", "names a metric this task does not produce"]),
    (tj(task="binary", tuning={"metric": "rmse"}),
     ["spec.tuning.metric", "is not a metric of this task"]),
    (tj(task="ranking"), ["spec.task", "Unsupported value"]),
    (tj(validation={"rules": [{"column": "amount", "min": 10, "max": 1}]}),
     ["spec.validation.rules[0].min", "min must not exceed max"]),
    (tj(validation={"rules": [{"column": "amount"}]}),
     ["spec.validation.rules[0].column", "a rule needs at least one of maxNullShare, min, max or categories"]),
    (tj(task="regression", validation={"labelShare": {"min": 0.1}}),
     ["spec.validation.labelShare", "needs a classification task"]),
    (tj(validation={"mode": "ignore"}), ["spec.validation.mode", "Unsupported value"]),
    (tj(features={"featureViews": ["v"], "labels": {"source": "s", "path": "/data/l.parquet", "column": "label"}}),
     ["spec.features.labels.source", "give either source"]),
    (tj(features={"featureViews": ["v"], "labels": {"path": "/data/l.parquet", "column": "label"}}),
     ["spec.features.labels.timestampColumn", "timestampColumn is required with path"]),
    (tj(features={"featureViews": ["v"]}), ["spec.features.labels", "Required value"]),
    (tj(model={"factory": "no colon here"}), ["spec.model.factory", "should match"]),
    (tj(features={"featureViews": ["v"], "labels": {"source": "s", "column": "label"}, "store": {"configMap": {}}}),
     ["spec.features.store.configMap.name", "Required value"]),
]


@pytest.mark.parametrize("obj, expected", CASES, ids=[c[1][0] for c in CASES])
def test_invalid_objects_are_rejected_with_the_field_named(kubectl, namespace, obj, expected):
    result = kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj), check=False)
    assert result.returncode != 0
    for text in expected:
        assert text in result.stderr


@pytest.mark.parametrize("task, metric", [("multiclass", "recall.bearing"), ("multiclass", "macro_f1"),
                                          ("regression", "rmse"), ("binary", "auc")])
def test_each_task_accepts_its_own_gate_metrics(kubectl, namespace, task, metric):
    """Cluster path (the API server's CEL): a metric the task produces is accepted."""
    obj = tj(task=task, promotion={"promoteTo": "champion", "gates": {"metrics": [{"metric": metric, "min": 0.1}]}})
    obj["metadata"]["name"] = f"ok-{task}-{metric.replace('.', '-').replace('_', '-')}"
    kubectl("apply", "-n", namespace, "--dry-run=server", "-f", "-", input=yaml.safe_dump(obj))


def test_a_valid_object_is_accepted_and_defaulted(kubectl, kube, namespace):
    obj = isvc(gpu={"sharing": "mig", "product": "NVIDIA-H100-80GB-HBM3", "mig": {"profile": "1g.10gb"}})
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj))
    stored = kube.get("kubeloop.dev/v1alpha1", "InferenceService", "bad", namespace)
    assert stored["spec"]["replicas"] == 1
    assert stored["spec"]["requestLogging"] == {"enabled": True, "sampleRate": 1.0}
    assert stored["spec"]["runtime"]["protocol"] == "v2"
    assert stored["spec"]["features"] == {"missing": "default"}  # no schedule unless asked for
