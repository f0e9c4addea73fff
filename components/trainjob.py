"""Training on a real cluster through Kubeflow Trainer (pure): kubeloop's
ClusterTrainingRuntime and the TrainJob of one training pipeline run, as the
trainer backend and the kfp backend's multi-node step both create it.

The runtime is Trainer's torch runtime with a dataset initializer in front
of the nodes (JobSet's dependsOn). The initializer prepares the run's data
(kubeloop.components.initializer): it joins the features, or keeps data a
pipeline prepared before. Each node Pod runs torchrun, which reads the sizes
Trainer sets (PET_NNODES, PET_NPROC_PER_NODE) and meets the other nodes at
the first node's address; its processes run kubeloop.components.distributed.
Rank 0 publishes a checkpoint every epoch, then either evaluates and
registers (the trainer backend) or leaves the model for the pipeline's own
evaluate and register steps (kfp).

A node Pod that fails or is deleted fails its Job at once, and JobSet then
starts every Job again (up to RESTARTS times): the initializer finds the
run's data already prepared, and every node resumes from the checkpoint
rank 0 published last, so a lost node costs at most the epoch it was in.
An initializer whose data is wrong (it exits DATA_WRONG_EXIT: a finding in
fail mode, no store) fails the run at once. Any other failure (a crash, a
killed process, an object store that did not answer) is tried again in a
new Pod, and an evicted or preempted Pod does not count: left to restart in
place (Trainer's default), the Job controller failed the Job at its first
restart, and one lost initializer process failed the whole run.

The TrainJob names the run through its environment, the job's feature store
by reference to its ConfigMap, and credentials by reference to their
Secrets. GPU placement reaches the node Pods through a runtime patch owned
by kubeloop.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubeloop.api.children import dns_name
from kubeloop.api.jobs import MLFLOW_KEYS, object_store_env
from kubeloop.api.training import ConfigMapKey, TrainingJobSpec
from kubeloop.components.trainer_run import DATA_WRONG_EXIT, RUN_ENV, STORE_ENV, TrainerRun

TRAINER_API_VERSION = "trainer.kubeflow.org/v1alpha1"
TRAINING_RUNTIME = "kubeloop-training"
PATCH_MANAGER = "kubeloop.dev/operator"
ENTRY_POINT = ["torchrun", "--rdzv-backend=c10d", "--rdzv-endpoint=$(PET_MASTER_ADDR):$(PET_MASTER_PORT)",
               "--module", "kubeloop.components.distributed", "--trainer-run"]
# A node is known to the rendezvous by its address, pid and a counter: a Pod
# started again has the same hostname, and torchrun is its pid 1 again, so
# without its own Pod IP it would pass for the node it replaces.
LOCAL_ADDR = {"name": "PET_LOCAL_ADDR", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
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
RESTRICTED_POD = {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                  "seccompProfile": {"type": "RuntimeDefault"}}
RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
INITIALIZER_RESOURCES = {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "4Gi"}}
INITIALIZER_RETRIES = 3
INITIALIZER_FAILURES = {"rules": [
    {"action": "FailJob", "onExitCodes": {"containerName": INITIALIZER, "operator": "In", "values": [DATA_WRONG_EXIT]}},
    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}
RESTARTS = 3
FAILURE_POLICY = {"maxRestarts": RESTARTS, "rules": [
    {"name": "dataNotPrepared", "action": "FailJobSet", "targetReplicatedJobs": [INITIALIZER]}]}


@dataclass(frozen=True)
class TrainerSettings:
    """What every TrainJob (and optimisation Job) gets: the operator's configuration."""

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


def _replicated_job(name: str, ancestor: str, container: dict, image: str, pod: dict | None = None,
                    **job: object) -> dict:
    pod = restricted_pod({"containers": [container], **(pod or {})}, image)
    return {"name": name, "template": {"metadata": {"labels": {ANCESTOR: ancestor}},
                                       "spec": {**job, "template": {"spec": pod}}}}


# A failed Pod's last log lines become its termination message, which the
# run's failure repeats (a traceback's last line says why).
LAST_WORDS = {"terminationMessagePolicy": "FallbackToLogsOnError"}


def build_training_runtime(image: str) -> dict:
    """kubeloop's ClusterTrainingRuntime: the dataset initializer, then the torch nodes."""
    initializer = _replicated_job(INITIALIZER, INITIALIZER, {
        "name": INITIALIZER, "command": list(INITIALIZER_ENTRY), "resources": INITIALIZER_RESOURCES,
        "env": [{"name": "TMPDIR", "value": SCRATCH["mountPath"]}], "volumeMounts": [SCRATCH], **LAST_WORDS}, image,
        pod={"volumes": [{"name": SCRATCH["name"], "emptyDir": {}}], "restartPolicy": "Never"},
        backoffLimit=INITIALIZER_RETRIES, podFailurePolicy=INITIALIZER_FAILURES)
    node = _replicated_job("node", "trainer", {"name": "node", "command": list(ENTRY_POINT), **LAST_WORDS}, image,
                           backoffLimit=0)
    node["dependsOn"] = [{"name": INITIALIZER, "status": "Complete"}]
    return {"apiVersion": TRAINER_API_VERSION, "kind": "ClusterTrainingRuntime",
            "metadata": {"name": TRAINING_RUNTIME, "labels": {"trainer.kubeflow.org/framework": "torch"}},
            "spec": {"mlPolicy": {"numNodes": 1, "torch": {}},
                     "template": {"spec": {"failurePolicy": FAILURE_POLICY, "replicatedJobs": [initializer, node]}}}}


def trainjob_name(run_name: str) -> str:
    """A name JobSet admits (a letter first, short enough), one per run."""
    return dns_name("train", run_name, limit=NAME_LIMIT)


def plan_run(settings: TrainerSettings, namespace: str, pipeline_run: str, spec: str, owner: str, spec_hash: str,
             leave_model: bool = False) -> TrainerRun:
    """The run as its Pods read it, everything below s3://<bucket>/<namespace>/<run>.
    leave_model: rank 0 leaves the model below <prefix>/model for the
    pipeline's own steps instead of evaluating and registering."""
    prefix = f"s3://{settings.bucket}/{namespace}/{pipeline_run}"
    return TrainerRun(spec=spec, pipeline_run=pipeline_run, owner=owner, spec_hash=spec_hash, git_sha=settings.git_sha,
                      tracking_uri=settings.tracking_uri, prefix=prefix,
                      trainjob=f"{namespace}/{trainjob_name(pipeline_run)}",
                      output=f"{prefix}/model" if leave_model else "")


def access_env(settings: TrainerSettings) -> list[dict]:
    """Object storage, MLflow and its artifact store, every credential by reference."""
    env = [*object_store_env(settings.object_store_secret, settings.object_store_endpoint)]
    if settings.object_store_endpoint:
        env += [{"name": name, "value": settings.object_store_endpoint}
                for name in ("FEAST_S3_ENDPOINT_URL", "MLFLOW_S3_ENDPOINT_URL")]
    if settings.mlflow_secret:
        env += [{"name": key, "valueFrom": {"secretKeyRef": {"name": settings.mlflow_secret, "key": key,
                                                             "optional": True}}} for key in MLFLOW_KEYS]
    return env


def build_run_trainjob(run: TrainerRun, spec: TrainingJobSpec, settings: TrainerSettings, store: ConfigMapKey | None,
                       labels: dict[str, str], owners: list[dict]) -> dict:
    """The TrainJob of one training pipeline run. store: the ConfigMap of
    the feature_store.yaml the initializer joins from (None: the pipeline
    prepared the data below the run's prefix before)."""
    namespace, name = run.trainjob.split("/", 1)
    common = [{"name": RUN_ENV, "value": run.to_json()}, *access_env(settings)]
    initializer_env = [*common, *([{"name": STORE_ENV, "valueFrom": {"configMapKeyRef": {
        "name": store.name, "key": store.key}}}] if store else [])]
    metadata = {"name": name, "namespace": namespace, "labels": dict(labels),
                "annotations": {RUN_ANNOTATION: run.pipeline_run}}
    if owners:
        metadata["ownerReferences"] = owners
    trainjob = {"apiVersion": TRAINER_API_VERSION, "kind": "TrainJob", "metadata": metadata, "spec": {
        "runtimeRef": {"name": TRAINING_RUNTIME},
        "initializer": {"dataset": {"storageUri": run.data, "env": initializer_env}},
        "trainer": trainer_nodes(spec, settings.image, [LOCAL_ADDR, *common]),
    }}
    patches = gpu_patches(spec)
    if patches:
        trainjob["spec"]["runtimePatches"] = patches
    return trainjob


def trainer_nodes(spec: TrainingJobSpec, image: str, env: list[dict]) -> dict:
    """A TrainJob's trainer: spec's nodes and processes, each node with
    spec's resources, running kubeloop's entry point under torchrun."""
    resources = {"cpu": str(spec.resources.cpu), "memory": str(spec.resources.memory)}
    gpu = spec.resources.gpu
    limits = dict(resources)
    if gpu and gpu.count:
        limits["nvidia.com/gpu"] = str(gpu.count)
    return {"image": image, "command": list(ENTRY_POINT), "env": env,
            "numNodes": spec.distributed.nodes, "numProcPerNode": spec.distributed.processes_per_node,
            "resourcesPerNode": {"requests": resources, "limits": limits}}


def gpu_patches(spec: TrainingJobSpec) -> list[dict]:
    """The node Pods' GPU placement, as a runtime patch kubeloop owns: the
    GPU toleration and the product's node selector (none without GPUs)."""
    gpu = spec.resources.gpu
    if not gpu or not gpu.count:
        return []
    pod_patch: dict = {"tolerations": [dict(GPU_TOLERATION)]}
    if gpu.product:
        pod_patch["nodeSelector"] = {"nvidia.com/gpu.product": gpu.product}
    return [{"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": {"spec": pod_patch}}}}]}}}}]


def trainjob_finished(trainjob: dict) -> tuple[bool, str | None]:
    """(finished, error): Complete or Failed conditions, as the Trainer sets them."""
    conditions = {c["type"]: c for c in trainjob.get("status", {}).get("conditions", [])}
    if conditions.get("Failed", {}).get("status") == "True":
        return True, conditions["Failed"].get("message") or "the TrainJob failed"
    if conditions.get("Complete", {}).get("status") == "True":
        return True, None
    return False, None
