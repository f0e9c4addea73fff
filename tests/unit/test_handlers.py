"""The handler's pure part: parsing, invalid specs, status diffs."""

from __future__ import annotations

import kopf
import pytest

from kubeloop.api.resources import TRAINING_JOB
from kubeloop.operator.handlers import apply_outcome, reconcile
from kubeloop.operator.ports import Ports
from kubeloop.operator.reconcilers.training import reconcile_training_job
from kubeloop.pipelines.backends.noop import NoopBackend
from kubeloop.registry.memory import InMemoryRegistry

META = {"namespace": "ml", "name": "job", "uid": "u", "generation": 4}


def ports():
    return Ports(registry=InMemoryRegistry(), pipelines={"noop": NoopBackend()}, default_pipeline_backend="noop")


def test_an_invalid_spec_becomes_a_condition_not_a_crash():
    spec = {"modelName": "m", "features": {"featureViews": [], "labels": {"source": "transactions", "column": "is_fraud"}}, "hyperparameters": {"epochs": 0}}
    out = reconcile(TRAINING_JOB, reconcile_training_job, META, spec, None, ports())
    ready = next(c for c in out.status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", "InvalidSpec")
    assert "spec.features.featureViews" in ready.message and "spec.hyperparameters.epochs" in ready.message
    assert out.status.phase == "Failed" and out.status.observed_generation == 4
    assert out.events[0].type == "Warning"


def test_status_patch_holds_only_changes(monkeypatch):
    posted = []
    monkeypatch.setattr(kopf, "event", lambda *a, **k: posted.append(k))
    spec = {"modelName": "m", "features": {"featureViews": ["v"], "labels": {"source": "transactions", "column": "is_fraud"}}}
    p = ports()
    first = reconcile(TRAINING_JOB, reconcile_training_job, META, spec, None, p)
    patch = kopf.Patch()
    apply_outcome(first, None, patch, kopf.Body({}))
    assert patch["status"]["phase"] == "Succeeded" and posted
    written = first.status.to_wire()
    second = reconcile(TRAINING_JOB, reconcile_training_job, META, spec, written, p)
    patch = kopf.Patch()
    apply_outcome(second, written, patch, kopf.Body({}))
    assert dict(patch) == {}, "a converged object needs no write"


def test_retry_becomes_a_temporary_error(monkeypatch):
    from kubeloop.api.training import TrainingJobStatus
    from kubeloop.operator.reconcilers.common import Outcome

    with pytest.raises(kopf.TemporaryError) as err:
        apply_outcome(Outcome(TrainingJobStatus(), retry_after=8, retry_reason="kfp down"), {}, kopf.Patch(),
                      kopf.Body({}))
    assert err.value.delay == 8


def test_reconciles_of_one_object_never_overlap(monkeypatch):
    """kopf runs the resync timer beside the change handlers; two reconciles
    of one InferenceService at once once started two tritonservers."""
    import threading
    import time

    from kubeloop.operator import handlers
    from kubeloop.operator.settings import OperatorConfig

    running, overlaps = {}, []

    def slow_reconcile(kind, reconciler, meta, *args):
        running[meta["uid"]] = running.get(meta["uid"], 0) + 1
        if running[meta["uid"]] > 1:
            overlaps.append(meta["uid"])
        time.sleep(0.05)
        running[meta["uid"]] -= 1

    monkeypatch.setattr(handlers, "reconcile", slow_reconcile)
    monkeypatch.setattr(handlers, "apply_outcome", lambda *args: None)
    registry = handlers.build_registry(OperatorConfig())
    fn = next(h.fn for h in registry._changing.get_all_handlers() if h.fn.__name__ == "reconcile_inferenceservice")
    calls = [threading.Thread(target=fn, kwargs={"meta": {**META, "uid": uid}, "spec": {}, "status": {},
                                                 "patch": None, "body": None, "memo": kopf.Memo(ports=None)})
             for uid in ("a", "a", "a", "b")]
    for t in calls:
        t.start()
    for t in calls:
        t.join()
    assert overlaps == [] and running == {"a": 0, "b": 0}


def test_a_reconcile_starts_from_the_latest_status_and_writes_it_under_the_lock(monkeypatch):
    """kopf queues a handler with the body it had then; the status another
    reconcile wrote meanwhile must be its starting point, not be overwritten."""
    from kubeloop.operator import handlers
    from kubeloop.operator.reconcilers.common import Outcome
    from kubeloop.operator.settings import OperatorConfig

    class Objects:
        def __init__(self):
            self.live = {"metadata": {**META, "uid": "x"}, "spec": {"n": 2}, "status": {"phase": "Running", "seen": 1}}
            self.patches = []

        def get(self, api_version, kind, name, namespace):
            return self.live

        def merge_patch(self, api_version, kind, name, patch, namespace, subresource=None):
            self.patches.append((subresource, patch))

    seen = []

    def fake_reconcile(kind, reconciler, meta, spec, status, ports, retry):
        from kubeloop.api.serving import InferenceServiceStatus

        seen.append((spec, status))
        return Outcome(InferenceServiceStatus(phase="Ready"))

    monkeypatch.setattr(handlers, "reconcile", fake_reconcile)
    objects = Objects()
    registry = handlers.build_registry(OperatorConfig())
    fn = next(h.fn for h in registry._changing.get_all_handlers() if h.fn.__name__ == "reconcile_inferenceservice")
    patch = kopf.Patch()
    fn(meta={**META, "uid": "x"}, spec={"n": 1}, status={"phase": "Pending"}, patch=patch, body=kopf.Body({}),
       memo=kopf.Memo(ports=Ports(registry=InMemoryRegistry(), objects=objects)))
    assert seen == [({"n": 2}, {"phase": "Running", "seen": 1})]
    [(subresource, written)] = objects.patches
    assert subresource == "status"
    assert written["status"]["phase"] == "Ready" and written["status"]["seen"] is None
    assert dict(patch) == {}, "the status is written once, by the handler, not again by kopf"


def test_an_object_being_deleted_is_not_reconciled_again(monkeypatch):
    """A timer that waited for the lock while the delete handler stopped the
    local Triton must not start it again."""
    from kubeloop.operator import handlers
    from kubeloop.operator.settings import OperatorConfig

    class Objects:
        patches: list = []

        def get(self, api_version, kind, name, namespace):
            return {"metadata": {**META, "uid": "y", "deletionTimestamp": "2026-11-22T15:30:19Z"}, "spec": {},
                    "status": {}}

        def merge_patch(self, *args, **kwargs):
            self.patches.append(args)

    calls = []
    monkeypatch.setattr(handlers, "reconcile", lambda *args: calls.append(args))
    registry = handlers.build_registry(OperatorConfig())
    fn = next(h.fn for h in registry._changing.get_all_handlers() if h.fn.__name__ == "reconcile_inferenceservice")
    objects = Objects()
    fn(meta={**META, "uid": "y"}, spec={}, status={}, patch=kopf.Patch(), body=kopf.Body({}),
       memo=kopf.Memo(ports=Ports(registry=InMemoryRegistry(), objects=objects)))
    assert calls == [] and objects.patches == []


def test_a_status_that_fails_validation_keeps_what_can_be_kept():
    """Local and cluster: one bad field (a hand edit, an older operator) reset the whole
    status, losing status.retraining in the middle of a retrain."""
    from kubeloop.api.resources import INFERENCE_SERVICE
    from kubeloop.operator.handlers import parse_status

    retraining = {"state": "Canary", "alert": "abc@2027-01-15T08:00:00.000Z", "trainingJob": "fraud-retrain-1",
                  "challenger": "3", "canarySince": "2027-01-15T09:00:00Z", "message": "canary"}
    good = {"type": "Ready", "status": "True", "reason": "Ready", "lastTransitionTime": "2027-01-15T09:00:00Z"}
    raw = {"phase": "Ready", "readyReplicas": "many", "retraining": retraining,
           "conditions": [good, {"type": "Placed", "status": "Maybe", "reason": "X", "lastTransitionTime": "t"}],
           "retrains": ["fraud-retrain-1"]}
    status, dropped = parse_status(INFERENCE_SERVICE, raw)
    assert status.retraining is not None and status.retraining.challenger == "3"
    assert status.retrains == ["fraud-retrain-1"] and status.phase == "Ready"
    assert [c.type for c in status.conditions] == ["Ready"]
    assert sorted(dropped) == ["conditions[1]", "readyReplicas"]


def test_a_finished_run_whose_promotion_waits_is_still_resynced():
    """Local and cluster: the resync timer stopped at phase Succeeded, so a promotion that
    met a registry outage (Promoted=Unknown) was never tried again."""
    from kubeloop.operator.handlers import _unfinished

    waiting = {"phase": "Succeeded", "conditions": [
        {"type": "Ready", "status": "True"}, {"type": "Promoted", "status": "Unknown", "reason": "RegistryUnavailable"}]}
    assert _unfinished(waiting)
    done = {"phase": "Succeeded", "conditions": [{"type": "Ready", "status": "True"},
                                                 {"type": "Promoted", "status": "True"}]}
    assert not _unfinished(done)
    assert not _unfinished({"phase": "Failed", "conditions": [{"type": "ModelRegistered", "status": "Unknown"}]})
    assert _unfinished({"phase": "Running"}) and _unfinished({})


def test_status_changes_delete_fields_dropped_at_any_depth():
    """A drift run that evaluated drops the message a skipped run left: the
    merge patch must delete drift.message, not merge around it (seen on the
    real node: a drifted verdict still said 'only 0 logged rows')."""
    from kubeloop.operator.handlers import status_changes

    old = {"phase": "Ready", "drift": {"rows": 0, "message": "only 0 logged rows", "lastRunAt": "t1"}}
    new = {"phase": "Ready", "drift": {"rows": 2000, "share": 1.0, "lastRunAt": "t2"}}
    assert status_changes(old, new) == {"drift": {"rows": 2000, "share": 1.0, "lastRunAt": "t2", "message": None}}
    assert status_changes(None, new) == new
    assert status_changes(new, {"phase": "Ready"}) == {"drift": None}
