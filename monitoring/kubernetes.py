"""Drift checks as Kubernetes Jobs (the cluster path): the operator never
runs Evidently in its own Pod. Each check is a Job in the InferenceService's
namespace on the runtime image (kubeloop.monitoring.job), reading the
request log from object storage and the reference from the served version's
feature store, logging its report to MLflow. Its result comes back as the
Pod's termination message; the operator keeps it where the local monitor
keeps its results, so the reconciler and /metrics read both alike.

Bounded: the newest KEEP_JOBS Jobs of a service are kept, older ones deleted
when the next starts (each also expires TTL_SECONDS after it finished); the
Jobs run as kubeloop.jobrunner runs every kind.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from kubeloop.api.children import child_metadata, dns_name, owner_labels, owner_selector, restricted
from kubeloop.api.jobs import TERMINATION_LOG, JobResources, Resources, object_store_access, task_job
from kubeloop.api.refs import ObjectRef
from kubeloop.files import write_atomic
from kubeloop.jobrunner import LABEL_PURPOSE, JobRunner
from kubeloop.kube import Kube
from kubeloop.monitoring.base import DRIFT, DriftMonitor, JobKind, read_latest

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
    resources: Resources = JobResources().monitoring


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
        "resources": settings.resources.container(),
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

    def _runner(self, ref: ObjectRef) -> JobRunner:
        """The service's Jobs of this kind."""
        return JobRunner(self.kube, ref.namespace, f"{owner_selector(ref)},{LABEL_PURPOSE}={self.kind.name}",
                         self.kind.name, KEEP_JOBS)

    def running(self, ref: ObjectRef) -> bool:
        return self._runner(ref).running()

    def start(self, ref: ObjectRef, job: dict) -> None:
        self._runner(ref).start(lambda: build_drift_job(ref, job, self.settings, self.clock(), self.kind))

    def latest(self, ref: ObjectRef) -> dict | None:
        """The newest finished Job's result (kept, so it outlives the Job).
        One that completed without a summary keeps the one before."""
        runner = self._runner(ref)
        done = runner.newest_finished()
        if done is not None and self._kept.get(ref.uid) != done["metadata"]["name"]:
            result = runner.result(done, json.loads, self._error)
            if result is not None:
                self.folder(ref).mkdir(parents=True, exist_ok=True)
                write_atomic(self.folder(ref) / "latest.json", json.dumps(result))
                self._kept[ref.uid] = done["metadata"]["name"]
        return read_latest(self.folder(ref))

    def _error(self, message: str) -> dict:
        return {"error": message, "at": self.clock()}

    def forget(self, ref: ObjectRef) -> None:
        self._runner(ref).delete_all()
        self._kept.pop(ref.uid, None)
        shutil.rmtree(self.folder(ref), ignore_errors=True)
