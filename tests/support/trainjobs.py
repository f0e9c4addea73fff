"""TrainJobs on the real node through Kubeflow Trainer, for the e2e tests and
the bench: kubeloop's TrainJob on data prepared before (as the kfp
backend's multi-node step creates it), one run and what it reported; and
the trainer backend with its operator (TrainerCluster)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import boto3

from kubeloop.api.constants import API_VERSION
from kubeloop.api.training import TrainingJobSpec
from kubeloop.components.initializer import publish_data
from kubeloop.components.training import SHARED_CHECKPOINT
from kubeloop.components.trainjob import (TRAINER_API_VERSION, TrainerSettings, build_run_trainjob, plan_run,
                                          trainjob_finished)
from kubeloop.dev.objectstore import TRAINING_BUCKET
from tests.support.models import synthetic_dataset
from tests.support.operator import OperatorProcess
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
    """kubeloop's TrainJobs in one namespace, each run below its own prefix of the training bucket."""

    def __init__(self, kube, env: dict[str, str], namespace: str, image: str, tmp: Path):  # noqa: ANN001 - a Kube
        self.kube, self.env, self.namespace, self.tmp = kube, env, namespace, tmp
        self.s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL_S3"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                               aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                               region_name=env["AWS_DEFAULT_REGION"])
        self.settings = TrainerSettings(image=image, tracking_uri=env["MLFLOW_TRACKING_URI"], bucket=TRAINING_BUCKET,
                                        object_store_secret=STORE_SECRET,
                                        object_store_endpoint=env["AWS_ENDPOINT_URL_S3"])
        kube.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": STORE_SECRET, "namespace": namespace},
                    "stringData": {k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}})
        self.info = synthetic_dataset(tmp / "data.parquet", rows=40_000, holdout=8_000)

    def spec(self, nodes: int, epochs: int) -> TrainingJobSpec:
        return TrainingJobSpec.model_validate({
            "modelName": "m", "features": {"featureViews": ["synthetic"], "labels": {"source": "t", "column": "y"}},
            "distributed": {"nodes": nodes}, "hyperparameters": {"epochs": epochs, "batchSize": 32},
            "resources": {"cpu": "500m", "memory": "1536Mi"}})

    def run(self, name: str, nodes: int, epochs: int) -> Run:
        """Publish the data, apply the TrainJob, see rank 0 publish a checkpoint, and wait for it to complete."""
        spec = self.spec(nodes, epochs)
        run = plan_run(self.settings, self.namespace, name, spec.to_json(), f"{self.namespace}/{name}", "h",
                       leave_model=True)
        publish_data(self.tmp, self.tmp / "data.parquet", self.info.to_json(), "{}", run.data)
        trainjob = run.trainjob.split("/", 1)[1]
        applied = time.monotonic()
        self.kube.apply(build_run_trainjob(run, spec, self.settings, None, {}, []))
        published = wait_for(lambda: self._checkpoint_epoch(name), timeout=600, interval=0.5,
                             what=f"rank 0's first checkpoint of {name}", seen=lambda: self._phases(trainjob))
        first = time.monotonic() - applied
        wait_for(lambda: self._finished(trainjob), timeout=900, interval=1, what=f"TrainJob {trainjob} Complete",
                 seen=lambda: self._phases(trainjob))
        total = time.monotonic() - applied
        local = self.tmp / name
        local.mkdir(exist_ok=True)
        for key in ("result.json", "state.pt"):
            self.s3.download_file(TRAINING_BUCKET, f"{self.namespace}/{name}/model/{key}", str(local / key))
        return Run([p for p in self.pods(trainjob) if p["status"]["phase"] == "Succeeded"],
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


class TrainerCluster:
    """The trainer pipeline backend on a platform's real node: Trainer with
    kubeloop's runtime on the training image, a namespace whose fraud store is
    published as Pods open it (feature_store.yaml in the ConfigMap
    feast-client; registry, feature and label sources in the object store),
    the object store's Secret, and the operator on the host with the trainer
    backend (and the local one: the bench runs the same TrainingJob on both).
    This process must reach the object store as the platform's client
    (AWS_* in its environment)."""

    def __init__(self, platform, kube, namespace: str, tmp: Path):  # noqa: ANN001 - a Platform, a Kube
        import sys

        from kubeloop.dev import trainer
        from kubeloop.dev.images import PYTHON_IMAGES, python_image
        from kubeloop.featurestore.generate import Scenario, default_start
        from kubeloop.featurestore.store import create_repository
        from kubeloop.featurestore.publish import publish_sources

        self.kube, self.namespace, self.env = kube, namespace, platform.env()
        image = python_image(PYTHON_IMAGES["training"], [sys.executable, "-m", "pip"])
        platform.import_image(image)
        trainer.install(platform, image.ref)
        repo = create_repository(tmp / "repo", Scenario(start=default_start(30), days=30, cards=1200),
                                 registry=f"s3://feast/{namespace}/registry.db")
        publish_sources(repo, f"s3://feast/{namespace}/data", self.env["AWS_ENDPOINT_URL_S3"])
        kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "feast-client", "namespace": namespace},
                     "data": {"feature_store.yaml": (repo / "feature_store.yaml").read_text()}})
        kube.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "object-store", "namespace": namespace},
                     "stringData": {k: self.env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}})
        self.operator = OperatorProcess(platform.kubeconfig, tmp, {
            "KUBELOOP_REGISTRY": "mlflow", "MLFLOW_TRACKING_URI": self.env["MLFLOW_TRACKING_URI"],
            "KUBELOOP_PIPELINE_BACKENDS": "trainer,local", "KUBELOOP_PIPELINE_BACKEND": "trainer",
            "KUBELOOP_TRAINING_IMAGE": image.ref, "KUBELOOP_OBJECT_STORE_SECRET": "object-store",
            "KUBELOOP_OBJECT_STORE_ENDPOINT": self.env["AWS_ENDPOINT_URL_S3"],
            "KUBELOOP_SERVING_BACKENDS": "kubernetes", "KUBELOOP_RESYNC_SECONDS": "2",
            "KUBELOOP_WORK_DIR": str(tmp / "work"),
            **{k: v for k, v in self.env.items() if k.startswith(("AWS_", "FEAST_"))}}, [namespace]).start()

    def trainingjob(self, name: str, epochs: int, batch: int = 512, backend: str = "trainer") -> dict:
        """The fraud example's TrainingJob on two nodes, its store the published one."""
        return {"apiVersion": API_VERSION, "kind": "TrainingJob", "metadata": {"name": name, "namespace": self.namespace},
                "spec": {"modelName": f"{self.namespace}-{name}", "backend": backend,
                         "features": {"featureViews": ["card_activity", "merchant_risk", "card_profile",
                                                       "transaction_context"],
                                      "labels": {"source": "transactions", "column": "is_fraud"},
                                      "store": {"configMap": {"name": "feast-client"}}},
                         "distributed": {"nodes": 2}, "resources": {"cpu": "500m", "memory": "1536Mi"},
                         "hyperparameters": {"epochs": epochs, "batchSize": batch, "learningRate": 0.003},
                         "evaluation": {"threshold": 0.2}}}

    def status(self, name: str) -> dict:
        return (self.kube.get(API_VERSION, "TrainingJob", name, self.namespace) or {}).get("status") or {}

    def trainjobs(self) -> list[dict]:
        return self.kube.list(TRAINER_API_VERSION, "TrainJob", self.namespace)

    def pods(self, trainjob: str) -> list[dict]:
        return self.kube.list("v1", "Pod", self.namespace, f"jobset.sigs.k8s.io/jobset-name={trainjob}")

    def finished(self, name: str, timeout: float = 1200) -> dict:
        return wait_for(lambda: self.status(name).get("phase") in ("Succeeded", "Failed") and self.status(name),
                        timeout=timeout, interval=1, what=f"TrainingJob {name} finished",
                        seen=lambda: f"{self.status(name).get('conditions')} "
                                     f"{[t['metadata']['name'] for t in self.trainjobs()]}")

    def versions(self, name: str) -> list:
        from mlflow import MlflowClient

        return MlflowClient(self.env["MLFLOW_TRACKING_URI"]).search_model_versions(
            f"name = '{self.namespace}-{name}'")

    def close(self) -> None:
        try:
            for obj in self.kube.list(API_VERSION, "TrainingJob", self.namespace):
                self.kube.delete(API_VERSION, "TrainingJob", obj["metadata"]["name"], self.namespace)
        finally:
            self.operator.stop()
