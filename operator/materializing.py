"""Keeping online stores fresh on a cluster: each materialisation is a
Kubernetes Job in the operator's own namespace on the runtime image
(kubeloop.featurestore.job), never Feast in the operator's Pod. The
Materializer (kubeloop.featurestore.freshness) keeps its schedule, backoff,
condition and metrics; MaterializeJobs is the run it calls on a worker
thread: it starts the store's Job (or finds the one already running),
waits for it through kubeloop.kube, and reads the result the Job's Pod left
as its termination message.

Idempotent across restarts: a Job is named by the store's fingerprint and
the run's end, and a store's Job still running (a restarted operator's
earlier one) is waited for instead of a second one starting. Bounded: the
newest KEEP_JOBS finished Jobs of a store are kept, older ones deleted when
the next starts (each also expires TTL_SECONDS after it finished).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

from kubeloop.api.children import dns_name, restricted
from kubeloop.api.jobs import (
    TERMINATION_LOG, failure, finished, object_store_access, task_job, termination_message,
)
from kubeloop.featurestore.freshness import Materialized, Run, StoreNeed, job_request, published, store_key
from kubeloop.kube import KubeError

LABEL_PURPOSE = "kubeloop.dev/purpose"
LABEL_STORE = "kubeloop.dev/feature-store"
PURPOSE = "materialize"
ENV = "KUBELOOP_MATERIALIZE"
"""Where the Pod reads its run (kubeloop.featurestore.job.ENV)."""
KEEP_JOBS = 3
TTL_SECONDS = 3600
DEADLINE_SECONDS = 1800
POLL_SECONDS = 1.0
UNPUBLISHED = ("the feature store is recorded as a repository folder on the operator's machine, which a Job's "
               "Pod cannot open: publish its feature_store.yaml (registry, sources and online store reachable "
               "from Pods, for example in object storage and Redis) and record that text as the version's "
               "kubeloop.feature_store")
SCHEDULING_GRACE_SECONDS = 120
"""How long past its deadline a Job may take to be marked failed before the
run stops waiting for it."""


@dataclass(frozen=True)
class MaterializeJobSettings:
    """What every materialisation Job gets (operator configuration)."""

    image: str
    """The runtime image (Feast, pandas, boto3, redis)."""
    namespace: str
    """The operator's own namespace: stores are shared by services of any namespace."""
    object_store_secret: str | None = None
    """A Secret in that namespace with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, by reference."""
    object_store_endpoint: str | None = None
    deadline_seconds: int = DEADLINE_SECONDS


def job_name(store: str, end: float) -> str:
    """One name per store and run: the same run started twice (a retried
    create, a restarted operator) is one Job."""
    return dns_name("materialize", store_key(store), str(int(end)))


def build_materialize_job(need: StoreNeed, end: float, settings: MaterializeJobSettings) -> dict:
    """The Job that materialises one store up to end (pure)."""
    labels = {"app.kubernetes.io/managed-by": "kubeloop", LABEL_PURPOSE: PURPOSE,
              LABEL_STORE: store_key(need.store)}
    container = restricted({
        "name": "materialize",
        "image": settings.image,
        "command": ["python", "-m", "kubeloop.featurestore.job", "--summary", TERMINATION_LOG],
        "env": [{"name": ENV, "value": job_request(need, end)}, {"name": "HOME", "value": "/tmp"}],
        "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    })
    object_store_access(container, settings.object_store_secret, settings.object_store_endpoint)
    metadata = {"name": job_name(need.store, end), "namespace": settings.namespace, "labels": labels}
    # No retry inside the Job: the Materializer retries with its own backoff.
    return task_job(metadata, labels, container, deadline=settings.deadline_seconds, ttl=TTL_SECONDS,
                    backoff_limit=0, volumes=[{"name": "tmp", "emptyDir": {}}])


def job_outcome(job: dict, message: str | None, project: str = "") -> Materialized | None:
    """What a finished Job did: its Pod's summary, else (killed, evicted,
    past its deadline) an error with the Job's reason; None while it runs."""
    name = job["metadata"]["name"]
    if message:
        try:
            return Materialized.from_summary(message)
        except (ValueError, KeyError, TypeError):
            return Materialized(project, {}, f"materialisation Job {name} left an unreadable result: {message[:200]}")
    if failure(job):
        return Materialized(project, {}, f"materialisation Job {name} failed: {failure(job)}")
    if finished(job):
        return Materialized(project, {}, f"materialisation Job {name} completed without a result")
    return None


class MaterializeJobs:
    """The Materializer's run on a cluster: run(need, end) -> Materialized,
    blocking its worker thread until the store's Job finishes.

    Only a store recorded as feature_store.yaml text can be opened in a Pod.
    A repository folder is a path on the operator's machine, which only the
    local backend reads: `local` materialises it in the operator's process
    (as without Jobs); without it, the run fails saying what to do."""

    def __init__(self, kube, settings: MaterializeJobSettings,  # noqa: ANN001 - kubeloop.kube.Kube
                 clock: Callable[[], float] = time.monotonic, poll: float = POLL_SECONDS, local: Run | None = None):
        self.kube = kube
        self.settings = settings
        self.clock = clock
        self.poll = poll
        self.local = local
        self._closed = threading.Event()

    def __call__(self, need: StoreNeed, end: float) -> Materialized:
        if not published(need.store):
            if self.local is not None:
                return self.local(need, end)
            return Materialized("", {}, UNPUBLISHED)
        name = self._start(need, end)
        deadline = self.clock() + self.settings.deadline_seconds + SCHEDULING_GRACE_SECONDS
        while True:
            job = self.kube.get("batch/v1", "Job", name, self.settings.namespace)
            if job is None:
                return Materialized("", {}, f"materialisation Job {name} was deleted before it finished")
            if finished(job):
                pods = self.kube.list("v1", "Pod", self.settings.namespace, f"job-name={name}")
                return job_outcome(job, termination_message(pods))
            if self.clock() > deadline:
                return Materialized("", {}, f"materialisation Job {name} did not finish within "
                                            f"{self.settings.deadline_seconds + SCHEDULING_GRACE_SECONDS} s")
            if self._closed.wait(self.poll):
                return Materialized("", {}, f"the operator stopped while materialisation Job {name} ran")

    def _start(self, need: StoreNeed, end: float) -> str:
        """The Job this run waits for: the store's running one, else a new
        one (older finished ones deleted first, KEEP_JOBS kept)."""
        jobs = self.jobs(need.store)
        running = next((j for j in jobs if not finished(j)), None)
        if running is not None:
            return running["metadata"]["name"]
        for old in jobs[KEEP_JOBS - 1:]:
            self.kube.delete("batch/v1", "Job", old["metadata"]["name"], self.settings.namespace)
        job = build_materialize_job(need, end, self.settings)
        try:
            self.kube.create(job)
        except KubeError as exc:
            if exc.status != 409:  # 409: this run's Job exists already; wait for it
                raise
        return job["metadata"]["name"]

    def jobs(self, store: str) -> list[dict]:
        """The store's materialisation Jobs, newest first."""
        jobs = self.kube.list("batch/v1", "Job", self.settings.namespace,
                              f"{LABEL_PURPOSE}={PURPOSE},{LABEL_STORE}={store_key(store)}")
        return sorted(jobs, key=lambda j: (j["metadata"].get("creationTimestamp", ""), j["metadata"]["name"]),
                      reverse=True)

    def close(self) -> None:
        """Stop waiting: runs in flight return at once (their Jobs go on)."""
        self._closed.set()
