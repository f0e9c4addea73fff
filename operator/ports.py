"""The external systems a reconciler may use, passed in rather than imported:
the composition root (kubeloop.operator.wiring) builds the real ones, tests
build whatever they need."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

from kubeloop.featurestore.base import FeatureStores
from kubeloop.gpu.placement import NodeInfo
from kubeloop.monitoring.base import DriftMonitor
from kubeloop.monitoring.outcomes.traffic import TrafficSample
from kubeloop.pipelines.backends.base import PipelineBackend
from kubeloop.registry.base import ModelRegistry
from kubeloop.serving.base import ServingBackend


class TrafficAnalysis(Protocol):
    """The front's measurements of two versions (kubeloop.monitoring.outcomes.traffic)."""

    def sample(self, service: str, champion: str, challenger: str, window: float, settle: float = 0.0,
               ) -> TrafficSample: ...


class Objects(Protocol):
    """Kubernetes objects the reconcilers create and read (kubeloop.kube.Kube)."""

    def apply(self, obj: dict) -> dict: ...

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict | None: ...

    def list(self, api_version: str, kind: str, namespace: str | None = None,
             label_selector: str | None = None) -> list[dict]: ...

    def merge_patch(self, api_version: str, kind: str, name: str, patch: dict, namespace: str | None = None,
                    subresource: str | None = None) -> dict: ...


@dataclass
class Ports:
    registry: ModelRegistry
    pipelines: dict[str, PipelineBackend] = field(default_factory=dict)
    serving: dict[str, ServingBackend] = field(default_factory=dict)
    fleet: Callable[..., list[NodeInfo]] = lambda excluding=None: []
    """The GPU fleet as the InferenceService `excluding` sees it: what its own Pods hold counts as free."""
    watch_serving_pods: Callable[[Callable[[str, str], None]], None] = lambda tell: None
    """Have tell(namespace, service) called when one of a service's Pods appears, goes, or changes its
    readiness or troubles (the cluster backends' Pod watch; nothing tells on the local backend)."""
    default_pipeline_backend: str = "local"
    default_serving_backend: str = "kubernetes"
    objects: Objects | None = None
    """Child custom objects (drift-triggered TrainingJobs and OptimizedModels)."""
    monitor: DriftMonitor | None = None
    outcomes: DriftMonitor | None = None
    """Outcome jobs: late labels joined to logged predictions (the drift monitor's runner, another job)."""
    traffic: TrafficAnalysis | None = None
    """What rollouts are analysed on; None: no Prometheus, rollouts wait."""
    features: FeatureStores = field(default_factory=FeatureStores)
    clock: Callable[[], float] = time.time
