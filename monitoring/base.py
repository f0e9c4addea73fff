"""The drift monitor port: run an InferenceService's drift job, and tell
what its latest run found."""

from __future__ import annotations

import abc

from kubeloop.api.refs import ObjectRef


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
