"""The trainer backend's Kubeflow Trainer objects (pure): kubeloop's
ClusterTrainingRuntime and the TrainJob of one training pipeline run.

The runtime is Trainer's torch runtime with a dataset initializer in front
of the nodes (JobSet's dependsOn): the initializer runs the pipeline's data
steps, the nodes train under torchrun and rank 0 evaluates and registers
(kubeloop.components.initializer, kubeloop.components.distributed --trainer-run).
A node Pod that fails or is deleted fails its Job at once, and JobSet then
starts every Job again (up to RESTARTS times): the initializer finds the
run's data already prepared, and every node resumes from the checkpoint
rank 0 published last, so a lost node costs at most the epoch it was in.
An initializer that fails twice fails the run (its data is wrong, or the
store unreachable: starting again would not help).
The TrainJob names the run through its environment, the job's feature store
by reference to its ConfigMap, and credentials by reference to their
Secrets; it is owned by the TrainingJob, so deleting that removes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubeloop.api.children import dns_name
from kubeloop.api.jobs import object_store_env
from kubeloop.api.training import TrainingJobSpec
from kubeloop.components.trainer_run import RUN_ENV, STORE_ENV, TrainerRun
from kubeloop.components.trainjob import (ENTRY_POINT, LOCAL_ADDR, TRAINER_API_VERSION, gpu_patches,
                                          trainer_nodes)
from kubeloop.pipelines.backends.base import RunRequest
from kubeloop.pipelines.environment import MLFLOW_KEYS

TRAINING_RUNTIME = "kubeloop-training"
INITIALIZER = "dataset-initializer"
"""Trainer's name for the step (and the container it passes the dataset's settings to)."""
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
INITIALIZER_ENTRY = ["python", "-m", "kubeloop.components.initializer"]
SCRATCH = {"name": "initializer", "mountPath": "/workspace"}
"""Trainer admits a dataset initializer only with a volume of this name: the
initializer's scratch space (the data itself goes to object storage)."""
NAME_LIMIT = 33
"""JobSet admits a TrainJob's Pods only if <name>-dataset-initializer-0-0-<5 characters> is a DNS label."""
RUN_ANNOTATION = "kubeloop.dev/pipeline-run"
OWNER_KINDS = {"trainingjob": "TrainingJob", "optimizedmodel": "OptimizedModel"}
RESTRICTED_POD = {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                  "seccompProfile": {"type": "RuntimeDefault"}}
RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
INITIALIZER_RESOURCES = {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "4Gi"}}
RESTARTS = 3
FAILURE_POLICY = {"maxRestarts": RESTARTS, "rules": [
    {"name": "dataNotPrepared", "action": "FailJobSet", "targetReplicatedJobs": [INITIALIZER]}]}


@dataclass(frozen=True)
class TrainerSettings:
    """What every TrainJob of the backend gets (operator configuration)."""

    image: str
    """The training image: torch, Feast, MLflow and kubeloop."""
    tracking_uri: str
    """MLflow as Pods reach it."""
    bucket: str = "training"
    """The bucket below which each run keeps its data and checkpoints."""
    object_store_secret: str | None = None
    """A Secret in the job's namespace with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY."""
    object_store_endpoint: str | None = None
    mlflow_secret: str | None = None
    git_sha: str = "unknown"


def restricted_pod(pod: dict, image: str) -> dict:
    """pod's containers on image, under the restricted profile, with no ServiceAccount token."""
    pod["securityContext"] = dict(RESTRICTED_POD)
    pod["automountServiceAccountToken"] = False
    for container in pod["containers"]:
        container.update(image=image, imagePullPolicy="IfNotPresent", securityContext=dict(RESTRICTED_CONTAINER))
    return pod


def _replicated_job(name: str, ancestor: str, container: dict, image: str, volumes: list[dict] | None = None,
                    **job: object) -> dict:
    pod = restricted_pod({"containers": [container], **({"volumes": volumes} if volumes else {})}, image)
    return {"name": name, "template": {"metadata": {"labels": {ANCESTOR: ancestor}},
                                       "spec": {**job, "template": {"spec": pod}}}}


def build_training_runtime(image: str) -> dict:
    """kubeloop's ClusterTrainingRuntime: the dataset initializer, then the torch nodes."""
    initializer = _replicated_job(INITIALIZER, INITIALIZER, {
        "name": INITIALIZER, "command": list(INITIALIZER_ENTRY), "resources": INITIALIZER_RESOURCES,
        "env": [{"name": "TMPDIR", "value": SCRATCH["mountPath"]}], "volumeMounts": [SCRATCH]}, image,
        volumes=[{"name": SCRATCH["name"], "emptyDir": {}}], backoffLimit=1)
    node = _replicated_job("node", "trainer", {"name": "node", "command": [*ENTRY_POINT, "--trainer-run"]}, image,
                           backoffLimit=0)
    node["dependsOn"] = [{"name": INITIALIZER, "status": "Complete"}]
    return {"apiVersion": TRAINER_API_VERSION, "kind": "ClusterTrainingRuntime",
            "metadata": {"name": TRAINING_RUNTIME, "labels": {"trainer.kubeflow.org/framework": "torch"}},
            "spec": {"mlPolicy": {"numNodes": 1, "torch": {}},
                     "template": {"spec": {"failurePolicy": FAILURE_POLICY, "replicatedJobs": [initializer, node]}}}}


def trainjob_name(run_name: str) -> str:
    """A name JobSet admits (a letter first, short enough), one per run."""
    return dns_name("train", run_name, limit=NAME_LIMIT)


def trainer_run(request: RunRequest, namespace: str, settings: TrainerSettings) -> TrainerRun:
    name = trainjob_name(request.name)
    arguments = request.arguments
    return TrainerRun(spec=arguments["spec"], pipeline_run=request.name, owner=arguments["owner"],
                      spec_hash=arguments["spec_hash"], git_sha=settings.git_sha,
                      tracking_uri=settings.tracking_uri,
                      prefix=f"s3://{settings.bucket}/{namespace}/{request.name}", trainjob=f"{namespace}/{name}")


def _owner_references(labels: dict[str, str]) -> list[dict]:
    kind = OWNER_KINDS.get(labels.get("kubeloop.dev/owner-kind", ""))
    if not kind or not labels.get("kubeloop.dev/owner-uid"):
        return []
    return [{"apiVersion": "kubeloop.dev/v1alpha1", "kind": kind, "name": labels["kubeloop.dev/owner-name"],
             "uid": labels["kubeloop.dev/owner-uid"], "controller": True}]


def _access(settings: TrainerSettings) -> list[dict]:
    """Object storage, MLflow and its artifact store, every credential by reference."""
    env = [*object_store_env(settings.object_store_secret, settings.object_store_endpoint)]
    if settings.object_store_endpoint:
        env += [{"name": name, "value": settings.object_store_endpoint}
                for name in ("FEAST_S3_ENDPOINT_URL", "MLFLOW_S3_ENDPOINT_URL")]
    if settings.mlflow_secret:
        env += [{"name": key, "valueFrom": {"secretKeyRef": {"name": settings.mlflow_secret, "key": key,
                                                             "optional": True}}} for key in MLFLOW_KEYS]
    return env


def build_pipeline_trainjob(request: RunRequest, spec: TrainingJobSpec, settings: TrainerSettings) -> dict:
    """The TrainJob of one training pipeline run, in the TrainingJob's namespace."""
    namespace = request.arguments["owner"].split("/", 1)[0]
    run = trainer_run(request, namespace, settings)
    common = [{"name": RUN_ENV, "value": run.to_json()}, *_access(settings)]
    store = spec.features.store.config_map if spec.features.store else None
    initializer_env = [*common, *([{"name": STORE_ENV, "valueFrom": {"configMapKeyRef": {
        "name": store.name, "key": store.key}}}] if store else [])]
    metadata = {"name": run.trainjob.split("/", 1)[1], "namespace": namespace, "labels": dict(request.labels),
                "annotations": {RUN_ANNOTATION: request.name}}
    references = _owner_references(request.labels)
    if references:
        metadata["ownerReferences"] = references
    trainjob = {"apiVersion": TRAINER_API_VERSION, "kind": "TrainJob", "metadata": metadata, "spec": {
        "runtimeRef": {"name": TRAINING_RUNTIME},
        "initializer": {"dataset": {"storageUri": run.data, "env": initializer_env}},
        "trainer": trainer_nodes(spec, settings.image, ["--trainer-run"], [LOCAL_ADDR, *common]),
    }}
    patches = gpu_patches(spec)
    if patches:
        trainjob["spec"]["runtimePatches"] = patches
    return trainjob
