"""The drift monitor port: run an InferenceService's drift job, and tell
what its latest run found."""

from __future__ import annotations

import abc
import json
from dataclasses import dataclass
from pathlib import Path

from kubeloop.api.refs import ObjectRef


@dataclass(frozen=True)
class JobKind:
    """A kind of monitoring job: both runners (a process beside the
    operator, a Job on a cluster) run either kind the same way."""

    name: str
    """The job's purpose: its process's, its Job's name part and label."""
    module: str
    """The module run as `python -m MODULE <folder>`."""
    env: str
    """The variable a Job's Pod gets its job in."""
    folder: str
    """Where results are kept under the operator's state directory."""


DRIFT = JobKind("drift", "kubeloop.monitoring.job", "KUBELOOP_DRIFT_JOB", "monitoring")
OUTCOMES = JobKind("outcomes", "kubeloop.monitoring.outcomes.job", "KUBELOOP_OUTCOME_JOB", "outcomes")


def read_latest(folder: Path) -> dict | None:
    """The latest result kept in an object's folder (where both monitors
    keep it, and /metrics reads it); None before the first."""
    try:
        return json.loads((folder / "latest.json").read_text())
    except (FileNotFoundError, ValueError):
        return None


class DriftMonitor(abc.ABC):
    @abc.abstractmethod
    def running(self, ref: ObjectRef) -> bool:
        """Whether a drift job of the object runs now."""

    @abc.abstractmethod
    def start(self, ref: ObjectRef, job: dict) -> None:
        """Start a drift job (a no-op while one runs). The job says what to
        check (kubeloop.monitoring.job.DriftJob); the monitor adds where MLflow
        and the default feature repository are, as its jobs reach them."""

    @abc.abstractmethod
    def latest(self, ref: ObjectRef) -> dict | None:
        """The latest result (see kubeloop.monitoring.job), or None."""

    @abc.abstractmethod
    def forget(self, ref: ObjectRef) -> None:
        """Drop the object's results (it was deleted)."""
