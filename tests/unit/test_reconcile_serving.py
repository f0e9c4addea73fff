"""The InferenceService reconciler with an in-memory registry and fleet."""

from __future__ import annotations

import json

import pytest

from kubeloop.api.refs import ObjectRef
from kubeloop.api.serving import InferenceServiceSpec, InferenceServiceStatus
from kubeloop.api.signature import TAG as SIGNATURE_TAG, ModelSignature
from kubeloop.monitoring.base import DriftMonitor
from kubeloop.operator.ports import Ports
from kubeloop.operator.reconcilers.common import transition_events
from kubeloop.operator.reconcilers.serving import reconcile_inference_service
from kubeloop.registry.tags import FEATURE_STORE, GPU_MEMORY_MIB as FOOTPRINT_TAG
from kubeloop.registry.base import RegistryUnavailable
from kubeloop.registry.memory import InMemoryRegistry
from tests.unit.fakes import RecordingServing
from tests.unit.test_placement import fleet as fake_fleet

REF = ObjectRef("InferenceService", "ml", "fraud", "uid-9", generation=1)


def spec(**fields) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate({"model": {"name": "fraud", "alias": "champion"}, **fields})


@pytest.fixture
def registry():
    reg = InMemoryRegistry()
    v1 = reg.add_version("fraud", "s3://m/1", tags={FOOTPRINT_TAG: "8192"})
    v2 = reg.add_version("fraud", "s3://m/2", tags={FOOTPRINT_TAG: "8192"})
    reg.set_alias("fraud", "champion", v1.version)
    reg.set_alias("fraud", "challenger", v2.version)
    return reg


@pytest.fixture
def serving():
    return RecordingServing()


def fleet(excluding=None):  # noqa: ANN001, ANN201 - the fleet port: as the object being placed sees it
    fleet.asked.append(excluding)
    return fake_fleet()


fleet.asked = []


@pytest.fixture
def ports(registry, serving):
    return Ports(registry=registry, serving={"kubernetes": serving}, fleet=fleet)


def test_ready_with_url_version_and_placement(ports, serving):
    out = reconcile_inference_service(REF, spec(gpu={"sharing": "mig"}), InferenceServiceStatus(), ports)
    assert out.status.phase == "Ready"
    assert out.status.url == "http://fraud.example" and out.status.model_version == "1"
    assert out.status.placement.resource == "nvidia.com/mig-1g.10gb"
    # Planned on the fleet as this object sees it: its own Pods' slices count as free.
    assert fleet.asked[-1] == REF
    request = serving.requests[-1]
    assert [(v.role, v.model.version, v.percent) for v in request.versions] == [("primary", "1", 100)]


def test_canary_gets_its_share(ports, serving):
    out = reconcile_inference_service(REF, spec(canary={"alias": "challenger", "percent": 20}),
                                      InferenceServiceStatus(), ports)
    versions = {v.role: (v.model.version, v.percent) for v in serving.requests[-1].versions}
    assert versions == {"primary": ("1", 80), "canary": ("2", 20)}
    assert out.status.canary_version == "2"


def test_status_reports_the_split_as_asked_where_the_backend_splits_exactly(ports):
    out = reconcile_inference_service(REF, spec(canary={"alias": "challenger", "percent": 20},
                                                shadow={"alias": "challenger", "percent": 10}),
                                      InferenceServiceStatus(), ports)
    assert [(t.role, t.version, t.percent) for t in out.status.traffic] == [
        ("primary", "1", 80), ("canary", "2", 20), ("shadow", "2", 10)]
    canary = next(c for c in out.status.conditions if c.type == "CanaryReady")
    assert canary.message == "version 2 gets 20% of requests"


def test_status_reports_the_share_the_backend_really_gives(registry):
    """A backend splitting by replica ratio (one primary, one canary replica)
    gives a 20% canary half the requests, and mirrors nothing: status says so."""
    serving = RecordingServing(traffic={"primary": 50, "canary": 50, "shadow": 0})
    ports = Ports(registry=registry, serving={"kubernetes": serving}, fleet=fleet)
    out = reconcile_inference_service(REF, spec(canary={"alias": "challenger", "percent": 20},
                                                shadow={"alias": "challenger", "percent": 10}),
                                      InferenceServiceStatus(), ports)
    assert [(t.role, t.percent) for t in out.status.traffic] == [("primary", 50), ("canary", 50), ("shadow", 0)]
    canary = next(c for c in out.status.conditions if c.type == "CanaryReady")
    assert canary.message.startswith("version 2 gets 50% of requests (20% asked")
    assert out.status.model_dump(by_alias=True, mode="json")["traffic"][1] == {
        "role": "canary", "version": "2", "percent": 50}


def test_alias_move_is_followed(ports, registry, serving):
    first = reconcile_inference_service(REF, spec(), InferenceServiceStatus(), ports).status
    registry.set_alias("fraud", "champion", "2")
    out = reconcile_inference_service(REF, spec(), first, ports)
    assert out.status.model_version == "2"


def test_missing_model_is_pending_with_a_reason(ports):
    out = reconcile_inference_service(REF, spec(model={"name": "nope", "alias": "champion"}),
                                      InferenceServiceStatus(), ports)
    assert out.status.phase == "Pending"
    cond = next(c for c in out.status.conditions if c.type == "ModelResolved")
    assert cond.reason == "ModelNotFound" and "models:/nope@champion" in cond.message


def test_impossible_placement_is_a_condition_not_a_silent_pending(ports, serving):
    out = reconcile_inference_service(
        REF, spec(gpu={"sharing": "mig", "mig": {"profile": "1g.10gb"}, "memoryMib": 81920}),
        InferenceServiceStatus(), ports)
    assert out.status.phase == "Failed"
    cond = next(c for c in out.status.conditions if c.type == "Placed")
    assert cond.reason == "NoFittingCapacity" and "does not fit MIG profile 1g.10gb" in cond.message
    assert serving.requests == [], "nothing is deployed for an impossible request"


def test_rolling_out_is_pending_then_ready(ports, serving):
    serving.ready = False
    first = reconcile_inference_service(REF, spec(), InferenceServiceStatus(), ports)
    assert first.status.phase == "Pending"
    serving.ready = True
    second = reconcile_inference_service(REF, spec(), first.status, ports)
    assert second.status.phase == "Ready"
    events = transition_events("InferenceService", first.status, second.status)
    assert [(e.reason, e.message) for e in events][-1] == ("Ready", "InferenceService is Ready")
    assert transition_events("InferenceService", second.status, second.status) == []


def test_an_outage_is_containers_failing_not_a_rollout_and_recovery_clears_it(ports, serving, monkeypatch):
    """Cluster path (reconciler): the backend's word that replicas are missing
    because containers died becomes Deployed=False reason ContainersFailing
    with its message; back to Ready, the condition is True again."""
    from kubeloop.serving.base import ServingState

    ready = reconcile_inference_service(REF, spec(), InferenceServiceStatus(), ports)
    died = "primary: 0/1 replicas available; primary: p/triton restarted 1x (last: OOMKilled at T)"
    monkeypatch.setattr(serving, "ensure", lambda request: ServingState(
        url="http://x", ready={"primary": False}, message=died, failing=True))
    outage = reconcile_inference_service(REF, spec(), ready.status, ports)
    deployed = next(c for c in outage.status.conditions if c.type == "Deployed")
    assert (deployed.status, deployed.reason, deployed.message) == ("False", "ContainersFailing", died)
    assert outage.status.phase == "Pending" and outage.waiting
    monkeypatch.undo()
    recovered = reconcile_inference_service(REF, spec(), outage.status, ports)
    assert recovered.status.phase == "Ready"
    assert next(c for c in recovered.status.conditions if c.type == "Deployed").status == "True"


def test_a_swap_in_place_stays_ready_on_the_version_that_answers(ports, registry, serving, monkeypatch):
    """Local path (reconciler): while the backend loads a new version beside
    the old one, which keeps answering, the service is Ready on the old
    version with Deployed=True Updating, and looks again soon; a canary still
    loading is a rollout, not a degradation."""
    from kubeloop.serving.base import ServingState

    ready = reconcile_inference_service(REF, spec(), InferenceServiceStatus(), ports)
    registry.set_alias("fraud", "champion", "2")
    monkeypatch.setattr(serving, "ensure", lambda request: ServingState(
        url="http://x", ready={role: False for role in ("primary", "canary")}, answering="1", ready_replicas=1,
        message="Triton is loading fraud version 2"))
    swapping = reconcile_inference_service(REF, spec(canary={"alias": "challenger", "percent": 20}), ready.status,
                                           ports)
    deployed = next(c for c in swapping.status.conditions if c.type == "Deployed")
    assert (deployed.status, deployed.reason) == ("True", "Updating") and "version 1 answers" in deployed.message
    assert (swapping.status.phase, swapping.status.model_version) == ("Ready", "1") and swapping.waiting
    monkeypatch.undo()
    done = reconcile_inference_service(REF, spec(), swapping.status, ports)
    assert (done.status.phase, done.status.model_version) == ("Ready", "2")
    assert next(c for c in done.status.conditions if c.type == "Deployed").reason == "Available"


def test_a_canary_loading_beside_the_same_primary_is_a_rollout_not_a_degradation(ports, serving, monkeypatch):
    """Local path (reconciler): a canary added while the champion stays put
    loads beside it, the backend saying the champion answers meanwhile. The
    hysteresis for failed checks (same version, was Ready) must not take that
    for a primary that still passes its checks and a canary that fails them:
    that read Degraded while every caller was answered."""
    from kubeloop.serving.base import ServingState

    ready = reconcile_inference_service(REF, spec(), InferenceServiceStatus(), ports)
    monkeypatch.setattr(serving, "ensure", lambda request: ServingState(
        url="http://x", ready={role: False for role in ("primary", "canary")}, answering="1", ready_replicas=1,
        message="Triton is loading fraud version 1"))
    loading = reconcile_inference_service(REF, spec(canary={"alias": "challenger", "percent": 20}), ready.status,
                                          ports)
    deployed = next(c for c in loading.status.conditions if c.type == "Deployed")
    assert (loading.status.phase, deployed.reason) == ("Ready", "Updating")
    assert loading.status.primary_unready_since is None


def test_registry_outage_retries(ports, registry, monkeypatch):
    def down(*_a, **_k):
        raise RegistryUnavailable("mlflow down")

    monkeypatch.setattr(registry, "get_alias", down)
    out = reconcile_inference_service(REF, spec(), InferenceServiceStatus(), ports, attempt=0)
    assert out.retry_after == 2 and "mlflow down" in out.retry_reason


def test_a_canary_that_fails_readiness_is_rolled_back_and_stays_out(ports, serving):
    from kubeloop.serving.base import ServingState

    s = spec(canary={"alias": "challenger", "percent": 20})
    first = reconcile_inference_service(REF, s, InferenceServiceStatus(), ports).status
    assert first.canary_version == "2"

    def failing(request):
        serving.requests.append(request)
        return ServingState(url="http://x", ready={"primary": True}, ready_replicas=1,
                            message="canary version 2 failed to load", rolled_back=("canary",))

    serving.ensure = failing
    rolled = reconcile_inference_service(REF, s, first, ports).status
    assert rolled.phase == "Degraded" and rolled.rolled_back_version == "2" and rolled.canary_version is None
    cond = next(c for c in rolled.conditions if c.type == "CanaryReady")
    assert (cond.status, cond.reason) == ("False", "RolledBack")

    serving.ensure = RecordingServing.ensure.__get__(serving)
    again = reconcile_inference_service(REF, s, rolled, ports).status
    assert [v.role for v in serving.requests[-1].versions] == ["primary"], "the failed canary gets no traffic"
    assert again.rolled_back_version == "2"


def test_a_new_canary_version_is_tried_again(ports, registry, serving):
    from kubeloop.api.serving import InferenceServiceStatus as Status

    v3 = registry.add_version("fraud", "s3://m/3")
    registry.set_alias("fraud", "challenger", v3.version)
    s = spec(canary={"alias": "challenger", "percent": 20})
    out = reconcile_inference_service(REF, s, Status(rolled_back_version="2"), ports).status
    assert out.canary_version == "3" and out.rolled_back_version is None
    assert [v.role for v in serving.requests[-1].versions] == ["primary", "canary"]


def test_local_backend_serves_on_cpu(ports, serving):
    ports.serving["local"] = serving
    out = reconcile_inference_service(REF, spec(backend="local", gpu={"sharing": "mig"}), InferenceServiceStatus(),
                                      ports)
    assert out.status.placement.mode == "cpu" and "local backend" in out.status.placement.reason


class RecordingMonitor(DriftMonitor):
    def __init__(self):
        self.jobs: list[dict] = []

    def running(self, ref: ObjectRef) -> bool:
        return False

    def start(self, ref: ObjectRef, job: dict) -> None:
        self.jobs.append(job)

    def latest(self, ref: ObjectRef) -> dict | None:
        return None

    def forget(self, ref: ObjectRef) -> None:
        self.jobs.clear()


def test_the_drift_job_compares_the_served_versions_signature_columns_from_its_own_store(registry, serving):
    """The job the reconciler hands the monitor: the primary's input columns
    (its signature tag) and its feature store (its tag); a version without a
    store tag leaves the default repository to the job, and where MLflow and
    that repository are to the monitor."""
    signature = ModelSignature(task="multiclass", feature_columns=["x1", "x2", "x3"], classes=["a", "b"])
    store = json.dumps({"config": "project: other\n"})
    v3 = registry.add_version("fraud", "s3://m/3", tags={SIGNATURE_TAG: signature.to_json(), FEATURE_STORE: store})
    registry.set_alias("fraud", "champion", v3.version)
    monitor = RecordingMonitor()
    ports = Ports(registry=registry, serving={"kubernetes": serving}, fleet=fleet, monitor=monitor)
    watched = spec(monitoring={"schedule": "1m", "driftShareThreshold": 0.4}, requestLogging={"destination": "/logs/fraud"})
    reconcile_inference_service(REF, watched, InferenceServiceStatus(), ports)
    job = monitor.jobs[-1]
    assert (job["version"], job["columns"], job["feature_store"]) == (v3.version, ["x1", "x2", "x3"], store)
    assert job["threshold"] == 0.4
    assert job["request_log"] == "/logs/fraud" and "feast_repo" not in job and "tracking_uri" not in job
    registry.set_alias("fraud", "champion", "1")
    reconcile_inference_service(REF, watched, InferenceServiceStatus(), ports)
    assert monitor.jobs[-1]["feature_store"] == "" and monitor.jobs[-1]["columns"] == []


def test_a_model_that_fits_after_a_relayout_says_so_in_its_condition(ports, serving):
    """Unit (reconciler, fake fleet file): 60 GiB fits no slice the fleet
    has now, but a re-partitioned H100 would: a reason of its own, naming
    the node and the layout, and nothing deployed."""
    out = reconcile_inference_service(REF, spec(gpu={"sharing": "mig", "memoryMib": 60 * 1024}),
                                      InferenceServiceStatus(), ports)
    cond = next(c for c in out.status.conditions if c.type == "Placed")
    assert cond.reason == "FitsAfterRelayout", cond
    assert "fits after relabelling node gpu-h100-mig-mixed to nvidia.com/mig.config=" in cond.message
    assert serving.requests == []


class Flaky(RecordingServing):
    """A backend whose readiness checks fail on demand (a slow health check,
    a router opening a store) or whose containers die."""

    def __init__(self):
        super().__init__()
        self.failing = False

    def ensure(self, request):  # noqa: ANN001, ANN201
        from dataclasses import replace

        return replace(super().ensure(request), failing=self.failing)


def test_a_ready_service_stays_ready_through_a_short_run_of_failed_checks(registry):
    """Local and cluster alike (the reconcile's hysteresis): one failed
    readiness check does not flip the phase of a service that answers; 30 s
    of them do, and dead containers do at once."""
    now = [1_800_000_000.0]
    backend = Flaky()
    ports = Ports(registry=registry, serving={"kubernetes": backend}, fleet=fleet, clock=lambda: now[0])
    status = reconcile_inference_service(REF, spec(), InferenceServiceStatus(), ports).status
    assert status.phase == "Ready" and status.primary_unready_since is None
    backend.ready = False
    out = reconcile_inference_service(REF, spec(), status, ports)
    assert out.status.phase == "Ready" and out.status.primary_unready_since == "2027-01-15T08:00:00Z"
    assert out.waiting, "looked at again soon, not at the next resync"
    deployed = next(c for c in out.status.conditions if c.type == "Deployed")
    assert deployed.status == "True" and "readiness checks have failed since" in deployed.message
    now[0] += 29
    status = reconcile_inference_service(REF, spec(), out.status, ports).status
    assert status.phase == "Ready"
    now[0] += 2
    status = reconcile_inference_service(REF, spec(), status, ports).status
    assert status.phase == "Pending" and status.primary_unready_since is None
    backend.ready = True
    status = reconcile_inference_service(REF, spec(), status, ports).status
    assert status.phase == "Ready"
    backend.ready, backend.failing = False, True
    status = reconcile_inference_service(REF, spec(), status, ports).status
    assert status.phase == "Pending", "containers dying are an outage at once"
