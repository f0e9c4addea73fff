"""What the pipeline steps get from the operator's configuration on a
cluster: the image they run in, the job's feature store ConfigMap mounted
into the steps that read Feast, and MLflow's and the object store's
credentials as Secret references.

Set with kfp's and kfp-kubernetes' own task settings, so the compiled IR the
kfp backend submits carries them. kfp's local runner (the local backend)
runs each step as a process of the operator's machine and reads none of the
Kubernetes settings; there the default environment adds nothing to them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kfp import dsl, kubernetes

from kubeloop.api.jobs import MLFLOW_KEYS
from kubeloop.api.training import ConfigMapKey
from kubeloop.version import COMPONENTS_IMAGE

# Where the data steps find the job's feature store ConfigMap, mounted whole
# (not a subPath) so an updated ConfigMap reaches a step that starts later.
FEATURE_STORE_MOUNT = "/etc/kubeloop/feature-store"
# The keys (and the variables) of each Secret. MLflow takes a username and
# password or a token, so its keys are optional one by one.
OBJECT_STORE_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


@dataclass(frozen=True)
class StepEnvironment:
    """The image and credentials of every step; Secrets by name only, so no
    credential is ever part of the IR or of a run's parameters."""

    image: str = COMPONENTS_IMAGE
    mlflow_secret: str | None = None
    """A Secret with MLFLOW_TRACKING_USERNAME and _PASSWORD, or MLFLOW_TRACKING_TOKEN."""
    object_store_secret: str | None = None
    """A Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for MLflow's artifact store."""
    object_store_endpoint: str | None = None
    """The S3 endpoint of MLflow's artifact store (MinIO, Ceph), when it is not AWS."""
    tensorrt: bool = False
    """Whether the image has TensorRT for the optimiser."""
    training_bucket: str = "training"
    """Where a multi-node step's TrainJob keeps its run's data, checkpoints and model."""

    def trainer_settings(self) -> str:
        """What a multi-node step's TrainJob runs with (TrainerSettings' fields
        but MLflow's address and the git sha, which are run parameters), as JSON."""
        return json.dumps({"image": self.image, "bucket": self.training_bucket,
                           "object_store_secret": self.object_store_secret,
                           "object_store_endpoint": self.object_store_endpoint,
                           "mlflow_secret": self.mlflow_secret}, sort_keys=True)

    def apply(self, task: dsl.PipelineTask, credentials: bool) -> dsl.PipelineTask:
        """Run the task in the image; give it the credentials when it talks to
        MLflow or its artifact store."""
        task.set_container_image(self.image)
        if credentials:
            self._give_credentials(task)
        return task

    def _give_credentials(self, task: dsl.PipelineTask) -> None:
        if self.mlflow_secret:
            kubernetes.use_secret_as_env(task, self.mlflow_secret, {k: k for k in MLFLOW_KEYS}, optional=True)
        if self.object_store_secret:
            kubernetes.use_secret_as_env(task, self.object_store_secret, {k: k for k in OBJECT_STORE_KEYS})
        if self.object_store_endpoint:
            task.set_env_variable("MLFLOW_S3_ENDPOINT_URL", self.object_store_endpoint)


# What the committed IR and the local backend run with: the default image, no credentials.
DEFAULT_STEPS = StepEnvironment()


def feature_store_file(config_map: ConfigMapKey | None) -> str:
    """Where a data step finds the feature_store.yaml mounted from the
    ConfigMap; empty when the job names none (the step then reads the store
    from its parameters)."""
    return f"{FEATURE_STORE_MOUNT}/{config_map.key}" if config_map else ""


def mount_feature_store(task: dsl.PipelineTask, config_map: ConfigMapKey | None) -> dsl.PipelineTask:
    """Mount the job's feature store ConfigMap at FEATURE_STORE_MOUNT."""
    if config_map:
        kubernetes.use_config_map_as_volume(task, config_map.name, FEATURE_STORE_MOUNT)
    return task
