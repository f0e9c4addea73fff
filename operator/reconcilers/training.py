"""TrainingJob: find or start the training pipeline run for the spec, and
report the run, its metrics and the model it registered."""

from __future__ import annotations

import json

from kubeloop.api.conditions import TRAINING_JOB_CONDITIONS, ConditionType, Reason
from kubeloop.api.refs import ObjectRef
from kubeloop.api.training import TrainingJobSpec, TrainingJobStatus
from kubeloop.operator.builders.pipelines import build_training_run, spec_hash
from kubeloop.operator.conditions import Observation, now
from kubeloop.operator.ports import Ports
from kubeloop.operator.reconcilers.common import Event, Outcome, backoff, finish, follow_run
from kubeloop.operator.reconcilers.promotion import record_run

KIND = "TrainingJob"


def required_conditions(backend: str) -> list[str]:
    # The no-op backend registers nothing, so there is no model to wait for.
    return [c for c in TRAINING_JOB_CONDITIONS.required
            if not (backend == "noop" and c == ConditionType.MODEL_REGISTERED)]


def resolve_store(ref: ObjectRef, spec: TrainingJobSpec, ports: Ports) -> tuple[str, Observation]:
    """The job's feature store as the pipeline reads it (StoreLocation JSON;
    empty for the operator's default), and the FeatureStoreResolved condition."""
    named = spec.features.store
    if named is None:
        where = ports.features.default_repo or "none configured"
        return "", Observation(ConditionType.FEATURE_STORE_RESOLVED, "True", Reason.DEFAULT_STORE,
                               f"the operator's default store ({where})")
    cm = named.config_map
    live = ports.objects.get("v1", "ConfigMap", cm.name, ref.namespace) if ports.objects else None
    text = ((live or {}).get("data") or {}).get(cm.key)
    if not text:
        what = "has no key" if live else "does not exist in namespace"
        detail = f"'{cm.key}'" if live else ref.namespace
        return "", Observation(ConditionType.FEATURE_STORE_RESOLVED, "False", Reason.FEATURE_STORE_NOT_FOUND,
                               f"spec.features.store.configMap: ConfigMap {cm.name} {what} {detail}; create it "
                               "(a Feast FeatureStore's client ConfigMap) or fix the name and key")
    return json.dumps({"config": text}, sort_keys=True), Observation(
        ConditionType.FEATURE_STORE_RESOLVED, "True", Reason.CONFIG_MAP,
        f"feature_store.yaml from ConfigMap {cm.name}/{cm.key}")


def reconcile_training_job(ref: ObjectRef, spec: TrainingJobSpec, status: TrainingJobStatus,
                           ports: Ports, attempt: int = 0) -> Outcome[TrainingJobStatus]:
    backend_name = spec.backend or ports.default_pipeline_backend
    backend = ports.pipelines.get(backend_name)
    required = required_conditions(backend_name)
    if backend is None:
        obs = [Observation(ConditionType.RUN_SUBMITTED, "False", Reason.BACKEND_NOT_CONFIGURED,
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
    if not same_run:
        fields.update(metrics={}, model=None)
    if run.phase == "Succeeded":
        fields["metrics"] = {k: float(v) for k, v in run.outputs.get("metrics", {}).items()}
    events = []
    if progress.superseded:
        events.append(Event("Normal", "Superseded", f"cancelled run {progress.superseded} of the previous spec"))
    return record_run(ref, status, run, ports.registry, attempt, required=required,
                      observations=[resolved, *progress.observations], fields=fields,
                      registers=backend_name != "noop", policy=spec.promotion, metric=spec.tuning_metric,
                      events=events)
