"""One training pipeline run on the trainer backend, as its Pods read it.

The operator's trainer backend turns a TrainingJob's run into one Kubeflow
Trainer TrainJob. Its dataset initializer (kubeloop.components.initializer)
and its node Pods (kubeloop.components.distributed --trainer-run) read the run from
the environment variable RUN_ENV; everything they exchange lives below the
run's prefix in object storage, which outlives any one Pod:

    <prefix>/data/         dataset.parquet, info.json, validation.json (the initializer)
    <prefix>/checkpoints/  the checkpoint rank 0 publishes every epoch
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

RUN_ENV = "KUBELOOP_RUN"
STORE_ENV = "KUBELOOP_FEATURE_STORE"
"""The job's feature_store.yaml, by reference to its ConfigMap's key."""
DATASET, INFO, VALIDATION = "dataset.parquet", "info.json", "validation.json"
NO_STORE = ("the trainer backend reads features in a Pod, which cannot open the operator's default repository "
            "folder: set spec.features.store.configMap to the ConfigMap of the store's published feature_store.yaml")


@dataclass(frozen=True)
class TrainerRun:
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

    @property
    def data(self) -> str:
        return f"{self.prefix}/data"

    @property
    def checkpoints(self) -> str:
        return f"{self.prefix}/checkpoints"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "TrainerRun":
        return cls(**json.loads(text))

    @classmethod
    def from_environment(cls) -> "TrainerRun":
        try:
            return cls.from_json(os.environ[RUN_ENV])
        except KeyError:
            raise SystemExit(f"{RUN_ENV} is not set: this entry point runs in a trainer backend's TrainJob") from None
