"""Drift checks as Kubernetes Jobs (the cluster path): the operator never
runs Evidently in its own Pod. Each check is a Job in the InferenceService's
namespace on the runtime image (kubeloop.monitoring.job), reading the
request log from object storage and the reference from the served version's
feature store, logging its report to MLflow. Its result comes back as the
Pod's termination message; the operator keeps it where the local monitor
keeps its results, so the reconciler and /metrics read both alike.

Bounded: the newest KEEP_JOBS Jobs of a service are kept, older ones deleted
when the next starts (each also expires TTL_SECONDS after it finished).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from kubeloop.api.children import child_metadata, dns_name, owner_labels, owner_selector, restricted
from kubeloop.api.jobs import TERMINATION_LOG, failure, finished, object_store_access, task_job, termination_message
from kubeloop.api.refs import ObjectRef
from kubeloop.files import write_atomic
from kubeloop.kube import Kube, KubeError
from kubeloop.monitoring.base import DRIFT, DriftMonitor, JobKind

LABEL_PURPOSE = "kubeloop.dev/purpose"
KEEP_JOBS = 3
TTL_SECONDS = 3 * 86400
DEADLINE_SECONDS = 1800
WORK = "/work"


@dataclass(frozen=True)
class DriftJobSettings:
    """What every drift Job's Pod gets (operator configuration)."""

    image: str
    tracking_uri: str
    """MLflow as Pods reach it."""
    feast_repo: str = ""
    """The default feature repository as Pods reach it (a versioned model names its own store)."""
    object_store_secret: str | None = None
    object_store_endpoint: str | None = None


def job_name(ref: ObjectRef, started: float, kind: JobKind = DRIFT) -> str:
    """One name per service, kind and minute: a second start within the
    minute (a restarted operator) finds the Job it already created."""
    return dns_name(ref.name, kind.name, str(int(started // 60)))


def build_drift_job(ref: ObjectRef, job: dict, settings: DriftJobSettings, started: float,
                    kind: JobKind = DRIFT) -> dict:
    """The Job that runs one monitoring job of the kind (pure)."""
    labels = {LABEL_PURPOSE: kind.name}
    env = [{"name": kind.env, "value": json.dumps(
        {**job, "tracking_uri": settings.tracking_uri, "feast_repo": settings.feast_repo}, sort_keys=True)}]
    container = restricted({
        "name": kind.name,
        "image": settings.image,
        "command": ["python", "-m", kind.module, WORK, "--summary", TERMINATION_LOG],
        "env": env,
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
        "volumeMounts": [{"name": "work", "mountPath": WORK}, {"name": "tmp", "mountPath": "/tmp"}],
    })
    object_store_access(container, settings.object_store_secret, settings.object_store_endpoint)
    return task_job(child_metadata(ref, job_name(ref, started, kind), labels), {**owner_labels(ref), **labels}, container,
                    deadline=DEADLINE_SECONDS, ttl=TTL_SECONDS, backoff_limit=1,
                    volumes=[{"name": "work", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}])


class KubernetesDriftMonitor(DriftMonitor):
    def __init__(self, kube: Kube, settings: DriftJobSettings, results: Path,
                 clock=time.time, kind: JobKind = DRIFT):  # noqa: ANN001 - () -> float
        self.kind = kind
        self.kube = kube
        self.settings = settings
        self.results = Path(results)
        self.clock = clock
        self._kept: dict[str, str] = {}
        """Service uid -> the Job whose result is kept (read once, not every reconcile)."""

    def folder(self, ref: ObjectRef) -> Path:
        return self.results / f"{ref.namespace}-{ref.name}"

    def _jobs(self, ref: ObjectRef) -> list[dict]:
        """The service's drift Jobs, newest first."""
        jobs = self.kube.list("batch/v1", "Job", ref.namespace, f"{owner_selector(ref)},{LABEL_PURPOSE}={self.kind.name}")
        return sorted(jobs, key=lambda j: j["metadata"].get("creationTimestamp", ""), reverse=True)

    def running(self, ref: ObjectRef) -> bool:
        return any(not finished(job) for job in self._jobs(ref))

    def start(self, ref: ObjectRef, job: dict) -> None:
        jobs = self._jobs(ref)
        if any(not finished(j) for j in jobs):
            return
        for old in jobs[KEEP_JOBS - 1:]:
            self.kube.delete("batch/v1", "Job", old["metadata"]["name"], ref.namespace)
        try:
            self.kube.create(build_drift_job(ref, job, self.settings, self.clock(), self.kind))
        except KubeError as exc:
            if exc.status != 409:  # 409: this minute's Job exists already
                raise

    def latest(self, ref: ObjectRef) -> dict | None:
        """The newest finished Job's result (kept, so it outlives the Job)."""
        done = next((j for j in self._jobs(ref) if finished(j)), None)
        if done is not None and self._kept.get(ref.uid) != done["metadata"]["name"]:
            result = self._result(ref, done)
            if result is not None:
                self.folder(ref).mkdir(parents=True, exist_ok=True)
                write_atomic(self.folder(ref) / "latest.json", json.dumps(result))
                self._kept[ref.uid] = done["metadata"]["name"]
        try:
            return json.loads((self.folder(ref) / "latest.json").read_text())
        except (FileNotFoundError, ValueError):
            return None

    def _result(self, ref: ObjectRef, job: dict) -> dict | None:
        """The summary the Job's Pod left as its termination message; for a
        Pod that left none (killed, evicted), what the Job says."""
        name = job["metadata"]["name"]
        message = termination_message(self.kube.list("v1", "Pod", ref.namespace, f"job-name={name}"))
        if message:
            try:
                return json.loads(message)
            except ValueError:
                return {"error": f"{self.kind.name} Job {name} left an unreadable result", "at": self.clock()}
        if failure(job):
            return {"error": f"{self.kind.name} Job {name} failed: {failure(job)}", "at": self.clock()}
        return None

    def forget(self, ref: ObjectRef) -> None:
        for job in self._jobs(ref):
            self.kube.delete("batch/v1", "Job", job["metadata"]["name"], ref.namespace)
        self._kept.pop(ref.uid, None)
        shutil.rmtree(self.folder(ref), ignore_errors=True)

