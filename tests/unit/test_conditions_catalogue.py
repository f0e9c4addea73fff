"""The conditions catalogue (kubeloop.api.conditions) against what the
reconcilers report: each reconciler is driven through its branches, as its
own tests do, and every condition type and reason in the statuses it writes
must be in its kind's catalogue. Reasons that are another field's values (a
rollout's phase, a retrain's state, a run's phase, the optimiser's basis)
are pinned to those values. The CRDs document the catalogue for kubectl
explain, and the status on the wire stays plain strings."""

from __future__ import annotations

import json
import typing

import pytest

from kubeloop.api.conditions import (
    INFERENCE_SERVICE_CONDITIONS, OPTIMIZED_MODEL_CONDITIONS, TRAINING_JOB_CONDITIONS, ConditionType, KindConditions,
)
from kubeloop.api.optimization import OptimizedModelSpec, OptimizedModelStatus
from kubeloop.api.outcomes import RolloutStatus
from kubeloop.api.refs import ObjectRef
from kubeloop.api.resources import INFERENCE_SERVICE, KINDS, OPTIMIZED_MODEL, TRAINING_JOB, build_crd
from kubeloop.api.serving import InferenceServiceSpec, InferenceServiceStatus, RetrainingStatus
from kubeloop.api.signature import TAG as SIGNATURE_TAG, ModelSignature
from kubeloop.api.training import TrainingJobSpec, TrainingJobStatus
from kubeloop.components.selection import FASTER, NOT_FASTER, OVERLAP
from kubeloop.featurestore.base import FeatureStores
from kubeloop.featurestore.freshness import StoreNeed, StoreState
from kubeloop.gpu.placement import PlacementDecision
from kubeloop.operator import converging
from kubeloop.operator.ports import Ports
from kubeloop.operator.reconcilers.optimization import reconcile_optimized_model
from kubeloop.operator.reconcilers.outcomes import rollout_observation
from kubeloop.operator.reconcilers.serving import reconcile_inference_service
from kubeloop.operator.reconcilers.training import reconcile_training_job
from kubeloop.pipelines.backends.base import RunPhase
from kubeloop.registry.base import RegistryUnavailable
from kubeloop.registry.memory import InMemoryRegistry
from kubeloop.registry.tags import FEATURE_STORE, GPU_MEMORY_MIB
from kubeloop.serving.base import ServingState, ServingUnavailable
from tests.unit.fakes import FakeObjects, FakeTraffic, RecordingServing, ScriptedBackend
from tests.unit.test_outcomes_reconcile import Jobs
from tests.unit.test_placement import fleet as fake_fleet
from tests.unit.test_reconcile_optimization import OUTPUTS

NOW = 1_800_000_000.0


def unavailable(*_args, **_kwargs):  # noqa: ANN202 - stands in for any registry call
    raise RegistryUnavailable("the registry is down")


def uncatalogued(catalogue: KindConditions, conditions) -> set[tuple[str, str]]:  # noqa: ANN001 - conditions
    """(type, reason) of the conditions the catalogue does not list. Ready
    may also carry the reason of a required condition that is not True."""
    reasons = {e.type: set(e.reasons) for e in catalogue.entries}
    borrowed = set().union(*(reasons.get(t, set()) for t in catalogue.required))
    return {(c.type, c.reason) for c in conditions
            if c.reason not in reasons.get(c.type, set()) | (borrowed if c.type == ConditionType.READY else set())}


def reasons_of(catalogue: KindConditions, type: ConditionType) -> set[str]:
    return next(set(e.reasons) for e in catalogue.entries if e.type == type)


def test_every_required_type_is_catalogued_and_ready_comes_first():
    for catalogue in (TRAINING_JOB_CONDITIONS, OPTIMIZED_MODEL_CONDITIONS, INFERENCE_SERVICE_CONDITIONS):
        types = [e.type for e in catalogue.entries]
        assert types[0] == ConditionType.READY and len(types) == len(set(types))
        assert set(catalogue.required) <= set(types) - {ConditionType.READY}


def explained(kind) -> str:  # noqa: ANN001 - a Kind
    """What `kubectl explain <kind>.status.conditions` says."""
    status = build_crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    return status["properties"]["conditions"]["description"]


def test_the_crds_explain_each_kinds_conditions_and_no_others():
    for kind in KINDS:
        listed = [line for line in explained(kind).splitlines() if line.startswith("- ")]
        assert listed == [f"- {e.type}: {e.meaning} Reasons: {', '.join(e.reasons)}." for e in kind.conditions.entries]
    assert "- Ready: True when ModelResolved, Placed and Deployed are;" in explained(INFERENCE_SERVICE)


def test_reasons_that_are_another_fields_values_are_those_values():
    retrain_states = typing.get_args(RetrainingStatus.model_fields["state"].annotation)
    rollout_phases = typing.get_args(RolloutStatus.model_fields["phase"].annotation)
    assert reasons_of(INFERENCE_SERVICE_CONDITIONS, ConditionType.RETRAINING) == set(retrain_states)
    assert reasons_of(INFERENCE_SERVICE_CONDITIONS, ConditionType.ROLLOUT_HEALTHY) == set(rollout_phases)
    assert reasons_of(OPTIMIZED_MODEL_CONDITIONS, ConditionType.VARIANT_CHOSEN) == {FASTER, OVERLAP, NOT_FASTER}
    # RunSucceeded is Unknown with the run's phase until it succeeds (Succeeded) or fails (PipelineFailed).
    for catalogue in (TRAINING_JOB_CONDITIONS, OPTIMIZED_MODEL_CONDITIONS):
        assert set(typing.get_args(RunPhase)) - {"Failed"} <= reasons_of(catalogue, ConditionType.RUN_SUCCEEDED)


# -- InferenceService -----------------------------------------------------------

SERVICE = ObjectRef("InferenceService", "ml", "fraud", "uid-1", 1)
FOLDER = json.dumps({"path": "/repos/fraud"})
MODEL = {"name": "fraud", "alias": "champion"}
GROUND_TRUTH = {"location": "s3://labels/fraud", "keyColumn": "payment_id", "labelColumn": "chargeback",
                "timestampColumn": "known_at"}
FEATURES = {"featureViews": ["card_activity"], "labels": {"source": "transactions", "column": "is_fraud"}}
PROMOTION = {"promoteTo": "champion", "gates": {"metrics": [{"metric": "auc", "min": 0.8}]}}
RETRAINING = {"template": {"modelName": "ignored", "features": FEATURES}, "promotion": PROMOTION}


class Serving(RecordingServing):
    """Serves what the test says: RecordingServing's answer, another
    state, or an outage; reads online features (from published stores
    only, when the test says so)."""

    reads_online_features = True

    def __init__(self):
        super().__init__()
        self.state: ServingState | None = None
        self.down = False

    def ensure(self, request):  # noqa: ANN001, ANN201
        if self.down:
            raise ServingUnavailable("the backend is down")
        return self.state or super().ensure(request)


class Stores:
    """The materialiser as FeatureStores sees it, in the state the test sets."""

    def __init__(self):
        self.now: list[StoreState] = []

    def want(self, owner, needs):  # noqa: ANN001, ANN201
        pass

    def states(self, stores=None):  # noqa: ANN001, ANN201
        return self.now


@pytest.fixture
def service_world():
    registry = InMemoryRegistry()
    signature = ModelSignature(task="binary", feature_columns=["x"], classes=["0", "1"],
                               feature_views=["card_activity"])
    tags = {SIGNATURE_TAG: signature.to_json(), FEATURE_STORE: FOLDER, GPU_MEMORY_MIB: "8192", "metric.auc": "0.9"}
    for _ in range(2):
        registry.add_version("fraud", "s3://m", tags=tags)
    registry.set_alias("fraud", "champion", "1")
    registry.set_alias("fraud", "challenger", "2")
    stores = Stores()
    ports = Ports(registry=registry, serving={"kubernetes": Serving()}, fleet=lambda excluding=None: fake_fleet(),
                  objects=FakeObjects(), monitor=Jobs(), outcomes=Jobs(), traffic=FakeTraffic(),
                  features=FeatureStores(materializer=stores), clock=lambda: NOW)
    return ports, stores


def service(ports: Ports, status: InferenceServiceStatus | None = None, ref: ObjectRef = SERVICE,
            **spec) -> InferenceServiceStatus:
    parsed = InferenceServiceSpec.model_validate({"model": MODEL, **spec})
    return reconcile_inference_service(ref, parsed, status or InferenceServiceStatus(), ports).status


def test_every_condition_an_inference_service_reports_is_catalogued(service_world, monkeypatch):
    ports, stores = service_world
    serving: Serving = ports.serving["kubernetes"]
    seen = []

    def look(status: InferenceServiceStatus | None, **spec) -> InferenceServiceStatus:
        new = service(ports, status, **spec)
        seen.extend(new.conditions)
        return new

    # Resolving, placing, deploying.
    look(None, backend="kserve")
    look(None, model={"name": "nope", "alias": "champion"})
    look(None, canary={"alias": "missing", "percent": 10})
    look(None, gpu={"sharing": "mig", "mig": {"profile": "1g.10gb"}, "memoryMib": 81920})
    look(None, gpu={"sharing": "mig", "memoryMib": 60 * 1024})
    with monkeypatch.context() as patched:
        patched.setattr("kubeloop.operator.reconcilers.serving.plan", lambda *a, **k: PlacementDecision(
            True, "exclusive", "every GPU is taken; waiting", waiting_for_capacity=True))
        look(None)
    with monkeypatch.context() as patched:
        patched.setattr(ports.registry, "get_alias", unavailable)
        look(None)
    serving.down = True
    look(None)
    serving.down = False
    ready = look(None)
    for state in (ServingState(url="u", ready={"primary": False}, message="loading"),
                  ServingState(url="u", ready={"primary": False}, failing=True, message="OOMKilled"),
                  ServingState(url="u", ready={"primary": False, "canary": False}, answering="1", message="swap")):
        serving.state = state
        look(None, canary={"alias": "challenger", "percent": 20})
    serving.state = ServingState(url="u", ready={"primary": True}, rolled_back=("canary",), message="canary died")
    look(ready, canary={"alias": "challenger", "percent": 20})
    serving.state = None
    rollout = {"steps": [{"weight": 5, "duration": "1m"}]}
    look(look(ready, canary={"alias": "challenger", "percent": 20}, rollout=rollout),
         canary={"alias": "challenger", "percent": 20}, rollout=rollout)
    seen += [rollout_observation(RolloutStatus(challenger="2", champion="1", phase=phase))
             for phase in typing.get_args(RolloutStatus.model_fields["phase"].annotation)]

    # Drift and outcomes: no request log, no monitor, and what each job found.
    monitoring = {"monitoring": {"schedule": "1m", "groundTruth": GROUND_TRUTH,
                                 "performance": {"metric": "auc", "maxDrop": 0.04, "minRows": 100}}}
    look(ready, **monitoring)
    logged = {**monitoring, "requestLogging": {"destination": "s3://requests/fraud"}}
    look(ready, **logged)
    labelled = {"role": "primary", "rows": 500, "live": {"value": 0.9, "low": 0.88, "high": 0.92}}
    results = [
        {"at": NOW, "error": "the job failed"},
        {"at": NOW, "skipped": "12 rows", "versions": {"1": {"role": "primary", "rows": 12}}, "metric": "auc"},
        {"at": NOW, "share": 0.5, "drifted": True, "rows": 500, "versions": {"1": labelled}, "metric": "auc"},
        {"at": NOW, "share": 0.0, "drifted": False, "rows": 500, "metric": "auc",
         "versions": {"1": {**labelled, "drop": {"low": 0.2}}}},
    ]
    for result in results:
        ports.monitor.result = ports.outcomes.result = result
        look(ready, **logged)
    wrong_metric = {**logged, "monitoring": {**monitoring["monitoring"], "performance": {"metric": "rmse"}}}
    look(ready, **wrong_metric)
    ports.monitor = ports.outcomes = None
    look(ready, **logged)

    # Online features: a store recorded as a folder where Pods read them, and
    # each state of a materialised store.
    serving.published_stores_only = True
    look(ready, features={"materializeEvery": "1m"})
    serving.published_stores_only = False
    need = StoreNeed(FOLDER, ("card_activity",), 60.0)
    for state in (StoreState(need), StoreState(need, runs=1, ends={"card_activity": NOW - 10}),
                  StoreState(need, runs=2, failures=1, last_error="redis is down")):
        stores.now = [state]
        look(ready, features={"materializeEvery": "1m"})

    # Drift alerts and the retrains they start.
    alerts = "signals.kubeloop.dev/drift-alert"
    bad = ObjectRef("InferenceService", "ml", "fraud", "uid-1", 1, {alerts: "not json"})
    first = service(ports, ready, ref=bad, monitoring={"schedule": "1m"}, retraining=RETRAINING)
    alert = ObjectRef("InferenceService", "ml", "fraud", "uid-1", 1,
                      {alerts: json.dumps({"fingerprint": "a", "startsAt": "2027-01-15T08:00:00Z"})})
    started = service(ports, first, ref=alert, monitoring={"schedule": "1m"}, retraining=RETRAINING)
    another = ObjectRef("InferenceService", "ml", "fraud", "uid-1", 1,
                        {alerts: json.dumps({"fingerprint": "b", "startsAt": "2027-01-15T09:00:00Z"})})
    suppressed = service(ports, started, ref=another, monitoring={"schedule": "1m"}, retraining=RETRAINING)
    seen += first.conditions + started.conditions + suppressed.conditions

    assert uncatalogued(INFERENCE_SERVICE_CONDITIONS, seen) == set()
    # And the catalogue lists nothing the reconciler never reports: Retraining's
    # reasons are its states (pinned above), an unreadable spec or status is
    # converging's (below).
    catalogued = {(e.type, r) for e in INFERENCE_SERVICE_CONDITIONS.entries for r in e.reasons
                  if e.type != ConditionType.RETRAINING}
    assert catalogued - {(c.type, c.reason) for c in seen} == {
        ("Ready", "InvalidSpec"), ("StatusValid", "InvalidStatus")}


# -- TrainingJob and OptimizedModel -------------------------------------------------------

JOB = ObjectRef("TrainingJob", "ml", "fraud", "uid-2", 1)


def test_every_condition_a_training_job_reports_is_catalogued():
    registry = InMemoryRegistry()
    registry.add_version("fraud", "s3://1", tags={"metric.auc": "0.9"})
    registry.add_version("fraud", "s3://2", tags={"metric.auc": "0.5"})
    backend, objects = ScriptedBackend(), FakeObjects()
    ports = Ports(registry=registry, pipelines={"local": backend}, objects=objects)
    seen = []

    def look(status: TrainingJobStatus | None = None, **spec) -> TrainingJobStatus:
        parsed = TrainingJobSpec.model_validate({"modelName": "fraud", "features": FEATURES, **spec})
        new = reconcile_training_job(JOB, parsed, status or TrainingJobStatus(), ports).status
        seen.extend(new.conditions)
        return new

    look(backend="kfp")
    store = {**FEATURES, "store": {"configMap": {"name": "feast"}}}
    look(features=store)
    objects.apply({"kind": "ConfigMap", "metadata": {"name": "feast", "namespace": "ml"},
                   "data": {"feature_store.yaml": "project: fraud\n"}})
    look(features=store)
    backend.down = True
    look()
    backend.down = False
    for outputs in ({"model": {"name": "fraud", "version": "1"}}, {"model": {"name": "fraud", "version": "2"}}, {}):
        running = look(promotion=PROMOTION)
        backend.finish(running.run_id, outputs=outputs)
        look(running, promotion=PROMOTION)
        backend.runs.clear()
    running = look()
    backend.finish(running.run_id, phase="Failed", error="the step failed")
    look(running)
    backend.runs.clear()
    running = look(promotion=PROMOTION, seed=7)
    backend.finish(running.run_id, outputs={"model": {"name": "fraud", "version": "1"}})
    registry.get_alias = unavailable
    look(running, promotion=PROMOTION, seed=7)

    assert uncatalogued(TRAINING_JOB_CONDITIONS, seen) == set()
    # The catalogue lists nothing else: a run's Pending phase is pinned above,
    # an unreadable spec or status is converging's (below).
    catalogued = {(e.type, r) for e in TRAINING_JOB_CONDITIONS.entries for r in e.reasons}
    assert catalogued - {(c.type, c.reason) for c in seen} == {
        ("RunSucceeded", "Pending"), ("Ready", "InvalidSpec"), ("StatusValid", "InvalidStatus")}


def test_every_condition_an_optimized_model_reports_is_catalogued():
    registry = InMemoryRegistry()
    registry.add_version("fraud", "s3://1", tags={})
    registry.add_version("fraud", "s3://2", tags={"metric.auc": "0.9"})
    backend = ScriptedBackend()
    ports = Ports(registry=registry, pipelines={"local": backend})
    ref = ObjectRef("OptimizedModel", "ml", "fast", "uid-3", 1)
    seen = []

    def look(status: OptimizedModelStatus | None = None, **spec) -> OptimizedModelStatus:
        parsed = OptimizedModelSpec.model_validate({"source": {"name": "fraud", "version": "1"}, **spec})
        new = reconcile_optimized_model(ref, parsed, status or OptimizedModelStatus(), ports).status
        seen.extend(new.conditions)
        return new

    look(source={"name": "nope", "version": "1"})
    look(accuracyBudget={"metric": "rmse"})
    look(target={"device": "gpu"}, techniques=["tensorrt-fp16"])
    look(backend="kfp")
    unregistered = {k: v for k, v in OUTPUTS.items() if k != "model"}
    for outputs, spec in ((OUTPUTS, {"promotion": PROMOTION}), (unregistered, {})):
        running = look(**spec)
        backend.finish(running.run_id, outputs=outputs)
        look(running, **spec)
        backend.runs.clear()
    registry.resolve = unavailable
    look()

    assert uncatalogued(OPTIMIZED_MODEL_CONDITIONS, seen) == set()
    # Every type is reached (the reasons it shares with a TrainingJob are reached there).
    assert {c.type for c in seen} == {e.type for e in OPTIMIZED_MODEL_CONDITIONS.entries} - {
        ConditionType.STATUS_VALID}


# -- Every kind: an unreadable spec or status ---------------------------------------------

@pytest.mark.parametrize("kind, reconciler", [
    (TRAINING_JOB, reconcile_training_job), (OPTIMIZED_MODEL, reconcile_optimized_model),
    (INFERENCE_SERVICE, reconcile_inference_service),
], ids=["TrainingJob", "OptimizedModel", "InferenceService"])
def test_an_invalid_spec_or_status_is_catalogued_and_plain_strings_on_the_wire(kind, reconciler):
    ports = Ports(registry=InMemoryRegistry())
    meta = {"name": "x", "namespace": "ml", "uid": "uid-4", "generation": 1}
    invalid = converging.reconcile(kind, reconciler, meta, {}, {"phase": "Bogus"}, ports)
    valid = {"TrainingJob": {"modelName": "fraud", "features": FEATURES},
             "OptimizedModel": {"source": {"name": "fraud", "version": "1"}},
             "InferenceService": {"model": MODEL}}[kind.kind]
    reset = converging.reconcile(kind, reconciler, meta, valid, {"phase": "Bogus"}, ports)
    conditions = invalid.status.conditions + reset.status.conditions
    assert {(c.type, c.reason) for c in conditions} >= {("Ready", "InvalidSpec"), ("StatusValid", "InvalidStatus")}
    assert uncatalogued(kind.conditions, conditions) == set()
    # Plain strings, not the catalogue's enums, whatever writes the status (YAML's safe dumper refuses enums).
    wire = reset.status.to_wire()["conditions"]
    assert all(type(c[key]) is str for c in wire for key in ("type", "reason"))
