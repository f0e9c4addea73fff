"""TrainingJob: find or start the training pipeline run for the spec, and
report the run, its metrics and the model it registered."""

from __future__ import annotations

import json

from kubeloop.api.base import RegisteredModel
from kubeloop.api.refs import ObjectRef
from kubeloop.api.training import TrainingJobSpec, TrainingJobStatus
from kubeloop.operator.builders.pipelines import build_training_run, spec_hash
from kubeloop.operator.conditions import Observation, now
from kubeloop.operator.ports import Ports
from kubeloop.operator.reconcilers.common import Event, Outcome, backoff, finish, follow_run
from kubeloop.operator.reconcilers.promotion import REGISTRY_UNAVAILABLE, promote_when_gated

KIND = "TrainingJob"


def required_conditions(backend: str) -> list[str]:
    # The no-op backend registers nothing, so there is no model to wait for.
    return ["FeatureStoreResolved", "RunSubmitted", "RunSucceeded"] + ([] if backend == "noop" else ["ModelRegistered"])


def resolve_store(ref: ObjectRef, spec: TrainingJobSpec, ports: Ports) -> tuple[str, Observation]:
    """The job's feature store as the pipeline reads it (StoreLocation JSON;
    empty for the operator's default), and the FeatureStoreResolved condition."""
    named = spec.features.store
    if named is None:
        where = ports.features.default_repo or "none configured"
        return "", Observation("FeatureStoreResolved", "True", "DefaultStore", f"the operator's default store ({where})")
    cm = named.config_map
    live = ports.objects.get("v1", "ConfigMap", cm.name, ref.namespace) if ports.objects else None
    text = ((live or {}).get("data") or {}).get(cm.key)
    if not text:
        what = "has no key" if live else "does not exist in namespace"
        detail = f"'{cm.key}'" if live else ref.namespace
        return "", Observation("FeatureStoreResolved", "False", "FeatureStoreNotFound",
                               f"spec.features.store.configMap: ConfigMap {cm.name} {what} {detail}; create it "
                               "(a Feast FeatureStore's client ConfigMap) or fix the name and key")
    return json.dumps({"config": text}, sort_keys=True), Observation(
        "FeatureStoreResolved", "True", "ConfigMap", f"feature_store.yaml from ConfigMap {cm.name}/{cm.key}")


def reconcile_training_job(ref: ObjectRef, spec: TrainingJobSpec, status: TrainingJobStatus,
                           ports: Ports, attempt: int = 0) -> Outcome[TrainingJobStatus]:
    backend_name = spec.backend or ports.default_pipeline_backend
    backend = ports.pipelines.get(backend_name)
    required = required_conditions(backend_name)
    if backend is None:
        obs = [Observation("RunSubmitted", "False", "BackendNotConfigured",
                           f"the operator has no '{backend_name}' pipeline backend; configure it "
                           f"(see `kubeloop operator --help`) or set spec.backend to one of "
                           f"{', '.join(sorted(ports.pipelines)) or 'none'}")]
        new = finish(status, obs, ref.generation, required, phase="Failed", backend=backend_name)
        return Outcome(new)

    digest = spec_hash(spec)
    store, resolved = resolve_store(ref, spec, ports)
    if resolved.status != "True":
        # Pending, not Failed: the ConfigMap may be created after the job.
        new = finish(status, [resolved], ref.generation, required, phase="Pending")
        return Outcome(new, retry_after=backoff(attempt), retry_reason=resolved.message)
    progress = follow_run(backend, status.run_id, status.spec_hash, digest,
                          lambda: build_training_run(ref, spec, digest, store))
    if progress.unavailable:
        new = finish(status, progress.observations, ref.generation, required)
        return Outcome(new, retry_after=backoff(attempt), retry_reason=progress.unavailable)

    run = progress.run
    same_run = run.run_id == status.run_id
    fields: dict = {
        "backend": backend_name, "run_id": run.run_id, "run_url": run.url, "spec_hash": digest,
        "started_at": status.started_at if same_run and status.started_at else now(),
        "completed_at": (status.completed_at if same_run and status.completed_at else now())
        if run.finished else None,
    }
    observations = [resolved, *progress.observations]
    if not same_run:
        fields.update(metrics={}, model=None)
    if run.phase == "Succeeded":
        fields["metrics"] = {k: float(v) for k, v in run.outputs.get("metrics", {}).items()}
        model = run.outputs.get("model")
        if model:
            fields["model"] = RegisteredModel(name=model["name"], version=str(model["version"]),
                                              uri=model.get("uri"), run_url=model.get("run_url"))
            observations.append(Observation("ModelRegistered", "True", "Registered",
                                            f"{model['name']} version {model['version']}"))
        elif backend_name != "noop":
            observations.append(Observation("ModelRegistered", "False", "NoModel",
                                            "the run succeeded but reported no registered model"))
    elif backend_name != "noop":
        observations.append(Observation("ModelRegistered", "Unknown", "AwaitingRun", ""))

    phase = {"Succeeded": "Succeeded", "Failed": "Failed"}.get(run.phase, "Running")
    if phase == "Succeeded" and backend_name != "noop" and not run.outputs.get("model"):
        phase = "Failed"
    model = fields.get("model")
    if phase == "Succeeded" and model and spec.promotion and spec.promotion.promote_to:
        promoted = promote_when_gated(ports.registry, model.name, model.version, spec.promotion,
                                      by=str(ref), metric=spec.tuning_metric)
        observations.append(promoted)
        if promoted.reason == REGISTRY_UNAVAILABLE:
            new = finish(status, observations, ref.generation, required, phase=phase, **fields)
            return Outcome(new, retry_after=backoff(attempt), retry_reason=promoted.message)
    new = finish(status, observations, ref.generation, required, phase=phase, **fields)
    events = []
    if progress.superseded:
        events.append(Event("Normal", "Superseded", f"cancelled run {progress.superseded} of the previous spec"))
    return Outcome(new, events)
