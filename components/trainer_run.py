"""One pipeline run on the trainer backend, as its Pods read it.

The operator's trainer backend (and the kfp backend's multi-node step) turn
a TrainingJob's run into one Kubeflow Trainer TrainJob. Its dataset
initializer (kubeloop.components.initializer) and its node Pods
(kubeloop.components.distributed --trainer-run) read the run from the
environment variable RUN_ENV; everything they exchange lives below the run's
prefix in object storage, which outlives any one Pod:

    <prefix>/data/         dataset.parquet, info.json, validation.json (the initializer)
    <prefix>/checkpoints/  the checkpoint rank 0 publishes every epoch
    <prefix>/model/        state.pt and result.json, where the run's output asks for them

An optimisation run is one Job whose Pod (kubeloop.components.optimizer_pod)
reads OptimizationRun from OPTIMIZATION_ENV and keeps nothing between
attempts: its registration step finds a version it registered before.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import ClassVar

RUN_ENV = "KUBELOOP_RUN"
OPTIMIZATION_ENV = "KUBELOOP_OPTIMIZATION_RUN"
STORE_ENV = "KUBELOOP_FEATURE_STORE"
"""The job's feature_store.yaml, by reference to its ConfigMap's key."""
DATASET, INFO, VALIDATION = "dataset.parquet", "info.json", "validation.json"
DATA_WRONG_EXIT = 3
"""The dataset initializer's exit status when its data is wrong (a finding in
fail mode, no store to join from): another try would find the same."""
NO_STORE = ("the trainer backend reads features in a Pod, which cannot open the operator's default repository "
            "folder: set spec.features.store.configMap to the ConfigMap of the store's published feature_store.yaml")


class _Environment:
    """A run that its Pods read from one environment variable, as JSON."""

    ENV: ClassVar[str]
    ROLE: ClassVar[str]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str):  # noqa: ANN206 - the subclass
        return cls(**json.loads(text))

    @classmethod
    def from_environment(cls):  # noqa: ANN206 - the subclass
        try:
            return cls.from_json(os.environ[cls.ENV])
        except KeyError:
            raise SystemExit(f"{cls.ENV} is not set: this entry point runs in {cls.ROLE}") from None


@dataclass(frozen=True)
class TrainerRun(_Environment):
    ENV: ClassVar[str] = RUN_ENV
    ROLE: ClassVar[str] = "a trainer backend's TrainJob"

    spec: str
    """The TrainingJob's spec as JSON (the types its manifest gave)."""
    pipeline_run: str
    owner: str
    spec_hash: str
    git_sha: str
    tracking_uri: str
    prefix: str
    """The run's s3:// prefix."""
    trainjob: str
    """namespace/name of the TrainJob, recorded in the version's lineage."""
    output: str = ""
    """Where rank 0 leaves the model (state.pt, result.json) for the
    pipeline's own evaluate and register steps (the kfp backend's multi-node
    step); empty: rank 0 evaluates and registers (the trainer backend)."""

    @property
    def data(self) -> str:
        return f"{self.prefix}/data"

    @property
    def checkpoints(self) -> str:
        return f"{self.prefix}/checkpoints"


@dataclass(frozen=True)
class OptimizationRun(_Environment):
    ENV: ClassVar[str] = OPTIMIZATION_ENV
    ROLE: ClassVar[str] = "a trainer backend's optimisation Job"

    spec: str
    """The OptimizedModel's spec as JSON."""
    source_version: str
    """The version the operator resolved (and pinned) for this generation."""
    pipeline_run: str
    owner: str
    git_sha: str
    tracking_uri: str
