"""The pipeline backend port."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Literal

RunPhase = Literal["Pending", "Running", "Succeeded", "Failed"]


class BackendUnavailable(Exception):
    """The backend cannot be reached right now (retry with backoff)."""


@dataclass(frozen=True)
class RunRequest:
    """A pipeline run to start. The name is the idempotency key: submitting a
    request whose name already has a run returns that run instead of a second."""

    name: str
    pipeline: Literal["training", "optimization"]
    arguments: dict[str, Any]
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RunStatus:
    """What a backend knows of a run."""

    run_id: str
    phase: RunPhase
    url: str | None = None
    outputs: dict[str, Any] = field(default_factory=dict)
    """The pipeline's results once it succeeded (metrics, registered model)."""
    error: str | None = None
    """The failing step and its message once it failed."""
    progress: str | None = None
    """A line on what the run is doing now."""

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


class PipelineBackend(abc.ABC):
    """Runs compiled kubeloop pipelines somewhere."""

    name: str
    tensorrt: bool = False
    """Whether its optimiser steps have TensorRT (decides which techniques a GPU target may ask for)."""

    @abc.abstractmethod
    def submit(self, request: RunRequest) -> RunStatus:
        """Start the run unless one named request.name exists; return its status."""

    @abc.abstractmethod
    def status(self, run_id: str) -> RunStatus | None:
        """The run's current status, or None if the backend does not know it."""

    @abc.abstractmethod
    def cancel(self, run_id: str) -> None:
        """Stop the run if it is still going; a no-op otherwise."""
