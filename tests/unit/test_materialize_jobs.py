"""Keeping online stores fresh on a cluster (the cluster path's operator
side, over objects in memory): the materialisation Job (pure builder), the
run that starts it, finds it again and waits for it, and what a finished or
failed Job becomes; the reconciler and the wiring on the cluster backends.
The Pod's side against real Feast and object storage is
tests/components/test_freshness.py; the whole path on the real node is
tests/e2e/test_real_node.py."""

from __future__ import annotations

import json
import re
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from kubeloop.api.jobs import SUMMARY_BYTES
from kubeloop.api.serving import InferenceServiceSpec, InferenceServiceStatus
from kubeloop.featurestore.freshness import Materialized, Materializer, StoreNeed, read_job_request
from kubeloop.operator.materializing import (
    KEEP_JOBS, UNPUBLISHED, MaterializeJobs, MaterializeJobSettings, build_materialize_job, job_name,
)
from tests.unit.fakes import FakeObjects, RecordingServing

NAMESPACE = "kubeloop-system"
STORE = json.dumps({"config": "project: fraud\nregistry: s3://feast/fraud/registry.db\n"})
FOLDER = json.dumps({"path": "/repos/fraud"})
NEED = StoreNeed(STORE, ("card_activity", "card_profile"), 10.0)
SETTINGS = MaterializeJobSettings(image="kubeloop/runtime:1", namespace=NAMESPACE, object_store_secret="feast-s3",
                                  object_store_endpoint="http://s3.storage:8333")
RESULT = Materialized("fraud", {"card_activity": 1000.0, "card_profile": 1000.0})


def test_the_job_runs_restricted_on_the_runtime_image_in_the_operators_namespace_with_the_secret_by_reference():
    """Cluster path: what the Job's Pod gets, and nothing it should not."""
    job = build_materialize_job(NEED, 1000.7, SETTINGS)
    assert job["metadata"]["namespace"] == NAMESPACE and job["metadata"]["name"] == job_name(STORE, 1000.7)
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["backoffLimit"] == 0  # the Materializer retries, with its own backoff
    assert spec["activeDeadlineSeconds"] > 0 and spec["ttlSecondsAfterFinished"] > 0
    assert pod["automountServiceAccountToken"] is False and pod["restartPolicy"] == "Never"
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    [container] = pod["containers"]
    assert container["image"] == "kubeloop/runtime:1"
    assert container["command"] == ["python", "-m", "kubeloop.featurestore.job", "--summary", "/dev/termination-log"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    env = {e["name"]: e["value"] for e in container["env"]}
    assert read_job_request(env["KUBELOOP_MATERIALIZE"]) == (StoreNeed(STORE, NEED.views, 0.0), 1000.7)
    assert env["AWS_ENDPOINT_URL_S3"] == env["FEAST_S3_ENDPOINT_URL"] == "http://s3.storage:8333"
    assert container["envFrom"] == [{"secretRef": {"name": "feast-s3"}}]
    # Credentials by reference only: no value of a credential anywhere in the object.
    assert not [e for e in container["env"] if re.search(r"KEY|SECRET|PASSWORD|TOKEN", e["name"])]
    assert "secretKeyRef" not in json.dumps(job) and "AWS_SECRET_ACCESS_KEY" not in json.dumps(job)


def test_a_jobs_name_is_one_per_store_and_run_and_a_valid_label():
    """Cluster path: a restarted operator names the same run's Job alike."""
    assert job_name(STORE, 1000.2) == job_name(STORE, 1000.9) != job_name(STORE, 1001.0)
    assert job_name(STORE, 1000.0) != job_name(FOLDER, 1000.0)
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", job_name(STORE, 1.8e9))


class Cluster:
    """The Job controller and kubelet played over FakeObjects."""

    def __init__(self):
        self.kube = FakeObjects()

    def jobs(self) -> list[str]:
        return sorted(name for (kind, _ns, name) in self.kube.objects if kind == "Job")

    def finish(self, name: str, message: str | None, failed: str | None = None) -> None:
        conditions = [{"type": "Failed", "status": "True", "reason": failed, "message": "Job was active longer"}] \
            if failed else [{"type": "Complete", "status": "True"}]
        self.kube.set_status("Job", NAMESPACE, name, conditions=conditions)
        terminated = {"exitCode": 1 if failed else 0, "finishedAt": "2026-11-26T00:00:00Z",
                      **({"message": message} if message else {})}
        self.kube.objects[("Pod", NAMESPACE, f"{name}-x")] = {
            "kind": "Pod", "metadata": {"name": f"{name}-x", "namespace": NAMESPACE, "labels": {"job-name": name}},
            "status": {"containerStatuses": [{"state": {"terminated": terminated}}]}}


@pytest.fixture
def cluster():
    return Cluster()


@pytest.fixture
def pool():
    with ThreadPoolExecutor(2) as executor:
        yield executor


def _run(runs: MaterializeJobs, pool, end: float) -> Future:
    return pool.submit(runs, NEED, end)


def _wait_for_jobs(cluster: Cluster, count: int) -> list[str]:
    deadline = time.monotonic() + 5
    while len(cluster.jobs()) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return cluster.jobs()


def test_a_run_waits_for_its_job_and_returns_what_the_pod_left(cluster, pool):
    """Cluster path: the run blocks its worker thread until the Job finishes;
    the termination message becomes the Materialized result."""
    future = _run(MaterializeJobs(cluster.kube, SETTINGS, poll=0.01), pool, 1000.0)
    [name] = _wait_for_jobs(cluster, 1)
    time.sleep(0.05)
    assert not future.done()
    cluster.finish(name, RESULT.summary(SUMMARY_BYTES))
    assert future.result(timeout=5) == RESULT


def test_a_second_start_of_the_same_run_finds_its_job_instead_of_creating_another(cluster, pool):
    """Cluster path: the same store and end (a restarted operator) is the same
    Job: the create answers 409 and the run reads that Job."""
    runs = MaterializeJobs(cluster.kube, SETTINGS, poll=0.01)
    first = _run(runs, pool, 1000.0)
    [name] = _wait_for_jobs(cluster, 1)
    cluster.finish(name, RESULT.summary(SUMMARY_BYTES))
    assert first.result(timeout=5) == RESULT
    assert runs(NEED, 1000.0) == RESULT
    assert cluster.jobs() == [name]


def test_a_running_job_of_the_store_is_waited_for_and_no_second_one_starts(cluster, pool):
    """Cluster path: an operator that restarted while its Job ran schedules
    the store at once, with a new end; it waits for the Job that runs."""
    earlier = build_materialize_job(NEED, 900.0, SETTINGS)
    cluster.kube.create(earlier)
    future = _run(MaterializeJobs(cluster.kube, SETTINGS, poll=0.01), pool, 1000.0)
    time.sleep(0.1)
    assert cluster.jobs() == [earlier["metadata"]["name"]] and not future.done()
    cluster.finish(earlier["metadata"]["name"], RESULT.summary(SUMMARY_BYTES))
    assert future.result(timeout=5) == RESULT


def test_a_job_that_left_no_result_is_an_error_with_its_reason(cluster, pool):
    """Cluster path: a Pod killed at the Job's deadline leaves no message."""
    future = _run(MaterializeJobs(cluster.kube, SETTINGS, poll=0.01), pool, 1000.0)
    [name] = _wait_for_jobs(cluster, 1)
    cluster.finish(name, None, failed="DeadlineExceeded")
    result = future.result(timeout=5)
    assert result.ends == {} and f"{name} failed: DeadlineExceeded" in result.error


def test_a_failed_views_error_and_the_ends_come_back_from_the_summary(cluster, pool):
    """Cluster path: the Pod exits 1 when a view failed; its summary still
    says which, and how far every view got (the lag stays true)."""
    partial = Materialized("fraud", {"card_activity": 900.0, "card_profile": 1000.0},
                           "card_activity: FileNotFoundError: " + "x" * 9000)
    future = _run(MaterializeJobs(cluster.kube, SETTINGS, poll=0.01), pool, 1000.0)
    [name] = _wait_for_jobs(cluster, 1)
    cluster.finish(name, partial.summary(SUMMARY_BYTES), failed="BackoffLimitExceeded")
    result = future.result(timeout=5)
    assert result.ends == partial.ends and result.error.startswith("card_activity: FileNotFoundError: xxx")
    assert len(partial.summary(SUMMARY_BYTES).encode()) <= SUMMARY_BYTES


def test_older_finished_jobs_of_a_store_go_when_the_next_starts(cluster, pool):
    """Cluster path: bounded, KEEP_JOBS per store."""
    runs = MaterializeJobs(cluster.kube, SETTINGS, poll=0.01)
    for i in range(KEEP_JOBS + 3):
        future = _run(runs, pool, 1000.0 + i)
        name = job_name(STORE, 1000.0 + i)
        deadline = time.monotonic() + 5
        while name not in cluster.jobs() and time.monotonic() < deadline:
            time.sleep(0.01)
        cluster.finish(name, RESULT.summary(SUMMARY_BYTES))
        future.result(timeout=5)
    assert cluster.jobs() == sorted(job_name(STORE, 1000.0 + i) for i in range(3, KEEP_JOBS + 3))


def test_a_repository_folder_gets_no_job(cluster):
    """Cluster path: a folder is on the operator's machine; without the local
    backend nothing can materialise it, and the run says what to do."""
    need = StoreNeed(FOLDER, ("card_activity",), 10.0)
    assert MaterializeJobs(cluster.kube, SETTINGS).__call__(need, 1000.0) == Materialized("", {}, UNPUBLISHED)
    local = MaterializeJobs(cluster.kube, SETTINGS, local=lambda n, end: Materialized("here", {}, None))
    assert local(need, 1000.0).project == "here"
    assert cluster.jobs() == []


def test_stopping_the_materializer_stops_a_run_waiting_for_its_job(cluster):
    """Cluster path: the operator's shutdown does not wait for a Job."""
    runs = MaterializeJobs(cluster.kube, SETTINGS, poll=0.05)
    materializer = Materializer(runs, workers=1)
    materializer.want("uid-1", [NEED])
    materializer.due()
    _wait_for_jobs(cluster, 1)
    done = threading.Event()
    threading.Thread(target=lambda: (runs(NEED, 1000.0), done.set()), daemon=True).start()
    materializer.stop()
    assert done.wait(2)


# -- the reconciler and the wiring on the cluster backends -------------------

def _kubernetes_backend(materialized: bool, router: str | None = "kubeloop/runtime:1"):
    from kubeloop.serving.builders.workloads import ServingImages
    from kubeloop.serving.kubernetes import KubernetesServing

    images = ServingImages(triton="triton:1", triton_backend="python", puller="kubeloop/runtime:1", tracking_uri="",
                           router=router)
    return KubernetesServing(FakeObjects(), images, materialized=materialized)


class PodServing(RecordingServing):
    """A cluster backend as the reconciler sees it: router Pods read online
    features, from published stores only, and Jobs keep them fresh."""

    reads_online_features = True
    published_stores_only = True


@pytest.mark.parametrize("store, condition", [
    (STORE, ("Unknown", "FirstRun")),
    (FOLDER, ("False", "StoreNotPublished")),
])
def test_on_a_cluster_backend_a_published_store_is_scheduled_and_a_folder_is_said_not_to_be(store, condition):
    """Cluster path (a backend whose serving path runs in Pods): the
    published store is scheduled; a folder store is not, and FeaturesFresh
    says to publish it."""
    from kubeloop.operator.reconcilers.serving import reconcile_inference_service
    from tests.unit.test_freshness import Clock, Runs, _ports
    from tests.unit.test_reconcile_serving import REF

    materializer = Materializer(Runs(), clock=Clock())
    ports = _ports(PodServing(), materializer, ["card_activity"], store=store)
    spec = InferenceServiceSpec.model_validate({"model": {"name": "fraud", "alias": "champion"},
                                                "features": {"materializeEvery": "10s"}})
    out = reconcile_inference_service(REF, spec, InferenceServiceStatus(), ports)
    fresh = next(c for c in out.status.conditions if c.type == "FeaturesFresh")
    assert (fresh.status, fresh.reason) == condition
    assert [s.need.store for s in materializer.states()] == ([STORE] if store == STORE else [])
    if store == FOLDER:
        assert "publish the store's feature_store.yaml" in fresh.message


def test_the_cluster_backends_read_online_features_only_with_jobs_and_a_router():
    """Cluster path (wiring): the kubernetes backend asks for fresh stores
    only when Jobs materialise them and router Pods read them."""
    assert _kubernetes_backend(True).reads_online_features
    assert not _kubernetes_backend(False).reads_online_features
    assert not _kubernetes_backend(True, router=None).reads_online_features


def test_the_operator_with_jobs_builds_a_materializer_that_runs_jobs_in_its_namespace():
    """Cluster path (wiring): KUBELOOP_MATERIALIZER=kubernetes on the
    kubernetes backend runs the Job run (no Feast imported here), in the
    namespace it is told; without one the configuration is refused."""
    from kubeloop.operator.settings import ConfigurationError, OperatorConfig
    from kubeloop.operator.wiring import build_materializer

    config = OperatorConfig.from_env({"KUBELOOP_MATERIALIZER": "kubernetes", "KUBELOOP_OPERATOR_NAMESPACE": NAMESPACE,
                                      "KUBELOOP_ROUTER_IMAGE": "kubeloop/runtime:1"})
    materializer = build_materializer(config, {"kubernetes": _kubernetes_backend(True)}, FakeObjects())
    try:
        assert isinstance(materializer._run, MaterializeJobs) and materializer._run.local is None
        assert materializer._run.settings.namespace == NAMESPACE
    finally:
        materializer.stop()
    with pytest.raises(ConfigurationError, match="KUBELOOP_OPERATOR_NAMESPACE"):
        OperatorConfig.from_env({"KUBELOOP_MATERIALIZER": "kubernetes"})
