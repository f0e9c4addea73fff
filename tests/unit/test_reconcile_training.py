"""The TrainingJob reconciler with a scripted pipeline backend."""

from __future__ import annotations

import pytest

from kubeloop.api.refs import ObjectRef
from kubeloop.api.training import TrainingJobSpec, TrainingJobStatus
from kubeloop.operator.ports import Ports
from kubeloop.operator.reconcilers.common import transition_events
from kubeloop.operator.reconcilers.training import reconcile_training_job
from kubeloop.registry.memory import InMemoryRegistry
from tests.unit.fakes import ScriptedBackend

REF = ObjectRef("TrainingJob", "ml", "fraud", "uid-1", generation=1)
SPEC = TrainingJobSpec.model_validate({"modelName": "fraud", "features": {"featureViews": ["card_activity"], "labels": {"source": "transactions", "column": "is_fraud"}}})


@pytest.fixture
def backend():
    return ScriptedBackend()


@pytest.fixture
def ports(backend):
    return Ports(registry=InMemoryRegistry(), pipelines={"local": backend}, default_pipeline_backend="local")


def conditions(status):
    return {c.type: (c.status, c.reason) for c in status.conditions}


def test_submits_once_and_reports_running(ports, backend):
    out = reconcile_training_job(REF, SPEC, TrainingJobStatus(), ports)
    assert out.status.phase == "Running"
    assert len(backend.requests) == 1
    again = reconcile_training_job(REF, SPEC, out.status, ports)
    assert len(backend.requests) == 1, "an unchanged spec must not start a second run"
    assert again.status == out.status
    assert again.events == []
    assert conditions(out.status)["Ready"][0] == "Unknown"


def test_success_reports_metrics_and_model(ports, backend):
    first = reconcile_training_job(REF, SPEC, TrainingJobStatus(), ports).status
    backend.finish(first.run_id, outputs={"metrics": {"auc": 0.91},
                                          "model": {"name": "fraud", "version": 3, "uri": "models:/fraud/3"}})
    out = reconcile_training_job(REF, SPEC, first, ports)
    assert out.status.phase == "Succeeded"
    assert out.status.model.version == "3" and out.status.metrics == {"auc": 0.91}
    assert conditions(out.status)["Ready"] == ("True", "Ready")
    events = transition_events("TrainingJob", first, out.status)
    assert [(e.type, e.reason) for e in events] == [("Normal", "Registered"), ("Normal", "Succeeded"),
                                                     ("Normal", "Succeeded")]
    assert events[-1].message == "TrainingJob is Succeeded: fraud version 3"


def test_failure_carries_the_step_error(ports, backend):
    first = reconcile_training_job(REF, SPEC, TrainingJobStatus(), ports).status
    backend.finish(first.run_id, phase="Failed", error="step training-data: feature view 'nope' not found")
    out = reconcile_training_job(REF, SPEC, first, ports)
    assert out.status.phase == "Failed"
    cond = next(c for c in out.status.conditions if c.type == "RunSucceeded")
    assert cond.reason == "PipelineFailed" and "feature view 'nope'" in cond.message
    events = transition_events("TrainingJob", first, out.status)
    assert events[0].type == "Warning" and "feature view 'nope'" in events[0].message
    assert events[-1].reason == "Failed"


def test_changed_spec_cancels_the_old_run_and_starts_a_new_one(ports, backend):
    first = reconcile_training_job(REF, SPEC, TrainingJobStatus(), ports).status
    changed = SPEC.model_copy(update={"seed": 7})
    out = reconcile_training_job(REF.__class__(**{**REF.__dict__, "generation": 2}), changed, first, ports)
    assert len(backend.requests) == 2 and backend.cancelled == [first.run_id]
    assert out.status.run_id != first.run_id and out.status.observed_generation == 2
    assert out.events[0].reason == "Superseded"


def test_a_re_created_job_trains_instead_of_finding_the_cancelled_run_of_its_predecessor(ports, backend):
    """Local and cluster (the run name is the idempotency key of both backends)."""
    first = reconcile_training_job(REF, SPEC, TrainingJobStatus(), ports).status
    backend.cancel(first.run_id)  # the delete handler of the first incarnation
    again = ObjectRef("TrainingJob", "ml", "fraud", "uid-2", generation=1)
    out = reconcile_training_job(again, SPEC, TrainingJobStatus(), ports)
    assert out.status.phase == "Running" and out.status.run_id != first.run_id
    assert len(backend.requests) == 2


def test_a_spec_reverted_to_an_earlier_one_trains_again(ports, backend):
    """Local and cluster: A (generation 1) -> B (2, cancels A's run) -> A again (3)."""
    first = reconcile_training_job(REF, SPEC, TrainingJobStatus(), ports).status
    changed = SPEC.model_copy(update={"seed": 7})
    second = reconcile_training_job(ObjectRef("TrainingJob", "ml", "fraud", "uid-1", 2), changed, first, ports).status
    assert backend.cancelled == [first.run_id]
    out = reconcile_training_job(ObjectRef("TrainingJob", "ml", "fraud", "uid-1", 3), SPEC, second, ports)
    assert out.status.phase == "Running" and out.status.run_id not in (first.run_id, second.run_id)


def test_lost_run_is_found_again_by_name_not_duplicated(ports, backend):
    first = reconcile_training_job(REF, SPEC, TrainingJobStatus(), ports).status
    # A restarted operator whose status write was lost sees no run id, yet
    # the deterministic run name leads it back to the same run.
    out = reconcile_training_job(REF, SPEC, TrainingJobStatus(), ports)
    assert out.status.run_id == first.run_id and len(backend.runs) == 1


def test_backend_outage_asks_for_a_retry_with_backoff(ports, backend):
    backend.down = True
    out = reconcile_training_job(REF, SPEC, TrainingJobStatus(), ports, attempt=3)
    assert out.retry_after == 16
    assert conditions(out.status)["RunSubmitted"] == ("Unknown", "BackendUnavailable")


def test_unconfigured_backend_is_a_condition(ports):
    spec = SPEC.model_copy(update={"backend": "kfp"})
    out = reconcile_training_job(REF, spec, TrainingJobStatus(), ports)
    assert out.status.phase == "Failed"
    assert conditions(out.status)["RunSubmitted"] == ("False", "BackendNotConfigured")
