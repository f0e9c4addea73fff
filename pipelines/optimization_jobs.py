"""The trainer backend's optimisation Job (pure): an OptimizedModel's run as
one batch Job in its namespace, owned by it, whose Pod runs the optimisation
pipeline (kubeloop.components.optimizer_pod) on the training image.

The variants are measured on the Pod's node: a GPU target's Pod asks for one
GPU, tolerates the GPU taint and goes to the target's product. A failed Pod's
last log lines become its termination message (the backend reports them). A
Pod is tried again once: a second failure is the source or the spec, which
another attempt would not change.
"""

from __future__ import annotations

from kubeloop.api.children import dns_name
from kubeloop.api.optimization import OptimizedModelSpec
from kubeloop.components.trainer_run import OPTIMIZATION_ENV, OptimizationRun
from kubeloop.components.trainjob import (GPU_TOLERATION, RUN_ANNOTATION, TrainerSettings, access_env,
                                          restricted_pod)
from kubeloop.pipelines.backends.base import RunRequest
from kubeloop.pipelines.trainjobs import owner_references

PREFIX = "optimize"
ENTRY_POINT = ["python", "-m", "kubeloop.components.optimizer_pod"]
SCRATCH = {"name": "scratch", "mountPath": "/workspace"}
RESOURCES = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "6Gi"}}
"""One CPU: the optimiser measures every runtime on one thread."""
BACKOFF_LIMIT = 1


def optimization_job_name(run_name: str) -> str:
    return dns_name(PREFIX, run_name)


def is_optimization_job(name: str) -> bool:
    return name.startswith(f"{PREFIX}-")


def build_optimization_job(request: RunRequest, settings: TrainerSettings) -> dict:
    """The Job of one optimisation pipeline run, in the OptimizedModel's namespace."""
    arguments = request.arguments
    namespace = arguments["owner"].split("/", 1)[0]
    target = OptimizedModelSpec.from_json(arguments["spec"]).target
    run = OptimizationRun(spec=arguments["spec"], source_version=arguments["source_version"],
                          pipeline_run=request.name, owner=arguments["owner"], git_sha=settings.git_sha,
                          tracking_uri=settings.tracking_uri)
    resources = {kind: dict(values) for kind, values in RESOURCES.items()}
    pod: dict = {"restartPolicy": "Never", "volumes": [{"name": SCRATCH["name"], "emptyDir": {}}], "containers": [{
        "name": "optimizer", "command": list(ENTRY_POINT), "resources": resources,
        "env": [{"name": OPTIMIZATION_ENV, "value": run.to_json()},
                *({"name": name, "value": SCRATCH["mountPath"]} for name in ("TMPDIR", "HOME")),
                *access_env(settings)],
        "volumeMounts": [SCRATCH], "terminationMessagePolicy": "FallbackToLogsOnError"}]}
    if target.device == "gpu":
        resources["limits"]["nvidia.com/gpu"] = "1"
        pod["tolerations"] = [dict(GPU_TOLERATION)]
        if target.gpu_product:
            pod["nodeSelector"] = {"nvidia.com/gpu.product": target.gpu_product}
    metadata = {"name": optimization_job_name(request.name), "namespace": namespace, "labels": dict(request.labels),
                "annotations": {RUN_ANNOTATION: request.name}}
    references = owner_references(request.labels)
    if references:
        metadata["ownerReferences"] = references
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": {
        "backoffLimit": BACKOFF_LIMIT,
        "template": {"metadata": {"labels": dict(request.labels)}, "spec": restricted_pod(pod, settings.image)}}}
