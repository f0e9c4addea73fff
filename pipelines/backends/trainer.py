"""The trainer backend: each training pipeline run is one Kubeflow Trainer
TrainJob on the cluster (kubeloop.components.trainjob) and each optimisation
run one batch Job (kubeloop.pipelines.optimization_jobs), so a team's
training and optimisation run in Pods on the cluster's nodes, never on the
operator's.

The object's name comes from the run's, so submitting a run again (a
retried reconcile, a restarted operator) finds it instead of creating a
second. A TrainJob's phase comes from Trainer's conditions (Complete,
Failed) and its progress from its JobSet's Jobs; a Job's from its own
conditions and Pods. What a run registered is read from the model registry,
where the run tagged the version. Cancelling deletes the object, and with it
its Pods.
"""

from __future__ import annotations

from typing import Callable

from kubeloop.api import jobs
from kubeloop.api.training import TrainingJobSpec
from kubeloop.components.trainer_run import NO_STORE
from kubeloop.components.trainjob import RUN_ANNOTATION, TRAINER_API_VERSION, TrainerSettings, trainjob_finished
from kubeloop.kube import Kube, KubeError
from kubeloop.pipelines.backends.base import BackendUnavailable, PipelineBackend, RunRequest, RunStatus
from kubeloop.pipelines.optimization_jobs import build_optimization_job, is_optimization_job
from kubeloop.pipelines.trainjobs import build_pipeline_trainjob

OutcomeReader = Callable[[str], dict]


class TrainerBackend(PipelineBackend):
    name = "trainer"

    def __init__(self, kube: Kube, settings: TrainerSettings, outcomes: OutcomeReader):
        self.kube = kube
        self.settings = settings
        self.outcomes = outcomes

    def submit(self, request: RunRequest) -> RunStatus:
        if request.pipeline == "optimization":
            return self._create(build_optimization_job(request, self.settings))
        spec = TrainingJobSpec.from_json(request.arguments["spec"])
        if spec.features.store is None:
            return RunStatus(run_id=request.name, phase="Failed", error=NO_STORE)
        return self._create(build_pipeline_trainjob(request, spec, self.settings))

    def _create(self, obj: dict) -> RunStatus:
        meta, kind = obj["metadata"], obj["kind"]
        run_id = f"{meta['namespace']}/{meta['name']}"
        try:
            self.kube.create(obj)
        except KubeError as exc:
            if exc.status == 409:  # created before: this run submitted again
                pass
            elif exc.transient:
                raise _unavailable(exc, run_id) from None
            else:  # refused (admission, a quota): no retry makes it pass
                return RunStatus(run_id=run_id, phase="Failed", error=f"{kind} {run_id} was refused: {exc.message}")
        return self.status(run_id) or RunStatus(run_id=run_id, phase="Pending", progress=f"{kind} created")

    def status(self, run_id: str) -> RunStatus | None:
        namespace, _, name = run_id.partition("/")
        if not name:  # a run refused before anything was made: submitting again says why again
            return None
        api_version, kind = _kind_of(name)
        try:
            obj = self.kube.get(api_version, kind, name, namespace)
            if obj is None:
                return None
            if kind == "Job":
                finished, error = jobs.finished(obj), jobs.failure(obj)
                progress = _pod_progress(obj) or self._waiting(namespace, kind, name, "no Pod started yet")
            else:
                finished, error = trainjob_finished(obj)
                progress = _progress(obj) or self._waiting(namespace, kind, name, "no Job started yet")
            if error:
                error = f"{error}{self._last_words(namespace, kind, name)}"
            elif not finished and _some_pod_not_ready(obj, kind):
                progress += self._unplaced(namespace, kind, name)
        except KubeError as exc:
            raise _unavailable(exc, run_id) from exc
        if finished and error:
            return RunStatus(run_id=run_id, phase="Failed", error=f"{kind} {run_id}: {error}", progress=progress)
        if finished:
            outputs = self.outcomes(obj["metadata"]["annotations"][RUN_ANNOTATION])
            if not outputs:
                return RunStatus(run_id=run_id, phase="Failed", progress=progress,
                                 error=f"{kind} {run_id} completed but registered no version")
            return RunStatus(run_id=run_id, phase="Succeeded", outputs=outputs, progress=progress)
        return RunStatus(run_id=run_id, phase="Running" if obj.get("status") else "Pending", progress=progress)

    def _waiting(self, namespace: str, kind: str, name: str, nothing_yet: str) -> str:
        """Why nothing runs yet: Trainer and the Job controller say so only in
        an Event (a JobSet refused, a runtime missing, a Pod the namespace's
        policy forbids), which status then repeats."""
        events = self.kube.list("v1", "Event", namespace, field_selector=(
            f"involvedObject.kind={kind},involvedObject.name={name},type=Warning"))
        if not events:
            return f"{kind} created, {nothing_yet}"
        latest = max(events, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        return f"{nothing_yet}: {latest.get('reason')}: {latest.get('message')}"

    def _last_words(self, namespace: str, kind: str, name: str) -> str:
        """The last line the run's latest Pod that left a termination message
        logged (a Job's, or any of a TrainJob's JobSet)."""
        said = _last_line(jobs.termination_message(self._pods(namespace, kind, name)) or "")
        return f"; the Pod said: {said}" if said else ""

    def _unplaced(self, namespace: str, kind: str, name: str) -> str:
        """Why one of the run's Pods waits for a node, as the scheduler says
        (a Job controller counts such a Pod active, Trainer its Job running)."""
        for pod in self._pods(namespace, kind, name):
            scheduled = next((c for c in pod.get("status", {}).get("conditions", []) if c.get("type") == "PodScheduled"),
                             {})
            if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
                return f"; Pod {pod['metadata']['name']} waits for a node: {scheduled.get('message', '')}"
        return ""

    def _pods(self, namespace: str, kind: str, name: str) -> list[dict]:
        selector = f"job-name={name}" if kind == "Job" else f"jobset.sigs.k8s.io/jobset-name={name}"
        return self.kube.list("v1", "Pod", namespace, label_selector=selector)

    def cancel(self, run_id: str) -> None:
        namespace, _, name = run_id.partition("/")
        api_version, kind = _kind_of(name)
        try:
            self.kube.delete(api_version, kind, name, namespace)
        except KubeError as exc:
            raise (_unavailable(exc, run_id) if exc.transient else exc) from None


def _kind_of(name: str) -> tuple[str, str]:
    return ("batch/v1", "Job") if is_optimization_job(name) else (TRAINER_API_VERSION, "TrainJob")


def _some_pod_not_ready(obj: dict, kind: str) -> bool:
    """Whether the run's controller counts a Pod active that is not ready
    (one the scheduler may not have placed): only then are its Pods read."""
    status = obj.get("status") or {}
    counts = [status] if kind == "Job" else status.get("jobsStatus") or []
    return any(c.get("active", 0) > c.get("ready", 0) for c in counts)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:400] if lines else ""


def _pod_progress(job: dict) -> str:
    """The Job's Pods as its controller counts them, for example "optimizer: 1 active, 1 failed"."""
    status = job.get("status", {})
    counts = [f"{status[key]} {key}" for key in ("active", "ready", "succeeded", "failed") if status.get(key)]
    return f"optimizer: {', '.join(counts)}" if counts else ""


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
