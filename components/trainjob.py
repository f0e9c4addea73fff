"""Multi-node training on a real cluster: a Kubeflow Trainer TrainJob (pure).

The Trainer's torch runtime starts torchrun on every node with numProcPerNode
processes; each runs kubeloop's training entry point
(kubeloop.components.distributed) on the pipeline's dataset. GPU placement
reaches the node Pods through a runtime patch owned by kubeloop.
"""

from __future__ import annotations

from kubeloop.api.training import TrainingJobSpec

TRAINER_API_VERSION = "trainer.kubeflow.org/v1alpha1"
TORCH_RUNTIME = "torch-distributed"
PATCH_MANAGER = "kubeloop.dev/operator"


def build_trainjob(name: str, namespace: str, spec: TrainingJobSpec, image: str, dataset_uri: str,
                   dataset_info: str, output_uri: str, labels: dict[str, str] | None = None) -> dict:
    resources = {"cpu": str(spec.resources.cpu), "memory": str(spec.resources.memory)}
    gpu = spec.resources.gpu
    limits = dict(resources)
    if gpu and gpu.count:
        limits["nvidia.com/gpu"] = str(gpu.count)
    trainjob = {
        "apiVersion": TRAINER_API_VERSION,
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": {
            "runtimeRef": {"name": TORCH_RUNTIME},
            "trainer": {
                "image": image,
                "command": ["python", "-m", "kubeloop.components.distributed"],
                "args": ["--dataset", dataset_uri, "--dataset-info", dataset_info, "--output", output_uri,
                         "--spec", spec.to_json()],
                "numNodes": spec.distributed.nodes,
                "numProcPerNode": spec.distributed.processes_per_node,
                "resourcesPerNode": {"requests": resources, "limits": limits},
            },
        },
    }
    if gpu and gpu.count:
        pod_patch: dict = {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
        if gpu.product:
            pod_patch["nodeSelector"] = {"nvidia.com/gpu.product": gpu.product}
        trainjob["spec"]["runtimePatches"] = [{
            "manager": PATCH_MANAGER,
            "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
                {"name": "node", "template": {"spec": {"template": {"spec": pod_patch}}}}]}}},
        }]
    return trainjob


def trainjob_finished(trainjob: dict) -> tuple[bool, str | None]:
    """(finished, error): Complete or Failed conditions, as the Trainer sets them."""
    conditions = {c["type"]: c for c in trainjob.get("status", {}).get("conditions", [])}
    if conditions.get("Failed", {}).get("status") == "True":
        return True, conditions["Failed"].get("message") or "the TrainJob failed"
    if conditions.get("Complete", {}).get("status") == "True":
        return True, None
    return False, None
