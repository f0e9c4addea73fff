"""Keeping online stores fresh on a cluster: each materialisation is a
Kubernetes Job in the operator's own namespace on the runtime image
(kubeloop.featurestore.job), never Feast in the operator's Pod. The
Materializer (kubeloop.featurestore.freshness) keeps its schedule, backoff,
condition and metrics; MaterializeJobs is the run it calls on a worker
thread: it starts the store's Job (or finds the one already running),
waits for it, and reads the result the Job's Pod left as its termination
message, as kubeloop.jobrunner runs every kind of Job.

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
from kubeloop.api.jobs import TERMINATION_LOG, JobResources, Resources, object_store_access, task_job
from kubeloop.featurestore.freshness import Materialized, Run, StoreNeed, job_request, published, store_key
from kubeloop.jobrunner import LABEL_PURPOSE, JobRunner

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
    resources: Resources = JobResources().materialize


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
        "resources": settings.resources.container(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    })
    object_store_access(container, settings.object_store_secret, settings.object_store_endpoint)
    metadata = {"name": job_name(need.store, end), "namespace": settings.namespace, "labels": labels}
    # No retry inside the Job: the Materializer retries with its own backoff.
    return task_job(metadata, labels, container, deadline=settings.deadline_seconds, ttl=TTL_SECONDS,
                    backoff_limit=0, volumes=[{"name": "tmp", "emptyDir": {}}])


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
            return _failed(UNPUBLISHED)
        runner = self._runner(need.store)
        name = runner.start(lambda: build_materialize_job(need, end, self.settings))
        job = runner.wait(name, self.settings.deadline_seconds + SCHEDULING_GRACE_SECONDS, self._closed, self.poll,
                          self.clock)
        if isinstance(job, str):
            return _failed(job)
        outcome = runner.result(job, Materialized.from_summary, _failed)
        return _failed(f"materialisation Job {name} completed without a result") if outcome is None else outcome

    def _runner(self, store: str) -> JobRunner:
        """The store's materialisation Jobs."""
        selector = f"{LABEL_PURPOSE}={PURPOSE},{LABEL_STORE}={store_key(store)}"
        return JobRunner(self.kube, self.settings.namespace, selector, "materialisation", KEEP_JOBS)

    def close(self) -> None:
        """Stop waiting: runs in flight return at once (their Jobs go on)."""
        self._closed.set()


def _failed(error: str) -> Materialized:
    return Materialized("", {}, error)
