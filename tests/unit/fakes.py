"""Small in-memory stand-ins for the ports, for unit tests of reconcilers."""

from __future__ import annotations

from kubeloop.api.refs import ObjectRef
from kubeloop.pipelines.backends.base import BackendUnavailable, PipelineBackend, RunRequest, RunStatus
from kubeloop.serving.base import ServingBackend, ServingRequest, ServingState


class ScriptedBackend(PipelineBackend):
    """Runs stay in the phase the test sets; submissions are counted."""

    name = "scripted"

    def __init__(self):
        self.runs: dict[str, RunStatus] = {}
        self.requests: list[RunRequest] = []
        self.cancelled: list[str] = []
        self.down = False

    def submit(self, request: RunRequest) -> RunStatus:
        if self.down:
            raise BackendUnavailable("backend down")
        self.requests.append(request)
        return self.runs.setdefault(request.name, RunStatus(request.name, "Running", url=f"http://kfp/{request.name}"))

    def status(self, run_id: str) -> RunStatus | None:
        if self.down:
            raise BackendUnavailable("backend down")
        return self.runs.get(run_id)

    def cancel(self, run_id: str) -> None:
        self.cancelled.append(run_id)
        if run_id in self.runs:
            self.runs[run_id] = RunStatus(run_id, "Failed", error="cancelled")

    def finish(self, run_id: str, **kwargs) -> None:
        self.runs[run_id] = RunStatus(run_id, kwargs.pop("phase", "Succeeded"), **kwargs)


class RecordingServing(ServingBackend):
    name = "recording"

    def __init__(self, ready: bool = True):
        self.requests: list[ServingRequest] = []
        self.deleted: list[ObjectRef] = []
        self.ready = ready

    def ensure(self, request: ServingRequest) -> ServingState:
        self.requests.append(request)
        return ServingState(url=f"http://{request.ref.name}.example", ready={v.role: self.ready for v in request.versions},
                            ready_replicas=1 if self.ready else 0, message="" if self.ready else "rolling out")

    def delete(self, ref: ObjectRef) -> None:
        self.deleted.append(ref)
