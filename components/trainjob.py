"""Multi-node training on a real cluster: a Kubeflow Trainer TrainJob (pure).

Each node Pod runs torchrun, which reads the sizes Trainer's torch runtime
sets (PET_NNODES, PET_NPROC_PER_NODE) and meets the other nodes at the
first node's address (PET_MASTER_ADDR, PET_MASTER_PORT); it starts numProcPerNode processes of
kubeloop's training entry point (kubeloop.components.distributed) on the
pipeline's dataset. GPU placement reaches the node Pods through a runtime
patch owned by kubeloop; object storage through the environment, its
credentials by reference to a Secret.
"""

from __future__ import annotations

from kubeloop.api.jobs import object_store_env
from kubeloop.api.training import TrainingJobSpec

TRAINER_API_VERSION = "trainer.kubeflow.org/v1alpha1"
TORCH_RUNTIME = "torch-distributed"
PATCH_MANAGER = "kubeloop.dev/operator"
MAX_RESTARTS = 3
# Elastic rendezvous at the address Trainer gives the first node (expanded by
# the kubelet) rather than a static one: a replacement node Pod can only join a
# run through a rendezvous whose agents restart their ranks for a waiting node
# (resuming from the last published checkpoint). That a deleted node Pod's
# replacement is taken in reliably is not yet shown on the real node.
ENTRY_POINT = ["torchrun", "--rdzv-backend=c10d", "--rdzv-endpoint=$(PET_MASTER_ADDR):$(PET_MASTER_PORT)",
               f"--max-restarts={MAX_RESTARTS}", "--module", "kubeloop.components.distributed"]
# A node is known to the rendezvous by its address, pid and a counter: a
# replacement Pod has the same hostname, and torchrun is its pid 1 again, so
# without its own Pod IP it would pass for the node it replaces.
LOCAL_ADDR = {"name": "PET_LOCAL_ADDR", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def build_trainjob(name: str, namespace: str, spec: TrainingJobSpec, image: str, dataset_uri: str,
                   dataset_info: str, output_uri: str, labels: dict[str, str] | None = None,
                   store_secret: str | None = None, store_endpoint: str | None = None,
                   checkpoints: str | None = None) -> dict:
    """checkpoints: the folder rank 0 publishes a checkpoint to every epoch,
    so node Pods started again resume from it."""
    args = ["--dataset", dataset_uri, "--dataset-info", dataset_info, "--output", output_uri,
            "--spec", spec.to_json(), *(["--checkpoints", checkpoints] if checkpoints else [])]
    trainjob = {
        "apiVersion": TRAINER_API_VERSION,
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": {
            "runtimeRef": {"name": TORCH_RUNTIME},
            "trainer": trainer_nodes(spec, image, args, [LOCAL_ADDR, *object_store_env(store_secret, store_endpoint)]),
        },
    }
    patches = gpu_patches(spec)
    if patches:
        trainjob["spec"]["runtimePatches"] = patches
    return trainjob


def trainer_nodes(spec: TrainingJobSpec, image: str, args: list[str], env: list[dict]) -> dict:
    """A TrainJob's trainer: spec's nodes and processes, each node with
    spec's resources, running kubeloop's entry point under torchrun."""
    resources = {"cpu": str(spec.resources.cpu), "memory": str(spec.resources.memory)}
    gpu = spec.resources.gpu
    limits = dict(resources)
    if gpu and gpu.count:
        limits["nvidia.com/gpu"] = str(gpu.count)
    return {"image": image, "command": list(ENTRY_POINT), "args": args, "env": env,
            "numNodes": spec.distributed.nodes, "numProcPerNode": spec.distributed.processes_per_node,
            "resourcesPerNode": {"requests": resources, "limits": limits}}


def gpu_patches(spec: TrainingJobSpec) -> list[dict]:
    """The node Pods' GPU placement, as a runtime patch kubeloop owns: the
    GPU toleration and the product's node selector (none without GPUs)."""
    gpu = spec.resources.gpu
    if not gpu or not gpu.count:
        return []
    pod_patch: dict = {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
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
