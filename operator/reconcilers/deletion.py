"""What a deleted object leaves to stop: its pipeline run, or its serving
processes and the monitors that watch it."""

from __future__ import annotations

from kubeloop.api.refs import ObjectRef
from kubeloop.operator.ports import Ports


def cancel_run(spec: dict, status: dict | None, ports: Ports) -> None:
    """A deleted TrainingJob's or OptimizedModel's run is cancelled if it is still going."""
    status = status or {}
    backend = ports.pipelines.get(status.get("backend") or spec.get("backend") or ports.default_pipeline_backend)
    if backend and status.get("runId") and status.get("phase") == "Running":
        backend.cancel(status["runId"])


def stop_serving(ref: ObjectRef, spec: dict, ports: Ports) -> None:
    """Backends that run processes outside Kubernetes stop them (on a cluster
    owner references remove the rest), and the drift monitor and the
    materialiser let go of the InferenceService."""
    backend = ports.serving.get(spec.get("backend") or ports.default_serving_backend)
    if backend:
        backend.delete(ref)
    if ports.monitor:
        ports.monitor.forget(ref)
    ports.features.forget(ref.uid)
