"""Run-to-completion Jobs on a cluster, run one way for every kind kubeloop
starts (drift and outcome checks, feature materialisation).

The Jobs of one kind are found by their labels in one namespace, and at
most one of them runs at a time. A new Job's name is its run's, so a create
that answers 409 AlreadyExists has found that run's Job (a retried create,
a restarted operator's): it is adopted, not an error. A finished Job is
read from the summary its Pod left as its termination message, else from
why the Job failed. A kind stays bounded: before the next Job starts, older
finished ones are deleted so that the newest few remain (each also expires
through its own TTL).

The functions decide, on plain dicts; JobRunner does the I/O, through
kubeloop.kube. What a Job runs (kubeloop.api.jobs builds it) is the
caller's.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, TypeVar

from kubeloop.api.jobs import failure, finished, termination_message
from kubeloop.kube import Kube, KubeError

LABEL_PURPOSE = "kubeloop.dev/purpose"
"""The label whose value tells one kind of Job from the others."""
T = TypeVar("T")


def newest_first(jobs: list[dict]) -> list[dict]:
    """Jobs created within the same second come in a fixed order (by name),
    so which are pruned never depends on the order the API listed them in."""
    return sorted(jobs, key=lambda j: (j["metadata"].get("creationTimestamp", ""), j["metadata"]["name"]),
                  reverse=True)


def unfinished(jobs: list[dict]) -> dict | None:
    return next((job for job in jobs if not finished(job)), None)


def to_prune(jobs: list[dict], keep: int) -> list[str]:
    """The names of the Jobs to delete before the next one starts, so that,
    counting it, the newest keep (1 or more) remain."""
    return [job["metadata"]["name"] for job in newest_first(jobs)[keep - 1:]]


def read_result(what: str, job: dict, message: str | None, read: Callable[[str], T],
                error: Callable[[str], T]) -> T | None:
    """What a Job did: the summary its Pod left (message) as read makes it,
    or an error when read cannot; without a summary (the Pod was killed,
    evicted, or past the Job's deadline), an error with the Job's reason if
    it failed. None otherwise: while it runs, or once it completed without
    a summary, which each kind takes its own way."""
    name = job["metadata"]["name"]
    if message:
        try:
            return read(message)
        except (ValueError, KeyError, TypeError):
            return error(f"{what} Job {name} left an unreadable result: {message[:200]}")
    if failure(job):
        return error(f"{what} Job {name} failed: {failure(job)}")
    return None


class JobRunner:
    """The Jobs of one kind: those in namespace that selector matches."""

    def __init__(self, kube: Kube, namespace: str, selector: str, what: str, keep: int):
        self.kube = kube
        self.namespace = namespace
        self.selector = selector
        self.what = what
        """What the kind's Jobs do, as messages name them ("drift", "materialisation")."""
        self.keep = keep

    def jobs(self) -> list[dict]:
        return newest_first(self.kube.list("batch/v1", "Job", self.namespace, self.selector))

    def running(self) -> bool:
        return unfinished(self.jobs()) is not None

    def newest_finished(self) -> dict | None:
        return next((job for job in self.jobs() if finished(job)), None)

    def start(self, build: Callable[[], dict]) -> str:
        """The name of the Job that runs now: the kind's running one, else a
        new one from build(), once older ones are pruned."""
        jobs = self.jobs()
        running = unfinished(jobs)
        if running is not None:
            return running["metadata"]["name"]
        for name in to_prune(jobs, self.keep):
            self.kube.delete("batch/v1", "Job", name, self.namespace)
        job = build()
        try:
            self.kube.create(job)
        except KubeError as exc:
            if exc.status != 409:  # 409: this run's Job exists already; it is ours
                raise
        return job["metadata"]["name"]

    def wait(self, name: str, seconds: float, stop: threading.Event, poll: float,
             clock: Callable[[], float] = time.monotonic) -> dict | str:
        """The Job once it finished; else why it never will be read: it was
        deleted, it ran past seconds, or stop was set (the Job goes on)."""
        deadline = clock() + seconds
        while True:
            job = self.kube.get("batch/v1", "Job", name, self.namespace)
            if job is None:
                return f"{self.what} Job {name} was deleted before it finished"
            if finished(job):
                return job
            if clock() > deadline:
                return f"{self.what} Job {name} did not finish within {seconds} s"
            if stop.wait(poll):
                return f"the operator stopped while {self.what} Job {name} ran"

    def result(self, job: dict, read: Callable[[str], T], error: Callable[[str], T]) -> T | None:
        """read_result over the termination message the Job's Pods left."""
        pods = self.kube.list("v1", "Pod", self.namespace, f"job-name={job['metadata']['name']}")
        return read_result(self.what, job, termination_message(pods), read, error)

    def delete_all(self) -> None:
        for job in self.jobs():
            self.kube.delete("batch/v1", "Job", job["metadata"]["name"], self.namespace)
