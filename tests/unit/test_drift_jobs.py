"""Drift checks as Kubernetes Jobs: the Job (pure builder), and the monitor's
life cycle over objects in memory. The cluster path's evidence is the real
node's e2e (tests/e2e/test_real_node.py); these pin the builder and the
bookkeeping."""

from __future__ import annotations

import json

import pytest

from kubeloop.api.refs import ObjectRef
from kubeloop.monitoring.job import SUMMARY_BYTES, DriftJob, summary
from kubeloop.monitoring.kubernetes import KEEP_JOBS, DriftJobSettings, KubernetesDriftMonitor, build_drift_job
from tests.unit.fakes import FakeObjects

REF = ObjectRef("InferenceService", "ml", "fraud", "uid-9", generation=1)
SETTINGS = DriftJobSettings(image="kubeloop/runtime:1", tracking_uri="http://mlflow.mlflow.svc:5000",
                            object_store_secret="logs-s3", object_store_endpoint="http://s3.storage:8333",
                            feast_repo="s3://feast/default")
JOB = {"service": "ml/fraud", "model": "fraud", "version": "3", "request_log": "s3://requests/ml-fraud",
       "window_seconds": 3600.0, "threshold": 0.3, "features": [], "min_rows": 100, "columns": ["a", "b"],
       "feature_store": ""}


def test_the_job_runs_restricted_on_the_runtime_image_with_the_clusters_mlflow():
    job = build_drift_job(REF, JOB, SETTINGS, started=120.5)
    assert job["metadata"]["name"] == "fraud-drift-2"
    assert job["metadata"]["ownerReferences"][0]["uid"] == "uid-9"
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["backoffLimit"] == 1 and spec["ttlSecondsAfterFinished"] > 0 and spec["activeDeadlineSeconds"] > 0
    container = pod["containers"][0]
    assert container["image"] == "kubeloop/runtime:1"
    assert container["command"][-2:] == ["--summary", "/dev/termination-log"]
    assert container["securityContext"]["readOnlyRootFilesystem"] and pod["securityContext"]["runAsNonRoot"]
    assert pod["automountServiceAccountToken"] is False and pod["restartPolicy"] == "Never"
    env = {e["name"]: e["value"] for e in container["env"]}
    # Pods reach MLflow and the default repository at the cluster's addresses, not the operator's.
    assert json.loads(env["KUBELOOP_DRIFT_JOB"]) == {**JOB, "tracking_uri": "http://mlflow.mlflow.svc:5000",
                                                     "feast_repo": "s3://feast/default"}
    assert env["AWS_ENDPOINT_URL_S3"] == "http://s3.storage:8333"
    assert container["envFrom"] == [{"secretRef": {"name": "logs-s3"}}]


def _finish(objects: FakeObjects, name: str, message: str | None, failed: bool = False) -> None:
    objects.set_status("Job", "ml", name, conditions=[{"type": "Failed" if failed else "Complete", "status": "True",
                                                       "reason": "BackoffLimitExceeded" if failed else ""}])
    terminated = {"exitCode": 1 if failed else 0, **({"message": message} if message else {})}
    objects.objects[("Pod", "ml", f"{name}-x")] = {
        "kind": "Pod", "metadata": {"name": f"{name}-x", "namespace": "ml", "labels": {"job-name": name}},
        "status": {"containerStatuses": [{"state": {"terminated": terminated}}]}}


@pytest.fixture
def monitor(tmp_path):
    clock = iter(range(0, 100_000, 60))
    return KubernetesDriftMonitor(FakeObjects(), SETTINGS, tmp_path, clock=lambda: next(clock))


def _jobs(monitor) -> list[str]:
    return sorted(name for (kind, _ns, name) in monitor.kube.objects if kind == "Job")


def test_one_job_runs_at_a_time_and_its_result_outlives_it(monitor):
    monitor.start(REF, JOB)
    monitor.start(REF, JOB)
    assert _jobs(monitor) == ["fraud-drift-0"] and monitor.running(REF) and monitor.latest(REF) is None
    result = {"service": "ml/fraud", "model": "fraud", "version": "3", "at": 5.0, "share": 0.5, "drifted": True,
              "rows": 900, "threshold": 0.3, "scores": {"a": 0.01}, "features_drifted": ["a"]}
    _finish(monitor.kube, "fraud-drift-0", json.dumps(result))
    assert not monitor.running(REF) and monitor.latest(REF) == result
    monitor.kube.delete("batch/v1", "Job", "fraud-drift-0", "ml")  # its TTL passed
    assert monitor.latest(REF) == result


def test_older_jobs_go_when_the_next_starts(monitor):
    for _ in range(KEEP_JOBS + 2):
        monitor.start(REF, JOB)
        _finish(monitor.kube, _jobs(monitor)[-1], json.dumps({"at": 1.0, "skipped": "few rows", "rows": 3}))
        for (kind, _ns, name), obj in monitor.kube.objects.items():
            if kind == "Job":
                obj["metadata"]["creationTimestamp"] = f"2026-11-24T00:{name.rsplit('-', 1)[1].zfill(2)}:00Z"
    assert len(_jobs(monitor)) == KEEP_JOBS


def test_a_job_that_left_no_result_is_reported_failed(monitor):
    monitor.start(REF, JOB)
    _finish(monitor.kube, "fraud-drift-0", None, failed=True)
    assert "fraud-drift-0 failed: BackoffLimitExceeded" in monitor.latest(REF)["error"]


def test_forgetting_a_service_deletes_its_jobs_and_results(monitor, tmp_path):
    monitor.start(REF, JOB)
    _finish(monitor.kube, "fraud-drift-0", json.dumps({"at": 1.0, "skipped": "few rows", "rows": 0}))
    assert monitor.latest(REF)
    monitor.forget(REF)
    assert _jobs(monitor) == [] and monitor.latest(REF) is None


def test_the_summary_fits_a_termination_message():
    result = {"share": 0.5, "drifted": True, "rows": 10, "methods": {f"f{i}": "K-S p_value" for i in range(300)},
              "scores": {f"feature_number_{i}": 0.123456789 for i in range(300)}, "features_drifted": ["f1"]}
    text = summary(result)
    assert len(text.encode()) <= SUMMARY_BYTES
    assert json.loads(text) == {"share": 0.5, "drifted": True, "rows": 10, "features_drifted": ["f1"]}
    small = {"share": 0.1, "drifted": False, "scores": {"a": 0.9}, "methods": {"a": "psi"}}
    assert json.loads(summary(small)) == {"share": 0.1, "drifted": False, "scores": {"a": 0.9}}


def test_a_pods_job_comes_from_its_environment(tmp_path, monkeypatch):
    """What the Job's Pod reads is a whole DriftJob: the reconciler's part and the monitor's."""
    container = build_drift_job(REF, JOB, SETTINGS, started=0)["spec"]["template"]["spec"]["containers"][0]
    monkeypatch.setenv("KUBELOOP_DRIFT_JOB", next(e["value"] for e in container["env"]
                                                  if e["name"] == "KUBELOOP_DRIFT_JOB"))
    job = DriftJob.read(tmp_path)
    assert (job.request_log, job.feast_repo) == ("s3://requests/ml-fraud", "s3://feast/default")


def test_an_outcome_job_is_the_same_runner_with_its_own_module_variable_and_purpose(tmp_path):
    """The outcome join on a cluster: a Job of its own kind beside the drift
    Jobs of the same service, each monitor seeing only its own."""
    from kubeloop.monitoring.base import OUTCOMES

    job = build_drift_job(REF, {"service": "ml/fraud"}, SETTINGS, started=120.5, kind=OUTCOMES)
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert job["metadata"]["name"] == "fraud-outcomes-2"
    assert job["metadata"]["labels"]["kubeloop.dev/purpose"] == "outcomes"
    assert container["command"][:3] == ["python", "-m", "kubeloop.monitoring.outcomes.job"]
    assert [e["name"] for e in container["env"]][0] == "KUBELOOP_OUTCOME_JOB"
    objects = FakeObjects()
    drift = KubernetesDriftMonitor(objects, SETTINGS, tmp_path / "monitoring", clock=lambda: 60.0)
    outcomes = KubernetesDriftMonitor(objects, SETTINGS, tmp_path / "outcomes", clock=lambda: 60.0, kind=OUTCOMES)
    drift.start(REF, JOB)
    assert not outcomes.running(REF) and drift.running(REF)
    outcomes.start(REF, {"service": "ml/fraud"})
    assert sorted(name for (kind, _, name) in objects.objects if kind == "Job") == ["fraud-drift-1", "fraud-outcomes-1"]
