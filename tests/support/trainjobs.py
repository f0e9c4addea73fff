"""TrainJobs on the real node through Kubeflow Trainer, for the e2e test and
the bench: the store, the data, one run, and what the run reported."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import boto3

from kubeloop.api.training import TrainingJobSpec
from kubeloop.components.training import SHARED_CHECKPOINT
from kubeloop.components.trainjob import TRAINER_API_VERSION, build_trainjob, trainjob_finished
from kubeloop.dev.objectstore import TRAINING_BUCKET
from tests.support.models import synthetic_dataset
from tests.support.waiting import wait_for

STORE_SECRET = "store"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


@dataclass
class Run:
    """A finished TrainJob: its node Pods, what rank 0 wrote, and its timings."""

    pods: list[dict]
    result: dict
    first_checkpoint_s: float
    total_s: float
    first_checkpoint_epoch: int
    """The epoch of the first checkpoint seen published (polled every half second)."""


class TrainJobs:
    """TrainJobs in one namespace, their data and models under one prefix of the training bucket."""

    def __init__(self, kube, env: dict[str, str], namespace: str, image: str, tmp: Path):  # noqa: ANN001 - a Kube
        self.kube, self.env, self.namespace, self.image, self.tmp = kube, env, namespace, image, tmp
        self.s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL_S3"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                               aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                               region_name=env["AWS_DEFAULT_REGION"])
        kube.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": STORE_SECRET, "namespace": namespace},
                    "stringData": {k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}})
        self.info = synthetic_dataset(tmp / "data.parquet", rows=40_000, holdout=8_000)
        self.s3.upload_file(str(tmp / "data.parquet"), TRAINING_BUCKET, f"{namespace}/data.parquet")

    def uri(self, *parts: str) -> str:
        return "/".join([f"s3://{TRAINING_BUCKET}/{self.namespace}", *parts])

    def spec(self, nodes: int, epochs: int) -> TrainingJobSpec:
        return TrainingJobSpec.model_validate({
            "modelName": "m", "features": {"featureViews": ["synthetic"], "labels": {"source": "t", "column": "y"}},
            "distributed": {"nodes": nodes}, "hyperparameters": {"epochs": epochs, "batchSize": 32},
            "resources": {"cpu": "500m", "memory": "1536Mi"}})

    def run(self, name: str, nodes: int, epochs: int) -> Run:
        """Apply the TrainJob, see rank 0 publish a checkpoint, and wait for it to complete."""
        applied = time.monotonic()
        self.kube.apply(build_trainjob(name, self.namespace, self.spec(nodes, epochs), self.image,
                                       self.uri("data.parquet"), self.info.to_json(), self.uri(name, "model"),
                                       store_secret=STORE_SECRET, store_endpoint=self.env["AWS_ENDPOINT_URL_S3"],
                                       checkpoints=self.uri(name, "checkpoints")))
        published = wait_for(lambda: self._checkpoint_epoch(name), timeout=600, interval=0.5,
                             what=f"rank 0's first checkpoint of {name}", seen=lambda: self._phases(name))
        first = time.monotonic() - applied
        wait_for(lambda: self._finished(name), timeout=900, interval=1, what=f"TrainJob {name} Complete",
                 seen=lambda: self._phases(name))
        total = time.monotonic() - applied
        local = self.tmp / name
        local.mkdir(exist_ok=True)
        for key in ("result.json", "state.pt"):
            self.s3.download_file(TRAINING_BUCKET, f"{self.namespace}/{name}/model/{key}", str(local / key))
        return Run([p for p in self.pods(name) if p["status"]["phase"] == "Succeeded"],
                   json.loads((local / "result.json").read_text()), first, total, published)

    def pods(self, name: str) -> list[dict]:
        return self.kube.list("v1", "Pod", self.namespace, f"jobset.sigs.k8s.io/jobset-name={name}")

    def _phases(self, name: str) -> str:
        return str([(p["metadata"]["name"], p["status"].get("phase")) for p in self.pods(name)])

    def _finished(self, name: str) -> bool:
        done, error = trainjob_finished(self.kube.get(TRAINER_API_VERSION, "TrainJob", name, self.namespace) or {})
        assert not error, f"TrainJob {name}: {error}"
        return done

    def _checkpoint_epoch(self, name: str) -> int:
        import torch

        path = self.tmp / f"{name}-checkpoint.pt"
        try:
            self.s3.download_file(TRAINING_BUCKET, f"{self.namespace}/{name}/checkpoints/{SHARED_CHECKPOINT}",
                                  str(path))
        except self.s3.exceptions.ClientError:
            return 0
        return torch.load(path, map_location="cpu", weights_only=True)["epoch"]
