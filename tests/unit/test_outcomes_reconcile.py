"""An InferenceService judged by its outcomes, through its reconcile with
in-memory ports: the outcome job it starts (ground truth, performance) and
what its result becomes in status; rollouts of spec.canary and of a
retrained version, aborted or promoted, and by hand. (Unit, no cluster:
the reconcile both backends share; the e2e tests prove each path.)"""

from __future__ import annotations

import json

import pytest

from kubeloop.api.refs import ObjectRef
from kubeloop.api.serving import InferenceServiceSpec, InferenceServiceStatus
from kubeloop.monitoring.outcomes.traffic import TrafficSample
from kubeloop.operator.ports import Ports
from kubeloop.operator.reconcilers.common import transition_events
from kubeloop.operator.reconcilers.outcomes import decayed, judged_metric, performance
from kubeloop.operator.reconcilers.serving import reconcile_inference_service
from kubeloop.registry.memory import InMemoryRegistry
from kubeloop.registry.promotion import audit_trail
from tests.unit.fakes import FakeObjects, FakeTraffic, RecordingServing

SIGNATURE = {"feature_columns": json.dumps(["a", "b"]), "task": "binary", "threshold": "0.4"}
SPEC = {
    "model": {"name": "fraud", "alias": "champion"},
    "monitoring": {"schedule": "1m", "groundTruth": {
        "location": "s3://labels/fraud", "keyColumn": "payment_id", "rowColumn": "line", "labelColumn": "chargeback",
        "timestampColumn": "known_at", "maxDelay": "2d"},
        "performance": {"metric": "auc", "maxDrop": 0.04, "window": "6h", "schedule": "2m", "minRows": 100}},
    "requestLogging": {"sampleRate": 0.5, "destination": "s3://requests/fraud"},
}
ROLLOUT = {"steps": [{"weight": 5, "duration": "1m"}, {"weight": 50, "duration": "1m"}],
           "analysis": {"maxErrorRateIncrease": 0.02, "maxLatencyRatio": 2.0, "maxDisagreement": 0.3,
                        "maxLossIncrease": 0.01, "alpha": 0.01, "minRequests": 40}}


class Jobs:
    """The outcome monitor port: records what it was asked to run; tests
    write the results its job would."""

    def __init__(self):
        self.started: list[dict] = []
        self.result: dict | None = None

    def running(self, ref):  # noqa: ANN001, ANN201
        return False

    def start(self, ref, job):  # noqa: ANN001, ANN201
        self.started.append(job)

    def latest(self, ref):  # noqa: ANN001, ANN201
        return self.result

    def forget(self, ref):  # noqa: ANN001, ANN201
        self.result = None


class Clock:
    now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def world():
    registry = InMemoryRegistry()
    registry.add_version("fraud", "s3://1", tags={**SIGNATURE, "metric.auc": "0.90"})
    registry.add_version("fraud", "s3://2", tags={**SIGNATURE, "metric.auc": "0.91"})
    registry.set_alias("fraud", "champion", "1")
    registry.set_alias("fraud", "challenger", "2")
    ports = Ports(registry=registry, serving={"kubernetes": RecordingServing()}, objects=FakeObjects(),
                  clock=Clock(), traffic=FakeTraffic(), outcomes=Jobs())
    return registry, ports


def ref(action: str | None = None) -> ObjectRef:
    return ObjectRef("InferenceService", "ml", "fraud", "uid-1", 1,
                     {"signals.kubeloop.dev/rollout": action} if action else {})


def spec(**extra) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate({**SPEC, **extra})


def reconcile(ports, spec_, status, action=None):  # noqa: ANN001, ANN201
    return reconcile_inference_service(ref(action), spec_, status, ports).status


def served(ports) -> dict:  # noqa: ANN001
    return {v.role: (v.model.version, v.percent) for v in ports.serving["kubernetes"].requests[-1].versions}


def test_the_outcome_job_gets_the_ground_truth_and_performance_as_written(world):
    registry, ports = world
    status = reconcile(ports, spec(), InferenceServiceStatus())
    job = ports.outcomes.started[-1]
    assert job["labels"] == "s3://labels/fraud" and job["request_log"] == "s3://requests/fraud"
    assert job["ground_truth"] == {"key_column": "payment_id", "row_column": "line", "label_column": "chargeback",
                                   "timestamp_column": "known_at", "max_delay_seconds": 172800.0,
                                   "sample_rate": 0.5}
    assert (job["metric"], job["min_rows"], job["max_drop"], job["window_seconds"]) == ("auc", 100, 0.04, 21600.0)
    assert job["versions"] == {"1": {"role": "primary", "trained": 0.90}} and job["threshold"] == 0.4
    condition = next(c for c in status.conditions if c.type == "OutcomesMonitored")
    assert condition.reason == "FirstRun"
    # Not due again within the schedule (2m), due after it.
    ports.outcomes.result = {"at": ports.clock(), "versions": {}}
    reconcile(ports, spec(), status)
    assert len(ports.outcomes.started) == 1
    ports.clock.now += 121
    reconcile(ports, spec(), status)
    assert len(ports.outcomes.started) == 2


def test_a_metric_the_task_does_not_produce_is_named_in_a_condition(world):
    registry, ports = world
    data = json.loads(json.dumps(SPEC))
    data["monitoring"]["performance"]["metric"] = "rmse"
    status = reconcile(ports, InferenceServiceSpec.model_validate(data), InferenceServiceStatus())
    condition = next(c for c in status.conditions if c.type == "OutcomesMonitored")
    assert condition.reason == "InvalidSpec" and "'rmse' is not a binary metric" in condition.message
    assert not ports.outcomes.started
    data["monitoring"]["performance"].pop("metric")
    assert judged_metric(InferenceServiceSpec.model_validate(data), "regression") == "rmse"  # the task's primary
    with pytest.raises(ValueError, match="not a regression metric"):
        judged_metric(spec(), "regression")


def result(drop_low: float, rows: int = 500) -> dict:
    return {"at": 1_800_000_000.0, "metric": "auc", "labels": {"matched": rows, "late": 2},
            "versions": {"1": {"role": "primary", "rows": rows, "trained": 0.9,
                               "live": {"value": 0.82, "low": 0.80, "high": 0.84},
                               "drop": {"value": 0.08, "low": drop_low, "high": 0.10}}},
            "report": "runs:/abc/outcomes/report.json"}


def test_status_performance_tells_a_decayed_primary_from_one_that_holds():
    status, observations = performance(result(drop_low=0.06), spec())
    assert status.decayed and status.versions[0].value == 0.82 and status.labels == {"matched": 500, "late": 2}
    assert observations[0].reason == "Decayed" and "auc 0.82 [0.8, 0.84] over 500" in observations[0].message
    assert not decayed(result(drop_low=0.03), spec())  # the interval reaches below maxDrop 0.04
    _, few = performance(result(drop_low=0.06, rows=50), spec())
    assert few[0].reason == "NotEnoughLabels"
    _, failed = performance({"at": 1.0, "error": "labels at s3://labels/fraud have no column 'payment_id'"}, spec())
    assert failed[0].reason == "OutcomeJobFailed" and "payment_id" in failed[0].message


def test_a_rollout_of_spec_canary_steps_up_then_moves_the_alias(world):
    registry, ports = world
    rolled = spec(canary={"alias": "challenger", "percent": 30}, rollout=ROLLOUT)
    status = reconcile(ports, rolled, InferenceServiceStatus())
    assert served(ports) == {"primary": ("1", 95), "canary": ("2", 5)}, "the steps' weight, not canary.percent"
    assert status.rollout.phase == "Progressing" and ports.outcomes.started[-1]["pair"] == ["1", "2"]
    ports.clock.now += 61
    status = reconcile(ports, rolled, status)
    assert status.rollout.step == 1 and served(ports)["canary"] == ("2", 50)
    ports.clock.now += 61
    status = reconcile(ports, rolled, status)
    assert status.rollout.phase == "Promoted" and registry.get_alias("fraud", "champion").version == "2"
    assert audit_trail(registry, "fraud")[-1].reason == "rollout passed every step"
    status = reconcile(ports, rolled, status)
    assert served(ports) == {"primary": ("2", 100)} and status.rollout.phase == "Promoted"


def test_a_worse_canary_is_aborted_at_its_first_step_and_the_alias_stays(world):
    registry, ports = world
    rolled = spec(canary={"alias": "challenger", "percent": 30}, rollout=ROLLOUT)
    ports.traffic.sample_for[("1", "2")] = TrafficSample(requests={"1": 2000, "2": 100}, errors={"1": 2, "2": 30},
                                                         p99={"1": 0.01, "2": 0.01})
    started = reconcile(ports, rolled, InferenceServiceStatus())
    status = reconcile(ports, rolled, started)
    assert status.rollout.phase == "Aborted" and "error rate 30.00%" in status.rollout.message
    events = [e for e in transition_events("InferenceService", started, status) if e.reason == "Aborted"]
    assert events and events[0].type == "Warning" and "error rate 30.00%" in events[0].message
    assert served(ports) == {"primary": ("1", 100)} and status.canary_version is None
    condition = next(c for c in status.conditions if c.type == "RolloutHealthy")
    assert condition.status == "False" and condition.reason == "Aborted"
    ports.clock.now += 600
    status = reconcile(ports, rolled, status)
    assert served(ports) == {"primary": ("1", 100)}, "an aborted challenger stays out"
    assert registry.get_alias("fraud", "champion").version == "1"
    rejected = [e for e in audit_trail(registry, "fraud") if e.action == "reject"]
    assert len(rejected) == 1 and rejected[0].version == "2" and "error rate 30.00%" in rejected[0].reason


def test_a_rollout_paused_by_hand_holds_its_share_and_an_abort_sends_traffic_back(world):
    registry, ports = world
    rolled = spec(canary={"alias": "challenger", "percent": 30}, rollout=ROLLOUT)
    status = reconcile(ports, rolled, InferenceServiceStatus())
    status = reconcile(ports, rolled, status, action="pause")
    ports.clock.now += 600
    status = reconcile(ports, rolled, status, action="pause")
    assert status.rollout.phase == "Paused" and served(ports)["canary"] == ("2", 5)
    status = reconcile(ports, rolled, status, action="abort")
    assert status.rollout.phase == "Aborted" and served(ports) == {"primary": ("1", 100)}


def test_a_retrained_challenger_whose_labels_show_it_worse_is_rolled_back(world):
    """The one-step rollout of a retrain (canaryPercent for canaryDuration),
    aborted by the loss test on the same labelled requests."""
    registry, ports = world
    from kubeloop.monitoring.outcomes.sequential import Stream

    data = {**SPEC, "retraining": {"template": {"modelName": "x", "features": {
        "featureViews": ["card_activity"], "labels": {"source": "transactions", "column": "is_fraud"}}},
        "canaryPercent": 10, "canaryDuration": "1m"}}
    retrain = InferenceServiceSpec.model_validate(data)
    registry.set_version_tag("fraud", "2", "gate.champion.auc", "0.90")  # scored beside the champion: not worse
    alert = ObjectRef("InferenceService", "ml", "fraud", "uid-1", 1, {"signals.kubeloop.dev/drift-alert": json.dumps(
        {"fingerprint": "f", "startsAt": "2027-01-15T08:00:00Z", "alertname": "KubeloopConceptDrift"})})
    status = reconcile_inference_service(alert, retrain, InferenceServiceStatus(), ports).status
    assert status.retraining.reason == "KubeloopConceptDrift"
    ports.objects.set_status("TrainingJob", "ml", status.retraining.training_job, phase="Succeeded",
                             model={"name": "fraud", "version": "2"})
    status = reconcile_inference_service(alert, retrain, status, ports).status
    status = reconcile_inference_service(alert, retrain, status, ports).status
    assert status.retraining.state == "Canary" and status.rollout.weight == 10
    losses = {"champion": vars(Stream(n=3000, mean=0.30, m2=3000 * 0.09)),
              "challenger": vars(Stream(n=3000, mean=0.45, m2=3000 * 0.2)),
              "differences": vars(Stream(n=3000, mean=0.15, m2=3000 * 0.04))}
    ports.outcomes.result = {"at": ports.clock(), "versions": {},
                             "pairs": {"champion": "1", "challenger": "2", "losses": losses}}
    status = reconcile_inference_service(alert, retrain, status, ports).status
    assert status.rollout.phase == "Aborted" and "loss per labelled request" in status.rollout.message
    status = reconcile_inference_service(alert, retrain, status, ports).status
    assert status.retraining.state == "RolledBack" and registry.get_alias("fraud", "champion").version == "1"
    assert audit_trail(registry, "fraud")[-1].action == "reject"
