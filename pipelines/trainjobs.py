"""The trainer backend's TrainJob of a run request (pure): the TrainJob
kubeloop.components.trainjob builds, in the TrainingJob's namespace and
owned by it, so deleting the TrainingJob removes it."""

from __future__ import annotations

from kubeloop.api.training import TrainingJobSpec
from kubeloop.components.trainjob import TrainerSettings, build_run_trainjob, plan_run
from kubeloop.pipelines.backends.base import RunRequest

OWNER_KINDS = {"trainingjob": "TrainingJob", "optimizedmodel": "OptimizedModel"}


def owner_references(labels: dict[str, str]) -> list[dict]:
    """The run's owner, from the labels the operator gives each run request."""
    kind = OWNER_KINDS.get(labels.get("kubeloop.dev/owner-kind", ""))
    if not kind or not labels.get("kubeloop.dev/owner-uid"):
        return []
    return [{"apiVersion": "kubeloop.dev/v1alpha1", "kind": kind, "name": labels["kubeloop.dev/owner-name"],
             "uid": labels["kubeloop.dev/owner-uid"], "controller": True}]


def build_pipeline_trainjob(request: RunRequest, spec: TrainingJobSpec, settings: TrainerSettings) -> dict:
    """The TrainJob of one training pipeline run, its initializer joining
    from the job's published store."""
    arguments = request.arguments
    run = plan_run(settings, arguments["owner"].split("/", 1)[0], request.name, arguments["spec"],
                   arguments["owner"], arguments["spec_hash"])
    store = spec.features.store.config_map if spec.features.store else None
    return build_run_trainjob(run, spec, settings, store, request.labels, owner_references(request.labels))
