"""Small in-memory stand-ins for the ports, for unit tests of reconcilers."""

from __future__ import annotations

from kubeloop.api.refs import ObjectRef
from kubeloop.monitoring.outcomes.traffic import TrafficSample
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

    def __init__(self, ready: bool = True, traffic: dict[str, int] | None = None):
        self.requests: list[ServingRequest] = []
        self.deleted: list[ObjectRef] = []
        self.ready = ready
        self.traffic = traffic

    def ensure(self, request: ServingRequest) -> ServingState:
        self.requests.append(request)
        return ServingState(url=f"http://{request.ref.name}.example", ready={v.role: self.ready for v in request.versions},
                            ready_replicas=1 if self.ready else 0, message="" if self.ready else "rolling out",
                            traffic=self.traffic)

    def delete(self, ref: ObjectRef) -> None:
        self.deleted.append(ref)


class FakeObjects:
    """Objects the reconcilers create, kept in a dict; tests play their
    controllers by writing status."""

    def __init__(self):
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.applies = 0

    def apply(self, obj: dict) -> dict:
        self.applies += 1
        key = (obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])
        merged = {**self.objects.get(key, {}), **obj}
        self.objects[key] = merged
        return merged

    def create(self, obj: dict) -> dict:
        from kubeloop.kube import KubeError

        key = (obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
        if key in self.objects:
            raise KubeError(409, "AlreadyExists", f"{obj['kind']} {key[2]} already exists")
        self.objects[key] = obj
        return obj

    def get(self, api_version, kind, name, namespace=None):  # noqa: ANN001
        return self.objects.get((kind, namespace, name))

    def list(self, api_version, kind, namespace=None, label_selector=None, field_selector=None):  # noqa: ANN001
        wanted = dict(term.partition("=")[::2] for term in (label_selector or "").split(",") if term)
        fields = dict(term.partition("=")[::2] for term in (field_selector or "").split(",") if term)

        def field(obj: dict, path: str):  # noqa: ANN202 - whatever the object holds there
            for part in path.split("."):
                obj = obj.get(part, {}) if isinstance(obj, dict) else {}
            return obj

        return [o for (k, ns, _), o in self.objects.items() if k == kind and ns == namespace
                and all(o["metadata"].get("labels", {}).get(key) == value for key, value in wanted.items())
                and all(field(o, path) == value for path, value in fields.items())]

    def delete(self, api_version, kind, name, namespace=None):  # noqa: ANN001
        self.objects.pop((kind, namespace, name), None)

    def set_status(self, kind: str, namespace: str, name: str, **status) -> None:
        self.objects[(kind, namespace, name)]["status"] = status


class FakeTraffic:
    """The front's measurements as a rollout's analysis reads them: a
    healthy challenger by default; tests set what Prometheus would say."""

    def __init__(self):
        self.sample_for: dict[tuple[str, str], TrafficSample] = {}

    def healthy(self, champion: str, challenger: str, requests: float = 500) -> TrafficSample:
        return TrafficSample(requests={champion: requests * 4, challenger: requests}, errors={},
                             p99={champion: 0.01, challenger: 0.011}, comparisons=requests / 10, disagreements=0,
                             timed={champion: requests * 4, challenger: requests})

    def sample(self, service: str, champion: str, challenger: str, window: float, settle: float = 0.0,
               ) -> TrafficSample:
        return self.sample_for.get((champion, challenger)) or self.healthy(champion, challenger)
