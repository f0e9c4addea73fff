"""The drift -> retrain -> optimise -> gate -> canary -> promote steps of an
InferenceService, with in-memory ports and a clock the test moves."""

from __future__ import annotations

import json

import pytest

from kubeloop.api.refs import ObjectRef
from kubeloop.api.serving import InferenceServiceSpec, InferenceServiceStatus
from kubeloop.operator.ports import Ports
from kubeloop.operator.reconcilers.serving import reconcile_inference_service
from kubeloop.registry.memory import InMemoryRegistry
from kubeloop.registry.promotion import audit_trail
from tests.unit.fakes import FakeObjects, FakeTraffic, RecordingServing

SPEC = InferenceServiceSpec.model_validate({
    "model": {"name": "fraud", "alias": "champion"},
    "monitoring": {"schedule": "1m"},
    "retraining": {"template": {"modelName": "ignored", "features": {"featureViews": ["card_activity"], "labels": {"source": "transactions", "column": "is_fraud"}}},
                   "cooldown": "30m", "canaryDuration": "2m", "canaryPercent": 20, "lookback": "21d",
                   "optimization": {"techniques": ["onnx"]},
                   "promotion": {"promoteTo": "champion",
                                 "gates": {"metrics": [{"metric": "auc", "min": 0.8}]}}},
})


class Clock:
    def __init__(self):
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def world():
    registry = InMemoryRegistry()
    registry.add_version("fraud", "s3://1", tags={"metric.auc": "0.85"})
    registry.set_alias("fraud", "champion", "1")
    objects, serving, clock = FakeObjects(), RecordingServing(), Clock()
    ports = Ports(registry=registry, serving={"kubernetes": serving}, objects=objects, clock=clock,
                  traffic=FakeTraffic())
    return registry, objects, serving, clock, ports


def ref(alert: dict | None = None) -> ObjectRef:
    annotations = {"signals.kubeloop.dev/drift-alert": json.dumps(alert)} if alert else {}
    return ObjectRef("InferenceService", "ml", "fraud", "uid-1", 1, annotations)


ALERT = {"fingerprint": "abc", "startsAt": "2027-01-15T08:00:00Z"}


def step(ports, status, alert=ALERT):
    return reconcile_inference_service(ref(alert), SPEC, status, ports).status


def test_an_alert_becomes_one_retrain_whatever_the_redeliveries(world):
    registry, objects, serving, clock, ports = world
    status = step(ports, InferenceServiceStatus())
    jobs = [o for (k, _, _), o in objects.objects.items() if k == "TrainingJob"]
    assert len(jobs) == 1 and status.retraining.state == "Training"
    job = jobs[0]
    assert job["spec"]["modelName"] == "fraud"
    assert job["spec"]["features"]["window"] == {"start": "2026-12-25T08:00:00Z", "end": "2027-01-15T08:00:00Z"}
    assert job["spec"]["promotion"]["registerAs"] == "challenger" and "promoteTo" not in job["spec"]["promotion"]
    assert job["metadata"]["ownerReferences"][0]["kind"] == "InferenceService"
    assert job["metadata"]["labels"]["kubeloop.dev/retrain-of"] == "fraud"
    for _ in range(3):  # Alertmanager redelivers; the operator restarts and sees the same annotation
        status = step(ports, status)
    assert len([k for k in objects.objects if k[0] == "TrainingJob"]) == 1
    assert status.handled_alerts == ["abc@2027-01-15T08:00:00.000Z"]


def test_one_alert_spelt_two_ways_is_one_alert(world):
    """Alertmanager's webhook trims a time's trailing zeros (.36Z), its API
    does not (.360Z): redelivering what the API showed starts nothing new."""
    registry, objects, serving, clock, ports = world
    status = step(ports, InferenceServiceStatus(), alert={"fingerprint": "abc", "startsAt": "2027-01-15T08:00:00.36Z"})
    status = step(ports, status, alert={"fingerprint": "abc", "startsAt": "2027-01-15T08:00:00.360Z"})
    status = step(ports, status, alert={"fingerprint": "abc", "startsAt": "2027-01-15T09:00:00.360+01:00"})
    assert status.handled_alerts == ["abc@2027-01-15T08:00:00.360Z"]
    assert len([k for k in objects.objects if k[0] == "TrainingJob"]) == 1
    assert not any(c.type == "RetrainSuppressed" and c.reason == "Suppressed" for c in status.conditions)


def test_a_status_that_lost_the_retrain_takes_up_the_alerts_job_again(world):
    """A reconcile that raced the one which started the retrain wrote a status
    without it; the next one finds the alert's TrainingJob instead of setting
    the alert aside as over maxConcurrent (the demo once stalled so)."""
    registry, objects, serving, clock, ports = world
    started = step(ports, InferenceServiceStatus())
    status = step(ports, InferenceServiceStatus())
    assert status.retraining is not None and status.retraining.training_job == started.retraining.training_job
    assert status.retraining.state == "Training" and status.retrains == started.retrains
    assert not any(c.type == "RetrainSuppressed" and c.reason == "Suppressed" for c in status.conditions)
    assert len([k for k in objects.objects if k[0] == "TrainingJob"]) == 1


def test_a_second_alert_inside_the_cooldown_starts_nothing(world):
    registry, objects, serving, clock, ports = world
    status = step(ports, InferenceServiceStatus())
    objects.set_status("TrainingJob", "ml", status.retraining.training_job, phase="Failed")
    status = step(ports, status)
    assert status.retraining.state == "Failed"
    clock.now += 600
    status = step(ports, status, alert={"fingerprint": "abc", "startsAt": "2027-01-15T08:10:00Z"})
    assert len([k for k in objects.objects if k[0] == "TrainingJob"]) == 1
    suppressed = next(c for c in status.conditions if c.type == "RetrainSuppressed")
    assert suppressed.reason == "Suppressed" and "cooling down until" in suppressed.message
    clock.now += 1800
    status = step(ports, status, alert={"fingerprint": "abc", "startsAt": "2027-01-15T08:45:00Z"})
    assert len([k for k in objects.objects if k[0] == "TrainingJob"]) == 2


def test_train_optimise_gate_canary_promote(world):
    registry, objects, serving, clock, ports = world
    status = step(ports, InferenceServiceStatus())
    job = status.retraining.training_job
    registry.add_version("fraud", "s3://2", tags={"metric.auc": "0.86"})
    objects.set_status("TrainingJob", "ml", job, phase="Succeeded", model={"name": "fraud", "version": "2"})
    status = step(ports, status)
    assert status.retraining.state == "Optimizing"
    om = objects.get(None, "OptimizedModel", status.retraining.optimized_model, "ml")
    assert om["spec"]["source"] == {"name": "fraud", "version": "2"} and om["spec"]["registeredName"] == "fraud"
    registry.add_version("fraud", "s3://3", tags={"metric.auc": "0.86", "gate.champion.auc": "0.84"})
    objects.set_status("OptimizedModel", "ml", status.retraining.optimized_model, phase="Succeeded",
                       model={"name": "fraud", "version": "3"}, chosen={"technique": "onnx"})
    status = step(ports, status)
    assert status.retraining.state == "Canary" and status.retraining.challenger == "3"
    assert registry.get_alias("fraud", "challenger").version == "3"
    status = step(ports, status)
    served = {v.role: (v.model.version, v.percent) for v in serving.requests[-1].versions}
    assert served == {"primary": ("1", 80), "canary": ("3", 20)}
    assert registry.get_alias("fraud", "champion").version == "1", "not before the canary period"
    assert status.rollout.phase == "Progressing" and status.rollout.weight == 20
    clock.now += 121
    status = step(ports, status)  # the one-step rollout's analysis passes, its time has run
    assert status.rollout.phase == "Promoted" and "promoted after 1 step(s)" in status.rollout.message
    status = step(ports, status)  # the retrain reads its rollout's verdict
    assert status.retraining.state == "Promoted"
    assert registry.get_alias("fraud", "champion").version == "3"
    trail = audit_trail(registry, "fraud")
    assert trail[-1].action == "promote" and trail[-1].by == "InferenceService ml/fraud"
    status = step(ports, status)
    assert status.model_version == "3" and status.canary_version is None


def test_a_failed_gate_leaves_the_champion(world):
    registry, objects, serving, clock, ports = world
    status = step(ports, InferenceServiceStatus())
    registry.add_version("fraud", "s3://2", tags={"metric.auc": "0.70"})
    objects.set_status("TrainingJob", "ml", status.retraining.training_job, phase="Succeeded",
                       model={"name": "fraud", "version": "2"})
    status = step(ports, status)
    registry.add_version("fraud", "s3://3", tags={"metric.auc": "0.70"})
    objects.set_status("OptimizedModel", "ml", status.retraining.optimized_model, phase="Succeeded",
                       model={"name": "fraud", "version": "3"})
    status = step(ports, status)
    assert status.retraining.state == "GateFailed" and "auc in [0.8, None]: FAIL" in status.retraining.message
    assert registry.get_alias("fraud", "champion").version == "1"
    assert audit_trail(registry, "fraud")[-1].action == "reject"
    assert [v.role for v in serving.requests[-1].versions] == ["primary"]


def test_a_canary_that_is_rolled_back_ends_the_retrain(world):
    registry, objects, serving, clock, ports = world
    status = step(ports, InferenceServiceStatus())
    registry.add_version("fraud", "s3://2", tags={"metric.auc": "0.9", "gate.champion.auc": "0.85"})
    objects.set_status("TrainingJob", "ml", status.retraining.training_job, phase="Succeeded",
                       model={"name": "fraud", "version": "2"})
    status = step(ports, status)
    objects.set_status("OptimizedModel", "ml", status.retraining.optimized_model, phase="Succeeded",
                       model={"name": "fraud", "version": "2"})
    status = step(ports, status)
    assert status.retraining.state == "Canary"
    status = status.model_copy(update={"rolled_back_version": "2"})
    status = step(ports, status)
    assert status.retraining.state == "RolledBack" and registry.get_alias("fraud", "champion").version == "1"


@pytest.mark.parametrize("raw", ["{not json", "[1, 2]", '"text"'])
def test_an_annotation_that_is_not_a_json_object_is_a_condition_not_a_failing_reconcile(world, raw):
    """Local and cluster: a hand edit of the drift-alert annotation made every reconcile raise."""
    registry, objects, serving, clock, ports = world
    broken = ObjectRef("InferenceService", "ml", "fraud", "uid-1", 1, {"signals.kubeloop.dev/drift-alert": raw})
    status = reconcile_inference_service(broken, SPEC, InferenceServiceStatus(), ports).status
    cond = next(c for c in status.conditions if c.type == "DriftAlert")
    assert cond.status == "False" and cond.reason == "InvalidAnnotation"
    assert "signals.kubeloop.dev/drift-alert" in cond.message
    assert status.phase == "Ready" and not [k for k in objects.objects if k[0] == "TrainingJob"]


@pytest.mark.parametrize("limit, started", [(1, False), (2, True)])
def test_max_concurrent_counts_the_retrains_already_running(world, limit, started):
    """A retrain this status does not track (started before its status was
    lost) still counts against spec.retraining.maxConcurrent."""
    registry, objects, serving, clock, ports = world
    objects.apply({"apiVersion": "kubeloop.dev/v1alpha1", "kind": "TrainingJob",
                   "metadata": {"name": "fraud-retrain-earlier", "namespace": "ml",
                                "labels": {"kubeloop.dev/retrain-of": "fraud"}}, "spec": {}})
    data = SPEC.model_dump(by_alias=True, exclude_none=True)
    data["retraining"]["maxConcurrent"] = limit
    status = reconcile_inference_service(ref(ALERT), InferenceServiceSpec.model_validate(data),
                                         InferenceServiceStatus(), ports).status
    assert len([k for k in objects.objects if k[0] == "TrainingJob"]) == (2 if started else 1)
    condition = next(c for c in status.conditions if c.type == "RetrainSuppressed")
    if started:
        assert condition.reason == "Started"
    else:
        assert condition.reason == "Suppressed" and "1 retrain(s) running (maxConcurrent 1)" in condition.message
