"""The external systems a reconciler may use, passed in rather than imported:
the composition root (kubeloop.operator.wiring) builds the real ones, tests
build whatever they need."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from kubeloop.gpu.placement import NodeInfo
from kubeloop.pipelines.backends.base import PipelineBackend
from kubeloop.registry.base import ModelRegistry
from kubeloop.serving.base import ServingBackend


@dataclass
class Ports:
    registry: ModelRegistry
    pipelines: dict[str, PipelineBackend] = field(default_factory=dict)
    serving: dict[str, ServingBackend] = field(default_factory=dict)
    fleet: Callable[[], list[NodeInfo]] = list
    default_pipeline_backend: str = "local"
    default_serving_backend: str = "kubernetes"
    tracking_ui: str | None = None
    """Base URL of the tracking server's UI, for links in status."""
    tensorrt: bool = False
    """Whether the optimiser's image has TensorRT (decides which techniques a GPU target may ask for)."""
