"""The trainer backend: each training pipeline run is one Kubeflow Trainer
TrainJob on the cluster (kubeloop.pipelines.trainjobs), so a team's training
runs in Pods on the cluster's nodes, never on the operator's.

The TrainJob's name comes from the run's, so submitting a run again (a
retried reconcile, a restarted operator) finds the TrainJob instead of
creating a second. Its phase comes from Trainer's conditions (Complete,
Failed) and its progress from its JobSet's Jobs; what it registered is read
from the model registry, where rank 0 tagged the version with the run.
Cancelling deletes the TrainJob, and with it its Pods.
"""

from __future__ import annotations

from typing import Callable

from kubeloop.api.training import TrainingJobSpec
from kubeloop.components.trainer_run import NO_STORE
from kubeloop.components.trainjob import TRAINER_API_VERSION, trainjob_finished
from kubeloop.kube import Kube, KubeError
from kubeloop.pipelines.backends.base import BackendUnavailable, PipelineBackend, RunRequest, RunStatus
from kubeloop.pipelines.trainjobs import RUN_ANNOTATION, TrainerSettings, build_pipeline_trainjob

OutcomeReader = Callable[[str], dict]
ONLY_TRAINING = "the trainer backend runs TrainingJobs only; give this OptimizedModel spec.backend: local (or kfp)"


class TrainerBackend(PipelineBackend):
    name = "trainer"

    def __init__(self, kube: Kube, settings: TrainerSettings, outcomes: OutcomeReader):
        self.kube = kube
        self.settings = settings
        self.outcomes = outcomes

    def submit(self, request: RunRequest) -> RunStatus:
        if request.pipeline != "training":
            return RunStatus(run_id=request.name, phase="Failed", error=ONLY_TRAINING)
        spec = TrainingJobSpec.from_json(request.arguments["spec"])
        if spec.features.store is None:
            return RunStatus(run_id=request.name, phase="Failed", error=NO_STORE)
        trainjob = build_pipeline_trainjob(request, spec, self.settings)
        meta = trainjob["metadata"]
        run_id = f"{meta['namespace']}/{meta['name']}"
        try:
            self.kube.create(trainjob)
        except KubeError as exc:
            if exc.status == 409:  # created before: this run submitted again
                pass
            elif exc.transient:
                raise _unavailable(exc, run_id) from None
            else:  # refused (Trainer's admission, a quota): no retry makes it pass
                return RunStatus(run_id=run_id, phase="Failed", error=f"TrainJob {run_id} was refused: {exc.message}")
        return self.status(run_id) or RunStatus(run_id=run_id, phase="Pending", progress="TrainJob created")

    def status(self, run_id: str) -> RunStatus | None:
        namespace, _, name = run_id.partition("/")
        if not name:  # a run refused before any TrainJob was made: submitting again says why again
            return None
        try:
            trainjob = self.kube.get(TRAINER_API_VERSION, "TrainJob", name, namespace)
        except KubeError as exc:
            raise _unavailable(exc, run_id) from exc
        if trainjob is None:
            return None
        finished, error = trainjob_finished(trainjob)
        progress = _progress(trainjob) or self._waiting(namespace, name)
        if finished and error:
            return RunStatus(run_id=run_id, phase="Failed", error=f"TrainJob {run_id}: {error}", progress=progress)
        if finished:
            outputs = self.outcomes(trainjob["metadata"]["annotations"][RUN_ANNOTATION])
            if not outputs:
                return RunStatus(run_id=run_id, phase="Failed", progress=progress,
                                 error=f"TrainJob {run_id} completed but registered no version")
            return RunStatus(run_id=run_id, phase="Succeeded", outputs=outputs, progress=progress)
        return RunStatus(run_id=run_id, phase="Running" if trainjob.get("status") else "Pending", progress=progress)

    def _waiting(self, namespace: str, name: str) -> str:
        """Why a TrainJob has no Jobs yet: Trainer says so only in an Event
        (its JobSet refused, a runtime missing), which status then repeats."""
        events = self.kube.list("v1", "Event", namespace, field_selector=(
            f"involvedObject.kind=TrainJob,involvedObject.name={name},type=Warning"))
        if not events:
            return "TrainJob created, no Job started yet"
        latest = max(events, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        return f"no Job started yet: {latest.get('reason')}: {latest.get('message')}"

    def cancel(self, run_id: str) -> None:
        namespace, _, name = run_id.partition("/")
        try:
            self.kube.delete(TRAINER_API_VERSION, "TrainJob", name, namespace)
        except KubeError as exc:
            raise (_unavailable(exc, run_id) if exc.transient else exc) from None


def _unavailable(exc: KubeError, run_id: str) -> BackendUnavailable:
    return BackendUnavailable(f"TrainJob {run_id}: the API server answered {exc.status} {exc.reason}")


def _progress(trainjob: dict) -> str:
    """Each step's Jobs as Trainer counts them, for example
    "dataset-initializer: 1 succeeded; node: 2 active"."""
    parts = []
    for job in trainjob.get("status", {}).get("jobsStatus", []):
        counts = [f"{job[key]} {key}" for key in ("active", "ready", "succeeded", "failed") if job.get(key)]
        parts.append(f"{job['name']}: {', '.join(counts) or 'waiting'}")
    return "; ".join(parts)
