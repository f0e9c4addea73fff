"""Converging one object (parsing, invalid specs, status diffs, one reconcile at a time, from the
latest state) against a fake of the Kubernetes module, the handlers' retry signal, and the
deletion path. Backend: none (unit); the operator against the real API server is in tests/e2e."""

from __future__ import annotations

import copy
import threading
import time

import kopf
import pytest

from kubeloop.api.resources import TRAINING_JOB
from kubeloop.operator.converging import ObjectLocks, converge, reconcile
from kubeloop.operator.handlers import post_outcome
from kubeloop.operator.reconcilers import deletion
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


class LiveObjects:
    """The API server's copy of one object (a fake of the one Kubernetes I/O
    module's two calls): reads return it, status merge patches change it."""

    def __init__(self, live: dict, delay: float = 0.0):
        self.live = live
        self.delay = delay
        self.patches: list[tuple[str | None, dict]] = []
        self.reading: dict[str, int] = {}
        self.overlaps: list[str] = []
        self._guard = threading.Lock()

    def get(self, api_version, kind, name, namespace):  # noqa: ANN001, ANN201
        uid = self.live["metadata"]["uid"]
        with self._guard:
            self.reading[uid] = self.reading.get(uid, 0) + 1
            if self.reading[uid] > 1:
                self.overlaps.append(uid)
        time.sleep(self.delay)
        with self._guard:
            self.reading[uid] -= 1
        return copy.deepcopy(self.live)

    def merge_patch(self, api_version, kind, name, patch, namespace, subresource=None):  # noqa: ANN001, ANN201
        self.patches.append((subresource, patch))
        status = self.live.setdefault("status", {})
        status.update(patch["status"])
        for key in [k for k, v in status.items() if v is None]:
            del status[key]


VALID = {"modelName": "m", "features": {"featureViews": ["v"], "labels": {"source": "transactions", "column": "is_fraud"}}}


def test_a_converged_object_gets_no_second_status_write():
    objects = LiveObjects({"metadata": META, "spec": VALID})
    p = Ports(registry=InMemoryRegistry(), pipelines={"noop": NoopBackend()}, default_pipeline_backend="noop",
              objects=objects)
    first = converge(TRAINING_JOB, reconcile_training_job, META, p, ObjectLocks())
    assert objects.live["status"]["phase"] == "Succeeded" and first.events
    second = converge(TRAINING_JOB, reconcile_training_job, META, p, ObjectLocks())
    assert len(objects.patches) == 1, "a converged object needs no write"
    assert second.status.to_wire() == objects.live["status"]


def test_retry_becomes_a_temporary_error():
    from kubeloop.api.training import TrainingJobStatus
    from kubeloop.operator.reconcilers.common import Outcome

    with pytest.raises(kopf.TemporaryError) as err:
        post_outcome(Outcome(TrainingJobStatus(), retry_after=8, retry_reason="kfp down"), kopf.Body({}))
    assert err.value.delay == 8


def test_reconciles_of_one_object_never_overlap():
    """kopf runs the resync timer beside the change handlers; two reconciles
    of one InferenceService at once once started two tritonservers."""
    shared = ObjectLocks()
    objects = {uid: LiveObjects({"metadata": {**META, "uid": uid}, "spec": VALID}, delay=0.05) for uid in "ab"}
    p = {uid: Ports(registry=InMemoryRegistry(), pipelines={"noop": NoopBackend()}, default_pipeline_backend="noop",
                    objects=objects[uid]) for uid in "ab"}
    calls = [threading.Thread(target=converge, args=(TRAINING_JOB, reconcile_training_job,
                                                     {**META, "uid": uid}, p[uid], shared))
             for uid in "aaab"]
    for t in calls:
        t.start()
    for t in calls:
        t.join()
    assert objects["a"].overlaps == [] and objects["b"].overlaps == []
    assert len(objects["a"].patches) == 1, "the later reconciles start from the first one's status"


def test_a_reconcile_starts_from_the_latest_status_and_writes_only_what_changed():
    """kopf queues a handler with the body it had then; the status another
    reconcile wrote meanwhile must be its starting point, not be overwritten."""
    from kubeloop.operator.reconcilers.common import Outcome

    objects = LiveObjects({"metadata": META, "spec": VALID,
                           "status": {"phase": "Running", "backend": "noop", "runId": "r-7"}})
    seen = []

    def reconciler(ref, spec, current, ports, attempt):  # noqa: ANN001, ANN202
        seen.append(current.run_id)
        return Outcome(current.model_copy(update={"phase": "Succeeded"}))

    converge(TRAINING_JOB, reconciler, META, ports_with(objects), ObjectLocks())
    assert seen == ["r-7"]
    [(subresource, written)] = objects.patches
    assert subresource == "status" and written["status"]["phase"] == "Succeeded"
    assert "runId" not in written["status"], "only what changed is written"


def test_an_object_being_deleted_is_not_reconciled_again():
    """A timer that waited for the lock while the delete handler stopped the
    local Triton must not start it again."""
    objects = LiveObjects({"metadata": {**META, "deletionTimestamp": "2026-11-22T15:30:19Z"}, "spec": VALID})
    calls = []
    outcome = converge(TRAINING_JOB, lambda *args, **kwargs: calls.append(args), META, ports_with(objects),
                       ObjectLocks())
    assert outcome is None and calls == [] and objects.patches == []


def test_deleting_a_run_cancels_it_only_while_it_runs():
    cancelled = []

    class Backend(NoopBackend):
        def cancel(self, run_id: str) -> None:
            cancelled.append(run_id)

    p = Ports(registry=InMemoryRegistry(), pipelines={"kfp": Backend()}, default_pipeline_backend="kfp")
    deletion.cancel_run({}, {"phase": "Succeeded", "runId": "done"}, p)
    deletion.cancel_run({}, {"phase": "Running", "runId": "going"}, p)
    assert cancelled == ["going"]


def ports_with(objects: LiveObjects) -> Ports:
    return Ports(registry=InMemoryRegistry(), pipelines={"noop": NoopBackend()}, default_pipeline_backend="noop",
                 objects=objects)


def test_a_status_that_fails_validation_keeps_what_can_be_kept():
    """Local and cluster: one bad field (a hand edit, an older operator) reset the whole
    status, losing status.retraining in the middle of a retrain."""
    from kubeloop.api.resources import INFERENCE_SERVICE
    from kubeloop.operator.converging import parse_status

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
    from kubeloop.operator.converging import status_changes

    old = {"phase": "Ready", "drift": {"rows": 0, "message": "only 0 logged rows", "lastRunAt": "t1"}}
    new = {"phase": "Ready", "drift": {"rows": 2000, "share": 1.0, "lastRunAt": "t2"}}
    assert status_changes(old, new) == {"drift": {"rows": 2000, "share": 1.0, "lastRunAt": "t2", "message": None}}
    assert status_changes(None, new) == new
    assert status_changes(new, {"phase": "Ready"}) == {"drift": None}
