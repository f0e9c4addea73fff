"""The real node: containerd, runc, the kubelet and kube-proxy run real Pods
beside KWOK's fake GPU fleet. Every test here proves the cluster path on a
real node (real processes in real namespaces), not the local backend.

One real node fits on a machine: the module starts its own platform with it
(the session's platform stays fake-only; a run that finds another run's real
node waits for it to go), and the last test takes it down and checks the host. KUBELOOP_REAL_NODE=0 turns these tests off (for a machine
where a developer keeps a real node of their own running)."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest

from kubeloop.api.constants import API_VERSION
from kubeloop.cli.demo import load_examples
from kubeloop.dev import host, kserve, node
from kubeloop.dev.binaries import binary, versions
from kubeloop.paths import repo_root
from kubeloop.dev.images import PYTHON_IMAGES, base_image, pause_image, python_image
from kubeloop.dev.pki import NODE_NAME
from kubeloop.dev.platform import NodeBusy, Platform
from kubeloop.serving.base import triton_name
from kubeloop.serving.builders.kserve import GRPC_PORT as KSERVE_GRPC_PORT, KSERVE_API, RUNTIME_API, STORAGE_CONTAINER
from kubeloop.serving.builders.workloads import GRPC_PORT
from tests.e2e.conftest import _delete_inference_services
from tests.support.conformance import assert_conforms, assert_grpc_conforms
from tests.support.models import N_FEATURES, register_broken, register_model, synthetic
from tests.support.operator import OperatorProcess
from tests.support.rollouts import rollout_of
from tests.support.stories import quick_optimisation, timed_steps
from tests.support.waiting import wait_for

CHART = Path(__file__).resolve().parents[2] / "charts" / "kubeloop"
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    os.environ.get("KUBELOOP_REAL_NODE") == "0", reason="the real node is turned off (KUBELOOP_REAL_NODE=0)")]


def sysctls() -> dict[str, str]:
    return {key: Path("/proc/sys", key).read_text().strip() for key in host.SYSCTLS
            if Path("/proc/sys", key).exists()}


class RealPlatform:
    """The module's platform with its real node, and what the host looked like before it."""

    def __init__(self, state_dir: Path):
        self.platform = Platform(state_dir, real_node=True)
        wait_for(self._up, timeout=900, interval=5, what="this machine's one real node to be free")
        self.kube = self.platform.kube()

    def _up(self) -> bool:
        """Up, or False while another test run's real node holds the machine."""
        # Read at each try: while another worker's node holds the host, the
        # sysctls are that node's, and its teardown puts the host's back. A
        # node killed without teardown (a run cut off) left its own values
        # set, and its claim holds the host's from before it: `up` puts those
        # back, so they are the host's.
        left = host.Claim.read()
        self.sysctls_before = dict(left.sysctls) if left else sysctls()
        try:
            self.platform.up()
            return True
        except NodeBusy:
            return False

    def namespace(self, labels: dict | None = None) -> str:
        name = f"r-{uuid.uuid4().hex[:8]}"
        self.kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}})
        # Pods are admitted once the namespace's default ServiceAccount exists.
        wait_for(lambda: self.kube.get("v1", "ServiceAccount", "default", name), timeout=30,
                 what=f"the default ServiceAccount of {name}")
        return name


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> RealPlatform:
    instance = RealPlatform(tmp_path_factory.mktemp("real"))
    try:
        yield instance
    finally:
        instance.kube.close()
        instance.platform.down()


def pod(name: str, namespace: str, image: str, command: list[str] | None = None, **spec) -> dict:
    container = {"name": "main", "image": image, "imagePullPolicy": "Never",
                 "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True,
                                     "capabilities": {"drop": ["ALL"]},
                                     "seccompProfile": {"type": "RuntimeDefault"}}}
    if command:
        container["command"] = command
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace,
                                                            "labels": {"app": name}},
            "spec": {"containers": [container], "terminationGracePeriodSeconds": 2, **spec}}


def running(kube, name: str, namespace: str, timeout: float = 60) -> dict:
    def probe():
        found = kube.get("v1", "Pod", name, namespace) or {}
        return found if found.get("status", {}).get("phase") == "Running" else None
    return wait_for(probe, timeout=timeout, what=f"Pod {name} Running")


def test_the_real_node_registers_and_is_ready(real):
    """Cluster path: the kubelet registered the node with its real runtime."""
    found = real.kube.get("v1", "Node", NODE_NAME)
    ready = {c["type"]: c["status"] for c in found["status"]["conditions"]}
    assert ready["Ready"] == "True"
    info = found["status"]["nodeInfo"]
    assert info["kubeletVersion"] == versions()["KUBERNETES_VERSION"]
    assert info["containerRuntimeVersion"].startswith("containerd://1.")
    assert found["metadata"]["labels"]["kubeloop.dev/node"] == "real"
    names = {n["metadata"]["name"] for n in real.kube.list("v1", "Node")}
    assert "cpu-1" not in names and "gpu-h100-mig-mixed" in names  # the real node replaces the fake CPU node
    assert real.platform.node_status()["ready"] is True


# The cluster loop comes first: its Pods (two training nodes of 500m, the optimiser's core, the
# predictors, the front, the monitoring Jobs) need most of the node's two cores, which the module's
# served versions (the `served` fixture, up to the module's end) would otherwise hold part of. The
# CI run that had it after them waited 30 minutes on an optimiser Pod the scheduler could not place.
@pytest.mark.timeout(2700)  # the story's own waits (scaled for a machine shared with Pods) should speak first
def test_the_whole_loop_closes_on_the_cluster_path_with_the_operator_as_the_charts_pod(real, tmp_path, monkeypatch):
    """Cluster path, end to end on the real node: the demo's story (`kubeloop
    demo --cluster`) with nothing on the host but the platform's servers. The
    operator is kubeloop's chart (helm) running the operator image in a Pod;
    Alertmanager and MLflow call it through its NodePort. The store is
    published (registry and sources in the object store, online store in
    Redis on the node's address). Each TrainingJob is a Kubeflow Trainer
    TrainJob on two nodes whose initializer joins the features; each
    OptimizedModel a Job; Jobs materialise the online store; KServe's
    controller runs each version's predictor from kubeloop's Triton image;
    callers send entity requests (card, merchant, amount, hour, channel)
    through kubeloop's front (a Pod), which reads the rest online and logs to
    the object store; drift checks are Jobs that read that log; Prometheus
    fires KubeloopDataDrift, Alertmanager calls the operator, the retrained
    challenger (a TrainJob again) is canaried through the front and promoted,
    and every answer then comes from it. While the retrain runs, the
    operator's Pod is deleted and the kubelet restarted, then a node Pod of
    the retrain's TrainJob is killed: the Deployment's next Pod takes over,
    JobSet runs the TrainJob again, and there is no second retrain, TrainJob,
    version or alias move."""
    from mlflow import MlflowClient

    from kubeloop.components.trainjob import TRAINER_API_VERSION
    from kubeloop.featurestore.publish import upload_sources
    from kubeloop.registry.mlflow import MlflowRegistry
    from kubeloop.registry.promotion import audit_trail
    from kubeloop.registry import tags
    from kubeloop.story.chart import ChartOperator
    from kubeloop.story.cluster import JOB_RESOURCES, Endpoints, client_env, on_the_real_node, prepare_cluster
    from kubeloop.story.loop import Loop, Timings, prepare

    started = time.monotonic()
    namespace = real.namespace()
    env = real.platform.env()
    for name, value in client_env(env).items():  # this process writes the published store, as the demo does
        monkeypatch.setenv(name, value)
    fresh_boto3_session(monkeypatch)
    path = prepare_cluster(real.platform, namespace, tmp_path / "featurestore")
    chart = ChartOperator(real.platform, namespace)
    # Drift checks and materialisations are Jobs here, each a Pod that imports Evidently or Feast: at the
    # local story's 15 s and 10 s one of each ran all the time on the node's two cores.
    timings = Timings(schedule="30s", materialize_every="30s")
    docs = on_the_real_node(quick_optimisation(prepare(load_examples(repo_root() / "examples"), namespace,
                                                       f"{namespace}-fraud", timings), retrain=False))
    registry = MlflowRegistry(env["MLFLOW_TRACKING_URI"])
    story = Loop(real.kube, registry, env, docs, path.repo, scale=2.0, reach=Endpoints(real.kube), entities=True,
                 publish=lambda: upload_sources(path.repo, path.sources))
    try:
        image = chart.install(path.settings)
        first = chart.wait_answering()
        assert first["spec"]["containers"][0]["image"] == image and first["spec"]["nodeName"] == NODE_NAME
        print(f"the store published and the chart's operator answering ({time.monotonic() - started:.0f} s)")
        for step in timed_steps(story):
            if step == story.retrain_started:
                at = time.monotonic()
                faults = _faults_while_the_retrain_runs(real, chart, first, story.facts["retrain_job"])
                second = faults["operator"]
                print(f"the operator's Pod {first['metadata']['name']} deleted and the kubelet restarted: "
                      f"{second['metadata']['name']} answers; the retrain's node Pod {faults['victim']} killed "
                      f"({time.monotonic() - at:.0f} s)")
        facts = story.facts
        name = story.service["metadata"]["name"]
        # Both versions trained in TrainJobs, two node Pods each, their lineage naming them; the store the
        # front reads is the published one. One TrainJob per TrainingJob, one retrain: the replaced
        # operator made no second.
        trainjobs = {f"{namespace}/{t['metadata']['name']}" for t in real.kube.list(TRAINER_API_VERSION, "TrainJob",
                                                                                   namespace)}
        assert len(trainjobs) == 2 == len(real.kube.list(API_VERSION, "TrainingJob", namespace)), trainjobs
        for version in (facts["trained"], facts["retrained"]):
            lineage = registry.get_version(story.model, version).tags
            assert lineage[tags.TRAINJOB] in trainjobs, (lineage.get(tags.TRAINJOB), trainjobs)
            assert "s3://" in lineage[tags.FEATURE_STORE] and str(path.repo) not in lineage[tags.FEATURE_STORE]
            trainjob = lineage[tags.TRAINJOB].split("/")[1]
            nodes = [p for p in real.kube.list("v1", "Pod", namespace, f"jobset.sigs.k8s.io/jobset-name={trainjob}")
                     if p["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"] == "node"]
            assert len({p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] for p in nodes}) == 2
        trained = [v for v in MlflowClient(env["MLFLOW_TRACKING_URI"]).search_model_versions(f"name = '{story.model}'")
                   if tags.TRAINJOB in v.tags]
        assert sorted(v.version for v in trained) == sorted([facts["trained"], facts["retrained"]])
        jobset = real.kube.get("jobset.x-k8s.io/v1alpha2", "JobSet", faults["trainjob"], namespace)
        assert jobset["status"].get("restarts", 0) >= 1, jobset["status"]  # the killed node's JobSet ran again
        assert f"{namespace}/{faults['trainjob']}" == registry.get_version(story.model, facts["retrained"]).tags[tags.TRAINJOB]
        # The optimisations ran as Jobs from the training image, owned by their OptimizedModels.
        optimizers = real.kube.list("batch/v1", "Job", namespace, "kubeloop.dev/owner-kind=optimizedmodel")
        assert optimizers and all(j["metadata"]["ownerReferences"][0]["kind"] == "OptimizedModel"
                                  and j["status"].get("succeeded") == 1 for j in optimizers)
        pod = real.kube.list("v1", "Pod", namespace, f"job-name={optimizers[0]['metadata']['name']}")[0]
        assert pod["spec"]["nodeName"] == NODE_NAME and pod["spec"]["containers"][0]["image"] == \
            path.settings["KUBELOOP_TRAINING_IMAGE"]
        winner = registry.get_version(story.model, facts["optimized"]).tags
        assert winner[tags.SOURCE] == f"{story.model}/{facts['trained']}" and winner[tags.TECHNIQUE]
        # The online store was kept by materialisation Jobs, and the front read it for every caller.
        materialized = real.kube.list("batch/v1", "Job", namespace, "kubeloop.dev/purpose=materialize")
        assert any(j.get("status", {}).get("succeeded") for j in materialized), materialized
        # The operator's own Jobs asked for what the chart's jobResources gave them (what the node holds).
        for purpose, jobs in (("materialize", materialized),
                              ("monitoring", real.kube.list("batch/v1", "Job", namespace, "kubeloop.dev/purpose=drift"))):
            assert jobs and {json.dumps(j["spec"]["template"]["spec"]["containers"][0]["resources"], sort_keys=True)
                             for j in jobs} == {json.dumps(JOB_RESOURCES[purpose], sort_keys=True)}, purpose
        assert facts["materialized"]
        # Served by KServe, through the front: the promoted version is the primary's predictor.
        primary = real.kube.get("serving.kserve.io/v1beta1", "InferenceService", f"{name}-primary", namespace)
        assert primary["spec"]["predictor"]["model"]["storageUri"] == f"models:/{story.model}/{facts['challenger']}"
        assert story.status("InferenceService")["url"] == f"http://{name}.{namespace}.svc.cluster.local"
        moves = [(e.action, e.version) for e in audit_trail(registry, story.model) if e.alias == "champion"]
        assert moves[-1] == ("promote", facts["challenger"]) and len(set(moves)) == len(moves), moves
        # The drift verdicts came from Jobs on the runtime image.
        jobs = real.kube.list("batch/v1", "Job", namespace, "kubeloop.dev/purpose=drift")
        assert jobs and all(j["spec"]["template"]["spec"]["containers"][0]["image"] == path.settings["KUBELOOP_ROUTER_IMAGE"]
                            for j in jobs)
        assert facts["drift"]["drifted"] and facts["drift"]["report"].startswith("runs:/")
        # The operator runs as the chart says (65532, read-only root), and nothing of the loop ran in its
        # Pod: no pipeline run, no drift report in its work folder.
        proc = operator_process(second["metadata"]["uid"])
        assert proc.uids().real == 65532
        root = next(line.split() for line in Path(f"/proc/{proc.pid}/mountinfo").read_text().splitlines()
                    if line.split()[4] == "/")
        assert "ro" in root[5].split(","), root
        work = Path(f"/proc/{proc.pid}/root/var/lib/kubeloop")
        assert not (work / "runs").exists() and not list(work.rglob("report.html")), sorted(work.rglob("*"))[:20]
        print(f"cluster path: drift injection -> promoted and serving: {facts['injection_to_promoted']:.0f} s")
    finally:
        story.stop()
        try:
            _delete_inference_services(real.kube, [namespace])
        finally:
            chart.uninstall()


def _faults_while_the_retrain_runs(real: RealPlatform, chart, operator_pod: dict, retrain: dict) -> dict:  # noqa: ANN001
    """The cluster faults, while the retrain's TrainingJob runs: the
    operator's Pod deleted and the kubelet restarted at once, then a node Pod
    of the retrain's TrainJob killed as soon as it runs. The next operator
    Pod, the TrainJob's name and the killed Pod's."""
    namespace, name = retrain["metadata"]["namespace"], retrain["metadata"]["name"]
    seen: dict[str, str] = {}
    """Each TrainJob Pod as last seen: a failed run's go with its Jobs."""

    def trainjob_pods(selector: str = "jobset.sigs.k8s.io/jobset-name") -> list[dict]:
        pods = real.kube.list("v1", "Pod", namespace, selector)
        seen.update((p["metadata"]["name"], _pod_state(p)) for p in pods)
        return pods

    real.kube.delete("v1", "Pod", operator_pod["metadata"]["name"], namespace)
    real.platform.restart_process("kubelet")

    def answering() -> dict | None:
        trainjob_pods()
        return chart.answering()

    operator = wait_for(answering, timeout=300, interval=1, what="the next operator Pod answering", seen=chart.seen)

    def training_node() -> dict | None:
        status = (real.kube.get(API_VERSION, "TrainingJob", name, namespace) or {}).get("status") or {}
        if not status.get("runId"):
            return None
        pods = trainjob_pods(f"jobset.sigs.k8s.io/jobset-name={status['runId'].split('/')[1]}")
        assert status.get("phase") not in ("Succeeded", "Failed"), (
            f"the retrain ended before a node could be lost: {status.get('phase')}: "
            f"{[c.get('message') for c in status.get('conditions', []) if c['type'] == 'RunSucceeded']}; "
            f"its Pods as last seen: {seen}")
        return next((p for p in pods if p["status"].get("phase") == "Running"
                     and p["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"] == "node"
                     and p["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index") == "1"), None)

    try:
        victim = wait_for(training_node, timeout=300, interval=0.5, what="a node Pod of the retrain's TrainJob running")
    except TimeoutError as exc:  # what the cluster held instead, for a failure that shows only in CI
        raise AssertionError(f"{exc}; its Pods as last seen: {seen}; "
                             f"{_what_the_namespace_held(real.kube, namespace, name)}") from None
    real.kube.delete("v1", "Pod", victim["metadata"]["name"], namespace)
    return {"operator": operator, "victim": victim["metadata"]["name"],
            "trainjob": victim["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"]}


def _pod_state(pod: dict) -> str:
    """A Pod's phase and each container's state, with why it ended and what it said last."""
    def state(container: dict) -> str:
        (what, detail), = container["state"].items() or [("unknown", {})]
        said = (detail.get("message") or "").strip().splitlines()[-1:]
        return (f"{container['name']} {what} {detail.get('reason') or ''} exit={detail.get('exitCode', '')} "
                f"restarts={container['restartCount']}{f' said: {said[0][:300]}' if said else ''}")

    status = pod["status"]
    containers = status.get("initContainerStatuses", []) + status.get("containerStatuses", [])
    return f"{status.get('phase')} {status.get('reason') or ''} [{'; '.join(state(c) for c in containers)}]"


def _what_the_namespace_held(kube, namespace: str, training_job: str) -> str:  # noqa: ANN001
    """A few lines for a CI log, which keeps only the head of a failure: the
    TrainingJob's phase and conditions that are not True, each unfinished
    Pod's phase and containers' states, and the last Warning events."""
    status = (kube.get(API_VERSION, "TrainingJob", training_job, namespace) or {}).get("status") or {}
    conditions = [f"{c['type']}={c['status']} {c.get('reason')}: {c.get('message', '')[:600]}"
                  for c in status.get("conditions", []) if c["status"] != "True"]

    pods = [f"{p['metadata']['name']} {_pod_state(p)}" for p in kube.list("v1", "Pod", namespace)
            if p["status"].get("phase") != "Succeeded"]
    run = (status.get("runId") or "/").split("/")[1] or "train-"
    warnings = sorted((e for e in kube.list("v1", "Event", namespace)
                       if e.get("type") == "Warning" or e["involvedObject"]["name"].startswith(run)),
                      key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")[-20:]
    events = [f"{e['involvedObject']['kind']}/{e['involvedObject']['name']} {e['reason']}: {e['message'][:160]}"
              for e in warnings]
    return (f"TrainingJob {training_job}: phase {status.get('phase')}, run {status.get('runId')}, "
            f"not True: {conditions}\nPods not Succeeded:\n  " + "\n  ".join(pods)
            + "\nthe last Warning events and the run's:\n  " + "\n  ".join(events))


def test_a_cpu_pod_runs_on_the_real_node_and_a_mig_pod_on_the_fake_h100(real):
    """Cluster path: the scheduler puts CPU work on the real node (a real
    process in a real sandbox) and a MIG request on KWOK's H100."""
    namespace = real.namespace()
    image = pause_image().ref
    created = time.monotonic()
    real.kube.create(pod("cpu", namespace, image))
    cpu = running(real.kube, "cpu", namespace)
    print(f"pod create -> Running: {time.monotonic() - created:.2f} s")
    assert cpu["spec"]["nodeName"] == NODE_NAME
    assert cpu["status"]["podIP"].startswith("10.244.128.")
    container = cpu["status"]["containerStatuses"][0]
    assert container["state"]["running"] and container["containerID"].startswith("containerd://")
    mig = pod("mig", namespace, "example.invalid/cuda:1")
    mig["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    mig["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-1g.10gb": 1}}
    real.kube.create(mig)
    assert running(real.kube, "mig", namespace)["spec"]["nodeName"] == "gpu-h100-mig-mixed"


def test_a_deployment_answers_through_its_service(real):
    """Cluster path: real Pods from a Deployment serve HTTP; kube-proxy's rules
    carry a request to them through the Service's NodePort on the host's
    loopback, and from another Pod through its ClusterIP and its name, which
    the cluster DNS (CoreDNS behind kube-dns) resolves; a name outside the
    cluster resolves to nothing."""
    namespace = real.namespace()
    image = base_image()
    real.platform.import_image(image)
    server = pod("web", namespace, image.ref, ["python3", "-m", "http.server", "8080"])["spec"]
    server["containers"][0]["readinessProbe"] = {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1}
    real.kube.create({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": namespace},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": server}}})
    service = real.kube.create({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": namespace},
        "spec": {"type": "NodePort", "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}})
    wait_for(lambda: (real.kube.get("apps/v1", "Deployment", "web", namespace) or {})
             .get("status", {}).get("availableReplicas") == 2, timeout=90, what="2 web replicas available")
    node_port = service["spec"]["ports"][0]["nodePort"]
    response = wait_for(lambda: _get(f"http://127.0.0.1:{node_port}/"), timeout=30, what="the NodePort answering")
    assert response.status_code == 200 and "Directory listing" in response.text

    cluster_ip = service["spec"]["clusterIP"]
    client = pod("client", namespace, image.ref, ["python3", "-c", CLIENT.format(
        cluster_ip=cluster_ip, namespace=namespace)], restartPolicy="Never")
    real.kube.create(client)
    phase = wait_for(lambda: (real.kube.get("v1", "Pod", "client", namespace) or {}).get("status", {})
                     .get("phase") in ("Succeeded", "Failed") and real.kube.get("v1", "Pod", "client", namespace),
                     timeout=60, what="the client Pod finishing")
    assert phase["status"]["phase"] == "Succeeded", (phase["status"], pod_log(real, namespace, "client"))


def pod_log(real: RealPlatform, namespace: str, name: str) -> str:
    return subprocess.run([str(binary("kubectl")), f"--kubeconfig={real.platform.kubeconfig}", "-n", namespace,
                           "logs", name], capture_output=True, text=True).stdout


CLIENT = """
import socket, urllib.request
for url in ("http://{cluster_ip}/", "http://web/", "http://web.{namespace}.svc.cluster.local/"):
    assert b"Directory listing" in urllib.request.urlopen(url, timeout=10).read(), url
assert socket.gethostbyname("web") == "{cluster_ip}"
assert socket.gethostbyname("kubernetes.default") == "10.96.0.1"
try:
    found = socket.gethostbyname("example.com")
except socket.gaierror:
    found = None
assert found is None, found
print("resolved")
"""


def _get(url: str):
    import requests

    try:
        return requests.get(url, timeout=3)
    except requests.RequestException:
        return None


@pytest.mark.parametrize("address", ["10.244.77.7", "10.99.250.250"], ids=["pod-range", "service-range"])
def test_traffic_to_an_address_without_endpoint_goes_nowhere(real, address):
    """Cluster path: the Pod and Service ranges are blackholed on the host, so
    a packet for an address nothing answers is dropped here instead of
    following the default route out of the machine."""
    route = subprocess.run(["ip", "route", "get", address], capture_output=True, text=True)
    assert route.returncode != 0 or route.stdout.startswith("blackhole"), route.stdout
    with socket.socket() as sock:
        sock.settimeout(5)
        with pytest.raises(OSError) as failure:
            sock.connect((address, 80))
    assert failure.value.errno in (errno.EINVAL, errno.ENETUNREACH, errno.EHOSTUNREACH), failure.value


# A python-backend model that doubles its input: enough to show the image's
# tritonserver, its python backend stub and the serving environment's numpy work.
DOUBLE_CONFIG = """
name: "double"
backend: "python"
max_batch_size: 0
input [{ name: "X", data_type: TYPE_FP32, dims: [ 2 ] }]
output [{ name: "Y", data_type: TYPE_FP32, dims: [ 2 ] }]
instance_group [{ kind: KIND_CPU, count: 1 }]
"""
DOUBLE_MODEL = """
import os
import re
import site

site.addsitedir(os.environ["KUBELOOP_SITE_PACKAGES"])
import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", (pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 2).astype(np.float32))]) for r in requests]
"""


def test_a_triton_pod_from_the_local_image_answers_v2_inference_through_its_service(real):
    """Cluster path: tritonserver from kubeloop's Triton image (the
    nvidia-pytriton wheel with the serving environment, built here) runs in a
    non-root Pod on the real node, loads a python-backend model from a
    ConfigMap, and answers a v2 inference request through its Service's
    NodePort on the host's loopback."""
    image = python_image(PYTHON_IMAGES["triton"], [sys.executable, "-m", "pip"])
    real.platform.import_image(image)
    namespace = real.namespace()
    real.kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "double", "namespace": namespace},
                      "data": {"config.pbtxt": DOUBLE_CONFIG, "model.py": DOUBLE_MODEL}})
    server = pod("triton", namespace, image.ref)
    container = server["spec"]["containers"][0]
    container["args"] = ["tritonserver", "--model-repository=/models", "--model-control-mode=explicit",
                         "--load-model=double", "--exit-on-error=false", "--http-port=8000", "--grpc-port=8001",
                         "--metrics-port=8002"]
    container["readinessProbe"] = {"httpGet": {"path": "/v2/models/double/ready", "port": 8000}, "periodSeconds": 1}
    container["volumeMounts"] = [{"name": "models", "mountPath": "/models/double"}]
    server["spec"]["volumes"] = [{"name": "models", "configMap": {"name": "double", "items": [
        {"key": "config.pbtxt", "path": "config.pbtxt"}, {"key": "model.py", "path": "1/model.py"}]}}]
    real.kube.create(server)
    service = real.kube.create({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "triton", "namespace": namespace},
        "spec": {"type": "NodePort", "selector": {"app": "triton"}, "ports": [{"port": 8000, "targetPort": 8000}]}})
    wait_for(lambda: any(c["type"] == "Ready" and c["status"] == "True" for c in
                         (real.kube.get("v1", "Pod", "triton", namespace) or {}).get("status", {}).get("conditions", [])),
             timeout=120, what="Triton Ready with the model loaded")
    url = f"http://127.0.0.1:{service['spec']['ports'][0]['nodePort']}"
    import requests

    body = {"inputs": [{"name": "X", "shape": [2], "datatype": "FP32", "data": [1.5, -2.0]}]}
    answer = wait_for(lambda: _post(requests, f"{url}/v2/models/double/infer", body), timeout=30,
                      what="the inference answered through the Service")
    assert answer["outputs"][0]["data"] == [3.0, -4.0]
    assert requests.get(f"{url}/v2", timeout=5).json()["name"] == "triton"


def _post(requests, url: str, body: dict) -> dict | None:
    try:
        response = requests.post(url, json=body, timeout=10)
    except requests.RequestException:
        return None
    return response.json() if response.status_code == 200 else None


def serving_operator(real: RealPlatform, namespace: str, log_dir: Path, front: bool = False,
                     kubeconfig: Path | None = None, **extra: str) -> OperatorProcess:
    """The operator on the host with the kubernetes serving backend (Pods on
    the real node, from kubeloop's own runtime and Triton images) and the
    local one (tritonserver processes here), both on the platform's MLflow;
    front: with the router (runtime image) in front of the Triton Pods."""
    pip = [sys.executable, "-m", "pip"]
    runtime, triton = (python_image(PYTHON_IMAGES[name], pip) for name in ("runtime", "triton"))
    for image in (runtime, triton, base_image()):
        real.platform.import_image(image)
    env = {**({"KUBELOOP_ROUTER_IMAGE": runtime.ref} if front else {}),"KUBELOOP_REGISTRY": "mlflow", "MLFLOW_TRACKING_URI": real.platform.env()["MLFLOW_TRACKING_URI"],
           "KUBELOOP_PIPELINE_BACKENDS": "noop", "KUBELOOP_PIPELINE_BACKEND": "noop",
           "KUBELOOP_SERVING_BACKENDS": "kubernetes,local", "KUBELOOP_SERVING_BACKEND": "kubernetes",
           "KUBELOOP_TRITON_IMAGE": triton.ref, "KUBELOOP_TRITON_BACKEND": "python",
           "KUBELOOP_COMPONENTS_IMAGE": runtime.ref, "KUBELOOP_RESYNC_SECONDS": "2",
           "KUBELOOP_WORK_DIR": str(log_dir / "work"), **extra}
    op = OperatorProcess(kubeconfig or real.platform.kubeconfig, log_dir, env, [namespace]).start()
    op.wait_for_log("Initial authentication has finished", timeout=60)
    return op


def inference_service(namespace: str, name: str, model: str, **spec) -> dict:
    return {"apiVersion": API_VERSION, "kind": "InferenceService", "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": {"name": model, "alias": "champion"}, **spec}}


def isvc_status(kube, namespace: str, name: str) -> dict:
    return (kube.get(API_VERSION, "InferenceService", name, namespace) or {}).get("status") or {}


def v2_body(rows: list[list[float]]) -> dict:
    return {"inputs": [{"name": "features", "shape": [len(rows), len(rows[0])], "datatype": "FP32", "data": rows}]}


def infer_from_a_pod(real: RealPlatform, namespace: str, url: str, body: dict) -> dict:
    """POST body to url from a Pod on the real node (Service addresses are
    reachable only from Pods); the answer comes back as its termination message."""
    import json

    return client_pod_answer(real, namespace, INFER_CLIENT, [url, json.dumps(body)])


def client_pod_answer(real: RealPlatform, namespace: str, script: str, args: list[str], timeout: float = 90):
    """Run a Python client script in a Pod on the real node; what it wrote
    to its termination message, as JSON."""
    import json

    name = f"client-{uuid.uuid4().hex[:6]}"
    real.kube.create(pod(name, namespace, base_image().ref, ["python3", "-c", script, *args], restartPolicy="Never"))
    done = wait_for(lambda: (p := real.kube.get("v1", "Pod", name, namespace)) and
                    p["status"].get("phase") in ("Succeeded", "Failed") and p, timeout=timeout, what="the client Pod")
    terminated = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert done["status"]["phase"] == "Succeeded", terminated
    return json.loads(terminated["message"])


# Retries while kube-proxy has not yet programmed the Service's rules.
INFER_CLIENT = """
import sys, time, urllib.request
for attempt in range(20):
    try:
        request = urllib.request.Request(sys.argv[1], sys.argv[2].encode(), {"Content-Type": "application/json"})
        answer = urllib.request.urlopen(request, timeout=10).read()
        break
    except OSError:
        if attempt == 19:
            raise
        time.sleep(0.5)
open("/dev/termination-log", "wb").write(answer)
"""


class Served:
    """A registered fraud version served by the operator twice: on the real
    node (kubernetes backend) and by the local backend."""

    def __init__(self, real: RealPlatform, log_dir: Path):
        from mlflow import MlflowClient

        self.real = real
        self.namespace = real.namespace()
        uri = real.platform.env()["MLFLOW_TRACKING_URI"]
        model = f"{self.namespace}-fraud"
        self.version = register_model(uri, model, seed=1)
        MlflowClient(uri).set_registered_model_alias(model, "champion", self.version)
        self.triton_model = triton_name(model)
        self.operator = serving_operator(real, self.namespace, log_dir)
        created = time.monotonic()
        real.kube.create(inference_service(self.namespace, "fraud", model, resources={"cpu": "500m", "memory": "1Gi"}))
        real.kube.create(inference_service(self.namespace, "fraud-local", model, backend="local"))
        self.status = wait_for(lambda: (s := self.isvc_status()).get("phase") == "Ready" and s,
                               timeout=300, interval=0.5, what="the InferenceService Ready on the cluster")
        self.create_to_ready = time.monotonic() - created
        print(f"InferenceService create -> Ready (Triton Deployment available): {self.create_to_ready:.1f} s")

    def isvc_status(self, name: str = "fraud") -> dict:
        return (self.real.kube.get(API_VERSION, "InferenceService", name, self.namespace) or {}).get("status") or {}

    def pods(self) -> list[dict]:
        return self.real.kube.list("v1", "Pod", self.namespace, "kubeloop.dev/inferenceservice=fraud")

    def infer_on_the_cluster(self, rows: list[list[float]]) -> dict:
        service = self.real.kube.get("v1", "Service", "fraud", self.namespace)
        url = f"http://{service['spec']['clusterIP']}/v2/models/{self.triton_model}/infer"
        return infer_from_a_pod(self.real, self.namespace, url, v2_body(rows))

    def close(self) -> None:
        """Delete the InferenceServices (the operator stops the local Triton)
        and stop the operator; a no-op the second time."""
        if not self.operator.running():
            return
        try:
            _delete_inference_services(self.real.kube, [self.namespace])
        finally:
            self.operator.stop()


@pytest.fixture(scope="module")
def served(real, tmp_path_factory) -> Served:
    instance = Served(real, tmp_path_factory.mktemp("served"))
    try:
        yield instance
    finally:
        instance.close()


def test_the_operator_serves_a_registered_version_from_kubeloops_images_on_the_real_node(real, served):
    """Cluster path, compared with the local path: the operator's kubernetes
    serving backend turns an InferenceService into a Triton Deployment on the
    real node; its init container (kubeloop's runtime image) fetches the
    registered fraud version from MLflow and lays out a python-backend
    repository, tritonserver (kubeloop's Triton image) loads it, and a v2
    request through the Service answers with the probabilities the local
    backend's tritonserver gives for the same rows."""
    import numpy as np
    import requests

    deployment = real.kube.get("apps/v1", "Deployment", "fraud-predictor", served.namespace)
    assert deployment["status"]["availableReplicas"] == 1
    pods = served.pods()
    assert [p["spec"]["nodeName"] for p in pods] == [NODE_NAME]
    puller = pods[0]["status"]["initContainerStatuses"][0]["state"]["terminated"]
    assert puller["reason"] == "Completed"
    ready = next(c for c in pods[0]["status"]["conditions"] if c["type"] == "Ready")
    print(f"serving Pod create -> Ready: {_seconds(pods[0]['metadata']['creationTimestamp'], ready['lastTransitionTime'])}"
          f" s, of which the model puller ran {_seconds(puller['startedAt'], puller['finishedAt'])} s (1 s resolution)")
    assert served.status["modelVersion"] == served.version

    rows = [[round(float(v), 4) for v in row] for row in synthetic(rows=4, seed=7)[0]]
    cluster = served.infer_on_the_cluster(rows)
    local_url = wait_for(lambda: (s := served.isvc_status("fraud-local")).get("phase") == "Ready" and s["url"],
                         timeout=120, what="the local InferenceService Ready")
    local = _post(requests, f"{local_url}/v2/models/{served.triton_model}/infer", v2_body(rows))
    assert cluster["model_version"] == served.version and cluster["outputs"][0]["name"] == "probability"
    assert cluster["outputs"][0]["shape"] == [4, 1]
    np.testing.assert_allclose(cluster["outputs"][0]["data"], local["outputs"][0]["data"], rtol=1e-5, atol=1e-6)
    assert len(set(cluster["outputs"][0]["data"])) == 4  # four different rows, four answers


# 2,000 keyed requests through the front; the answers' roles and the
# router's count of mirrored copies come back as the termination message.
KEYED_CLIENT = """
import collections, json, re, sys, time, urllib.request
url, model, body, n = sys.argv[1], sys.argv[2], sys.argv[3].encode(), int(sys.argv[4])
roles, failed = collections.Counter(), 0
for i in range(n):
    request = urllib.request.Request(f"{url}/v2/models/{model}/infer", body,
                                     {"Content-Type": "application/json", "X-Request-Key": f"caller-{i}"})
    for attempt in range(20):
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                roles[answer.headers["X-Model-Role"]] += 1
            break
        except OSError:
            time.sleep(0.5)
    else:
        failed += 1
time.sleep(1)
metrics = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
mirrored = sum(float(m) for m in re.findall(r'kubeloop_inference_requests_total{[^}]*role="shadow"[^}]*} ([0-9.e+]+)',
                                            metrics))
open("/dev/termination-log", "w").write(json.dumps({"roles": roles, "failed": failed, "mirrored": mirrored}))
"""


@pytest.mark.parametrize("backend", ["kubernetes", "kserve"])
def test_the_front_splits_mirrors_and_logs_and_a_drift_job_reads_the_log_on_the_real_node(real, tmp_path, backend):
    """Cluster path, on the real node, for both cluster backends: with a
    router image the kubernetes backend puts kubeloop's serving front (the
    runtime image) in front of one Triton Deployment per version; the kserve
    backend puts it in front of one KServe InferenceService per version,
    which KServe's real controller (v0.20, running as a Pod on the node)
    turns into predictor Deployments, its webhook injecting kubeloop's
    storage initializer. 2,000 keyed requests from a Pod through the
    InferenceService's Service: the 20% canary answers 20% +- 3% of them, every
    answer comes from the primary or the canary (the shadow never answers a
    caller), and the router mirrored 10% +- 3% to the shadow; status.traffic
    says so. Before: one Service over every Triton Pod, so one canary replica
    beside one primary took 50%, and the shadow got nothing.
    The router's Pod logs every answer to the platform's object store
    (SeaweedFS, through the Secret by reference). With kserve (the run under
    the chart's identity; drift Jobs do not depend on the serving backend)
    the drift check runs as a Job on the runtime image that reads that log and the served version's
    reference (the training sample its run logged to MLflow, fetched through
    MLflow's artifact proxy from inside the Pod), runs Evidently and logs its
    report to MLflow: the operator reports the drift of the 2,000 rows.
    NVIDIA's tritonclient then gets from the router Pod what it gets from
    the Triton Pod that answered, in every encoding, over HTTP and over gRPC
    (status.grpcAddress; tests.support.conformance)."""
    import json

    import boto3
    from mlflow import MlflowClient

    from kubeloop.story.cluster import Endpoints

    namespace = real.namespace()
    env = real.platform.env()
    uri = env["MLFLOW_TRACKING_URI"]
    model = f"{namespace}-front"
    primary, canary, shadow = (register_model(uri, model, seed=seed) for seed in (1, 2, 3))
    registry = MlflowClient(uri)
    registry.set_registered_model_alias(model, "champion", primary)
    registry.set_registered_model_alias(model, "challenger", canary)
    real.kube.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "request-log", "namespace": namespace},
                      "stringData": {k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}})
    identity = None
    if backend == "kserve":
        kserve.install(real.platform)
        # Cluster-wide, and left by the module's cluster loop: the chart's identity must create it again.
        real.kube.delete(RUNTIME_API, "ClusterStorageContainer", STORAGE_CONTAINER)
        identity = charts_identity(real, namespace, tmp_path, "--set", "serving.backend=kserve")
    started = time.time() - 1
    operator = serving_operator(real, namespace, tmp_path, front=True, KUBELOOP_DRIFT_MONITOR="kubernetes",
                                kubeconfig=identity[1] if identity else None,
                                KUBELOOP_SERVING_BACKENDS=f"{backend},local", KUBELOOP_SERVING_BACKEND=backend,
                                KUBELOOP_REQUEST_LOG=env["KUBELOOP_REQUEST_LOG"],
                                KUBELOOP_OBJECT_STORE_SECRET="request-log",
                                KUBELOOP_OBJECT_STORE_ENDPOINT=env["AWS_ENDPOINT_URL_S3"])
    try:
        drift_job = backend == "kserve"
        monitoring = {"monitoring": {"schedule": "10s", "window": "1h", "minRows": 1000}} if drift_job else {}
        real.kube.create(inference_service(namespace, "front", model, resources={"cpu": "200m", "memory": "512Mi"},
                                           canary={"alias": "challenger", "percent": 20},
                                           shadow={"version": shadow, "percent": 10}, **monitoring))
        status = wait_for(lambda: (s := isvc_status(real.kube, namespace, "front")).get("phase") == "Ready"
                          and any(c["type"] == "CanaryReady" and c["status"] == "True" for c in s["conditions"])
                          and s, timeout=420, interval=1, what="the front and its three versions Ready")
        assert status["traffic"] == [{"role": "primary", "version": primary, "percent": 80},
                                     {"role": "canary", "version": canary, "percent": 20},
                                     {"role": "shadow", "version": shadow, "percent": 10}]
        roles = sorted(p["metadata"]["labels"]["kubeloop.dev/role"] for p in real.kube.list(
            "v1", "Pod", namespace, "kubeloop.dev/inferenceservice=front"))
        assert roles == ["canary", "primary", "router", "shadow"]
        if backend == "kserve":
            assert_served_by_kserve(real, namespace, "front")
        service = real.kube.get("v1", "Service", "front", namespace)
        rows = [[0.1 * i for i in range(N_FEATURES)]]
        name = f"keyed-{uuid.uuid4().hex[:6]}"
        real.kube.create(pod(name, namespace, base_image().ref,
                             ["python3", "-c", KEYED_CLIENT, f"http://{service['spec']['clusterIP']}",
                              triton_name(model), json.dumps(v2_body(rows)), "2000"], restartPolicy="Never"))
        done = wait_for(lambda: (p := real.kube.get("v1", "Pod", name, namespace)) and
                        p["status"].get("phase") in ("Succeeded", "Failed") and p, timeout=300,
                        what="2,000 keyed requests")
        terminated = done["status"]["containerStatuses"][0]["state"]["terminated"]
        assert done["status"]["phase"] == "Succeeded", terminated
        result = json.loads(terminated["message"])
        print(f"front on the real node: {result}")
        assert result["failed"] == 0 and set(result["roles"]) == {"primary", "canary"}
        assert abs(result["roles"]["canary"] / 2000 - 0.20) <= 0.03, result
        assert abs(result["mirrored"] / 2000 - 0.10) <= 0.03, result

        # The platform's Prometheus scrapes the router and Triton Pods on the real node.
        assert prometheus_sum(env, 'kubeloop_inference_requests_total{job="kubernetes-pods",pod=~"front-router-.*",'
                                   'role!="shadow"}', at_least=2000) >= 2000
        assert prometheus_sum(env, 'nv_inference_request_success{job="kubernetes-pods",inferenceservice="front"}',
                              at_least=2000) >= 2000

        prefix = f"{namespace}-front/"
        s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL_S3"], region_name=env["AWS_DEFAULT_REGION"],
                          aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])

        def keys() -> list[str]:
            return [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket="requests", Prefix=prefix)
                    for o in page.get("Contents", [])]

        def answered(found: list[str]) -> int:
            return sum(json.loads(line)["role"] in ("primary", "canary") for key in found
                       for line in s3.get_object(Bucket="requests", Key=key)["Body"].read().decode().splitlines())

        found = wait_for(lambda: (k := keys()) and answered(k) >= 2000 and k, timeout=60,
                         what="2,000 answered requests in the object store")
        assert answered(found) == 2000
        assert all(re.fullmatch(rf"{prefix}dt=\d{{4}}-\d\d-\d\d/hour=\d\d/[^/]+\.jsonl", key) for key in found), found
        if drift_job:
            drift = wait_for(lambda: (d := isvc_status(real.kube, namespace, "front").get("drift") or {})
                             .get("rows") == 2000 and "share" in d and d, timeout=180, interval=2,
                             what="a drift Job evaluating the 2,000 logged rows")
            # One constant row sent 2,000 times is nothing like the training data:
            # Evidently in the Job, against the reference the version's training
            # run logged to MLflow, flags every feature.
            assert drift["drifted"] is True and drift["share"] == 1.0 and "message" not in drift, drift
            assert drift["report"].startswith("runs:/"), drift
            jobs = real.kube.list("batch/v1", "Job", namespace, "kubeloop.dev/purpose=drift")
            assert jobs and all(j["spec"]["template"]["spec"]["containers"][0]["image"]
                                .startswith("localhost/kubeloop/runtime") for j in jobs)
            print(f"drift Jobs: {[j['metadata']['name'] for j in jobs]}; latest: {drift}")
        # NVIDIA's client, every encoding, gets from the router Pod what it gets from the Triton behind it
        # (last: its requests are logged too).
        reach = Endpoints(real.kube)
        routes = next(json.loads(c["data"]["router.json"]) for c in real.kube.list("v1", "ConfigMap", namespace)
                      if "router.json" in c.get("data", {}))
        rows = synthetic(rows=4, seed=3)[0]
        conformed = assert_conforms(reach(status["url"]), model,
                                   lambda version: (reach(routes["version_urls"][version]), routes["triton_model"]),
                                   rows, routes["output"])
        # And over gRPC, from the router Pod (status.grpcAddress) and from Triton's own gRPC port in its Pod.
        triton_grpc = KSERVE_GRPC_PORT if backend == "kserve" else GRPC_PORT
        conformed += assert_grpc_conforms(
            reach.address(status["grpcAddress"], "grpc"), model,
            lambda version: (f"{reach.address(urlsplit(routes['version_urls'][version]).hostname).split(':')[0]}:"
                             f"{triton_grpc}", routes["triton_model"]), rows, routes["output"])
        assert set(conformed) <= {primary, canary}

        if identity:
            assert_least_privilege(real, identity[0], started, "kserve", "kserve_cluster", needed=KSERVE_CREATES)
    finally:
        _delete_inference_services(real.kube, [namespace])
        operator.stop()


# Keyed requests of varied rows for a number of seconds, ~rate a second;
# the answers counted by the version that gave them.
STEADY_CLIENT = """
import collections, json, random, sys, time, urllib.request, uuid
url, model, seconds, rate, width = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
versions, failed, end = collections.Counter(), 0, time.monotonic() + seconds
while time.monotonic() < end:
    rows = [[random.gauss(0, 1) for _ in range(width)] for _ in range(4)]
    body = json.dumps({"inputs": [{"name": "features", "shape": [4, width], "datatype": "FP32", "data": rows}]})
    request = urllib.request.Request(f"{url}/v2/models/{model}/infer", body.encode(),
                                     {"Content-Type": "application/json", "X-Request-Key": uuid.uuid4().hex})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            versions[answer.headers["X-Model-Version"]] += 1
    except OSError:
        failed += 1
    time.sleep(1 / rate)
open("/dev/termination-log", "w").write(json.dumps({"versions": versions, "failed": failed}))
"""


def steady_traffic(real: RealPlatform, namespace: str, service: str, model: str, seconds: int) -> str:
    """A Pod sending keyed requests through the service for `seconds`; its name."""
    url = f"http://{real.kube.get('v1', 'Service', service, namespace)['spec']['clusterIP']}"
    name = f"steady-{uuid.uuid4().hex[:6]}"
    real.kube.create(pod(name, namespace, base_image().ref, ["python3", "-c", STEADY_CLIENT, url, triton_name(model),
                                                             str(seconds), "30", str(N_FEATURES)],
                         restartPolicy="Never"))
    return name


@pytest.mark.timeout(1200)
def test_rollouts_through_router_pods_promote_a_good_challenger_and_abort_a_contrary_one_on_the_real_node(
        real, tmp_path):
    """Cluster path (kserve backend, router Pods on the real node, the
    platform's Prometheus scraping them): a challenger as good as the
    champion steps 20% -> 50% on what the routers measured (requests, 5xx,
    p99, paired disagreement) and is promoted, the alias moved; a challenger
    that decides the opposite on almost every request is aborted at its first
    step by the paired-disagreement guardrail, every request goes back to the
    champion and the alias stays."""
    import json

    from mlflow import MlflowClient

    namespace, env = real.namespace(), real.platform.env()
    uri = env["MLFLOW_TRACKING_URI"]
    model = f"{namespace}-rollout"
    champion, good = (register_model(uri, model, seed=seed) for seed in (1, 2))
    contrary = register_model(uri, model, seed=3, contrary=True)
    registry = MlflowClient(uri)
    registry.set_registered_model_alias(model, "champion", champion)
    registry.set_registered_model_alias(model, "challenger", good)
    real.kube.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "request-log", "namespace": namespace},
                      "stringData": {k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}})
    kserve.install(real.platform)
    operator = serving_operator(real, namespace, tmp_path, front=True, KUBELOOP_SERVING_BACKENDS="kserve,local",
                                KUBELOOP_SERVING_BACKEND="kserve", KUBELOOP_REQUEST_LOG=env["KUBELOOP_REQUEST_LOG"],
                                KUBELOOP_OBJECT_STORE_SECRET="request-log",
                                KUBELOOP_OBJECT_STORE_ENDPOINT=env["AWS_ENDPOINT_URL_S3"],
                                KUBELOOP_PROMETHEUS_URL=env["PROMETHEUS_URL"])
    rollout = {"steps": [{"weight": 20, "duration": "20s"}, {"weight": 50, "duration": "20s"}],
               "analysis": {"minRequests": 60, "maxLatencyRatio": 4.0, "latencyTolerance": "100ms",
                            "maxDisagreement": 0.3}}
    try:
        real.kube.create(inference_service(namespace, "canaried", model, resources={"cpu": "200m", "memory": "512Mi"},
                                           canary={"alias": "challenger", "percent": 20}, rollout=rollout))
        wait_for(lambda: (s := isvc_status(real.kube, namespace, "canaried")).get("phase") == "Ready"
                 and any(c["type"] == "CanaryReady" and c["status"] == "True" for c in s["conditions"]),
                 timeout=420, interval=1, what="the front and both versions Ready")
        assert_served_by_kserve(real, namespace, "canaried", roles=("primary", "canary"))
        client = steady_traffic(real, namespace, "canaried", model, seconds=420)
        promoted = rollout_of(real.kube, namespace, "canaried", good, timeout=300)
        print(f"rollout of version {good}: {promoted}")
        assert promoted["phase"] == "Promoted", promoted
        assert promoted["analysis"]["verdict"] == "Pass" and promoted["analysis"]["requests"] >= 60
        assert registry.get_model_version_by_alias(model, "champion").version == good

        registry.set_registered_model_alias(model, "challenger", contrary)
        aborted = rollout_of(real.kube, namespace, "canaried", contrary, timeout=300)
        print(f"rollout of version {contrary}: {aborted}")
        assert aborted["phase"] == "Aborted" and aborted["step"] == 0 and aborted["weight"] == 0, aborted
        assert aborted["analysis"]["disagreement"] > 0.3 and "decided differently" in aborted["message"]
        assert registry.get_model_version_by_alias(model, "champion").version == good
        status = wait_for(lambda: (s := isvc_status(real.kube, namespace, "canaried"))["traffic"] == [
            {"role": "primary", "version": good, "percent": 100}] and s, timeout=60, what="all traffic back")
        healthy = next(c for c in status["conditions"] if c["type"] == "RolloutHealthy")
        assert healthy["status"] == "False" and healthy["reason"] == "Aborted"
        # The router takes the new routes up when the kubelet refreshes its ConfigMap volume.
        url = f"http://{real.kube.get('v1', 'Service', 'canaried', namespace)['spec']['clusterIP']}"
        aborted_at = time.monotonic()
        wait_for(lambda: {json.loads(a["body"])["model_version"] for a in answers_from_a_pod(
            real, namespace, f"{url}/v2/models/{triton_name(model)}/infer",
            [v2_body([[0.1 * i for i in range(N_FEATURES)]])] * 8)} == {good}, timeout=120, interval=1,
            what=f"every answer from version {good} again")
        print(f"abort -> every answer from the champion: {time.monotonic() - aborted_at:.0f} s")
        real.kube.delete("v1", "Pod", client, namespace)
    finally:
        _delete_inference_services(real.kube, [namespace])
        operator.stop()


def recent_through_the_router(real: RealPlatform, namespace: str, name: str, registry, model: str, version: str,
                              repo: Path) -> tuple:
    """The service's inference URL as Pods call it, recent transactions and
    their offline vectors (tests.support.entities)."""
    from kubeloop.api.signature import ModelSignature
    from tests.support.entities import recent_with_offline_vectors

    signature = ModelSignature.from_tags(registry.get_model_version(model, version).tags)
    sent, vectors = recent_with_offline_vectors(repo, signature)
    assert len(sent) >= 16, f"only {len(sent)} of 32 transactions have fresh features"
    service = real.kube.get("v1", "Service", name, namespace)
    return f"http://{service['spec']['clusterIP']}/v2/models/{triton_name(model)}/infer", sent, vectors


def test_materialisation_jobs_keep_a_published_online_store_fresh_for_router_pods_on_the_real_node(
        real, tmp_path, monkeypatch):
    """Cluster path (kubernetes backend, operator with
    KUBELOOP_MATERIALIZER=kubernetes; router Pods and materialisation Jobs
    from the runtime image, on the real node): the fraud model's store is
    published (feature_store.yaml text with its registry and its Parquet
    sources in the platform's object store, its online store in the
    platform's Redis on the node's address) and never materialised by hand.
    A Job in the operator's namespace materialises it (the Secret by
    reference), FeaturesFresh turns True, and an entity request answers with
    the probability the offline vector gets. A card the store never saw is
    refused (422) until its rows reach the sources: the next scheduled Job
    carries them online, with no manual step. The operator's /metrics shows
    each view's lag. The entity request (card, merchant, amount, hour and
    channel only) answers each row of its own (not one answer repeated),
    through a router Pod from the runtime image; the refusal names the card
    and says it is not in the online store. (A store recorded as a repository
    folder stays out of the Pod: unit-tested.)"""
    import json

    import numpy as np
    import pandas as pd
    import requests
    from mlflow import MlflowClient

    from kubeloop.featurestore.generate import Scenario, default_start
    from kubeloop.featurestore.job import serve_s3_through_pyarrow
    from kubeloop.featurestore.store import StoreLocation, create_repository
    from kubeloop.featurestore.freshness import store_key
    from kubeloop.processes import free_port
    from kubeloop.registry.tags import FEATURE_STORE
    from tests.e2e.test_feature_freshness import NEW_CARD, NEW_MERCHANT, add_row
    from tests.support.entities import entity_request, raw_request
    from tests.support.models import register_fraud_model
    from kubeloop.featurestore.publish import publish_sources, upload_sources

    namespace = real.namespace()  # the operator's namespace too: its Jobs run here
    env = real.platform.env()
    for name, value in env.items():  # this process reads the registry and the sources from the object store too
        if name.startswith(("AWS_", "FEAST_")):
            monkeypatch.setenv(name, value)
    fresh_boto3_session(monkeypatch)
    serve_s3_through_pyarrow()
    uri = env["MLFLOW_TRACKING_URI"]
    repo = create_repository(tmp_path / "repo", Scenario(start=default_start(21), days=21, seed=5),
                             redis_address=real.platform.start_redis(),
                             registry=f"s3://feast/{namespace}/registry.db")
    model = f"{namespace}-fresh"
    version = register_fraud_model(uri, model, repo, tmp_path / "train")
    sources = f"s3://feast/{namespace}/data"
    publish_sources(repo, sources, env["AWS_ENDPOINT_URL_S3"])
    store = StoreLocation(config=(repo / "feature_store.yaml").read_text()).to_json()
    registry = MlflowClient(uri)
    registry.set_model_version_tag(model, version, FEATURE_STORE, store)
    registry.set_registered_model_alias(model, "champion", version)
    real.kube.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "object-store", "namespace": namespace},
                      "stringData": {k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}})
    token, port = tmp_path / "webhook-token", free_port()
    token.write_text("t0ken")
    operator = serving_operator(real, namespace, tmp_path, front=True, KUBELOOP_OBJECT_STORE_SECRET="object-store",
                                KUBELOOP_OBJECT_STORE_ENDPOINT=env["AWS_ENDPOINT_URL_S3"],
                                KUBELOOP_MATERIALIZER="kubernetes", KUBELOOP_OPERATOR_NAMESPACE=namespace,
                                KUBELOOP_WEBHOOK_PORT=str(port), KUBELOOP_WEBHOOK_TOKEN_FILE=str(token))

    def fresh() -> dict:
        status = isvc_status(real.kube, namespace, "fresh")
        return next((c for c in status.get("conditions", []) if c["type"] == "FeaturesFresh"), {})

    def jobs() -> list[dict]:
        return real.kube.list("batch/v1", "Job", namespace, "kubeloop.dev/purpose=materialize")

    try:
        real.kube.create(inference_service(namespace, "fresh", model, resources={"cpu": "200m", "memory": "512Mi"},
                                           features={"missing": "reject", "materializeEvery": "10s"}))
        condition = wait_for(lambda: (c := fresh()).get("status") == "True" and c, timeout=420, interval=1,
                             what="FeaturesFresh True (a materialisation Job ran)")
        assert condition["reason"] == "Materialized" and "every 10s" in condition["message"], condition
        done = [j for j in jobs() if j.get("status", {}).get("succeeded")]
        assert done, jobs()
        pod = done[0]["spec"]["template"]["spec"]
        assert pod["containers"][0]["image"].startswith("localhost/kubeloop/runtime")
        assert pod["containers"][0]["envFrom"] == [{"secretRef": {"name": "object-store"}}]
        assert pod["automountServiceAccountToken"] is False
        print("materialisation Jobs (start -> completion): "
              f"{[_seconds(j['status']['startTime'], j['status']['completionTime']) for j in done]} s")
        wait_for(lambda: isvc_status(real.kube, namespace, "fresh").get("phase") == "Ready", timeout=420,
                 interval=1, what="the InferenceService Ready")

        url, sent, vectors = recent_through_the_router(real, namespace, "fresh", registry, model, version, repo)
        newcomer = entity_request(pd.DataFrame([{"card_id": NEW_CARD, "merchant_id": NEW_MERCHANT, "amount": 42.5,
                                                 "hour": 13, "channel": "online"}]))
        by_entities, by_vector, refused = answers_from_a_pod(real, namespace, url, [
            entity_request(sent), raw_request(vectors), newcomer])
        assert by_entities["status"] == 200 and by_vector["status"] == 200, (by_entities, by_vector)
        served = np.array(json.loads(by_entities["body"])["outputs"][0]["data"], dtype=np.float64).ravel()
        expected = np.array(json.loads(by_vector["body"])["outputs"][0]["data"], dtype=np.float64).ravel()
        assert len(served) == len(sent) and len(set(np.round(served, 6))) > 1
        np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-6)
        assert refused["status"] == 422 and f"card_id={NEW_CARD} is not in the online store" in refused["body"], refused
        router = next(p for p in real.kube.list("v1", "Pod", namespace, "kubeloop.dev/inferenceservice=fresh")
                      if p["metadata"]["labels"]["kubeloop.dev/role"] == "router")
        assert router["spec"]["containers"][0]["image"].startswith("localhost/kubeloop/runtime")

        # The newcomer's rows reach the sources, timed a little ahead so that no
        # Job ends past them before they are uploaded (Feast's window starts
        # where the last run ended).
        at = pd.Timestamp.now(tz="UTC") + pd.Timedelta(seconds=15)
        for source, key, value in (("card_activity", "card_id", NEW_CARD), ("card_profile", "card_id", NEW_CARD),
                                   ("merchant_risk", "merchant_id", NEW_MERCHANT)):
            add_row(repo, source, key, value, at)
        upload_sources(repo, sources)
        uploaded = time.monotonic()
        answer = wait_for(lambda: (a := answers_from_a_pod(real, namespace, url, [newcomer])[0])["status"] == 200
                          and a, timeout=180, interval=2, what="the new card served after the next scheduled Job")
        print(f"new rows servable through the router Pod {time.monotonic() - uploaded:.1f} s after their upload "
              f"(materializeEvery 10s, rows timed 15 s ahead)")
        assert 0.0 <= json.loads(answer["body"])["outputs"][0]["data"][0] <= 1.0
        assert len(jobs()) <= 3  # older finished Jobs go when the next starts

        metrics = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        label = store_key(store)
        for view in ("card_activity", "card_profile", "merchant_risk"):
            lag = re.search(rf'kubeloop_online_features_lag_seconds{{[^}}]*store="{label}"[^}}]*view="{view}"[^}}]*}} '
                            r"([0-9.e+]+|\+Inf)", metrics)
            # A Job's window ends when it starts, and the operator records its end when it next looks: with
            # the suite's other tests on the two cores a Job took 23 s, and the lag read 60 s once.
            assert lag and float(lag.group(1)) < 90, (view, lag and lag.group(0))
    finally:
        _delete_inference_services(real.kube, [namespace])
        operator.stop()


POOLED_SERVICES = 50
POOL_HOLDS = 12
"""Models each member's budget holds (python backend: about 60 MiB for the
first, 28 MiB for each one after, as tests/e2e/test_serving_pools.py measures)."""
POOL_BUDGET_MIB = (60.0 + 28.0 * (POOL_HOLDS - 1)) / 0.9 + 14.0

# Every service once, shuffled, four callers at once (both members load at
# once; their budgets hold half the services, so the second half unloads
# the first); answers compared with the expected probabilities; then the
# pool's own account of itself (its /pool and counters).
POOL_CLIENT = """
import json, random, re, sys, time, urllib.request
from concurrent.futures import ThreadPoolExecutor
url, names, body, expected = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3].encode(), json.loads(sys.argv[4])
rng = random.Random(7)
order = rng.sample(names, len(names))

def call(name):
    started = time.monotonic()
    for attempt in range(10):
        try:
            request = urllib.request.Request(f"{url}/v2/models/{name}/infer", body, {"Content-Type": "application/json"})
            got = json.loads(urllib.request.urlopen(request, timeout=300).read())["outputs"][0]["data"]
            break
        except OSError:
            time.sleep(1)
    else:
        return name, None, 0.0
    right = len(got) == len(expected) and all(abs(a - b) <= 1e-4 for a, b in zip(got, expected))
    return name, right, time.monotonic() - started

answers = list(ThreadPoolExecutor(4).map(call, order))
pool = json.loads(urllib.request.urlopen(url + "/pool", timeout=10).read())
metrics = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
counts = {k: sum(float(v) for v in re.findall("kubeloop_pool_" + k + "_total[{][^}]*[}] ([0-9.e+]+)", metrics))
          for k in ("loads", "unloads", "hits", "failed")}
members = {m: {"used": v["usedMiB"], "budget": v["budgetMiB"], "models": len(v["models"])}
           for m, v in pool["members"].items()}
open("/dev/termination-log", "w").write(json.dumps({
    "requests": len(order), "wrong": [n for n, right, _ in answers if right is False][:10],
    "failed": sum(right is None for _, right, _ in answers), "slowest": max(s for *_, s in answers),
    "counts": counts, "members": members}))
"""


def expected_probabilities(uri: str, model: str, version: str, rows: list[list[float]]) -> list[float]:
    """What the registered version's ONNX export answers for the rows, run here."""
    import mlflow
    import numpy as np
    import onnxruntime as ort
    from mlflow import MlflowClient

    run_id = MlflowClient(uri).get_model_version(model, version).run_id
    path = mlflow.artifacts.download_artifacts(f"runs:/{run_id}/exported/model.onnx", tracking_uri=uri)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: np.array(rows, dtype=np.float32)})[0].reshape(-1).tolist()


def assert_pool_pod_conforms(real: RealPlatform, namespace: str, name: str, pod_ip: str, version: str,
                             asked_at: str | None = None) -> None:
    """NVIDIA's clients see the pool's front as they see the member of the
    Pod at pod_ip that holds the service's model, reached at the Pod's
    address from this host: every HTTP encoding and gRPC case of the
    conformance test (tests/support/conformance.py) gets the same tensors,
    refusals and statistics' form. The front asked is the service's (its
    Service's addresses), or the one of the pool Pod at asked_at."""
    import requests
    from kubeloop.serving.builders.pools import MEMBER_PORT, pool_name, route_shard, routes_name
    from kubeloop.serving.builders.workloads import ROUTER_GRPC_PORT, ROUTER_PORT
    from kubeloop.story.cluster import Endpoints

    key = f"{namespace}.{name}.json"
    routes = real.kube.get("v1", "ConfigMap", routes_name("shared", route_shard(key)), namespace)["data"]
    route = json.loads(routes[key])
    model = route["triton_model"]

    def holder(offset: int, scheme: str):  # noqa: ANN202
        def find(_version: str) -> tuple[str, str]:
            for port in (MEMBER_PORT, MEMBER_PORT + 10):
                ready = f"http://{pod_ip}:{port}/v2/models/{model}/ready"
                if requests.get(ready, timeout=10).status_code == 200:
                    return f"{scheme}{pod_ip}:{port + offset}", model
            raise AssertionError(f"no member of the pool Pod holds {model}")
        return find

    reach, status = Endpoints(real.kube), isvc_status(real.kube, namespace, name)
    if asked_at:
        url, grpc_address = f"http://{asked_at}:{ROUTER_PORT}", f"{asked_at}:{ROUTER_GRPC_PORT}"
    else:
        url, grpc_address = reach(status["url"]), reach.address(status["grpcAddress"], "grpc")
    rows = synthetic(rows=3, seed=11)[0]
    answered = assert_conforms(url, f"{namespace}.{name}", holder(0, "http://"), rows, route["output"])
    answered += assert_grpc_conforms(grpc_address, f"{namespace}.{name}", holder(1, ""), rows, route["output"])
    assert set(answered) == {version}, answered
    assert pool_name("shared") in status["url"]


@pytest.mark.timeout(1200)
def test_a_pool_pod_serves_fifty_inference_services_within_its_members_budgets_on_the_real_node(real, tmp_path):
    """Cluster path (kubernetes backend, the real node): fifty
    InferenceServices name one pool of two Triton members whose budgets hold
    twelve models each, one of them on the kserve backend (served by the
    same pool: KServe's Standard mode has one model per predictor). The
    operator runs one pool Pod for them all (front,
    members, repository container) instead of fifty Deployments; every
    service is Ready once the pool's front answers its model ready, and its
    status names the pool's Service. Traffic to every service, four callers
    at once, gets the registered version's own answers; models are
    loaded on first request and unloaded to make room (counted), and each
    member's memory, sampled on this host from the Pod's processes, stays
    within its budget; tritonclient (HTTP and gRPC, every encoding) gets
    the same answers through the pool Pod's front as from its member. The
    last service to leave takes the pool with it."""
    from kubeloop.front.memory import server_on_port
    from kubeloop.serving.builders.pools import MEMBER_PORT, pool_name
    from mlflow import MlflowClient
    from tests.support.poolmemory import MemorySampler

    namespace, env = real.namespace(), real.platform.env()
    uri = env["MLFLOW_TRACKING_URI"]
    model = f"{namespace}-pooled"
    version = register_model(uri, model, seed=4)
    MlflowClient(uri).set_registered_model_alias(model, "champion", version)
    pools = {"shared": {"members": 2, "memoryMiB": POOL_BUDGET_MIB}}
    kserve.install(real.platform)
    # The chart's RBAC for pools (a Role in its release's namespace, where the pool runs), released into
    # the services' namespace.
    user, kubeconfig = charts_identity(real, namespace, tmp_path, "--set", "serving.backend=kserve",
                                       "--set", "serving.routerImage=set", "--set-json", f"serving.pools={json.dumps(pools)}",
                                       release_namespace=namespace)
    since = time.time() - 1
    operator = serving_operator(real, namespace, tmp_path, front=True, kubeconfig=kubeconfig,
                                KUBELOOP_SERVING_POOLS=json.dumps(pools),
                                KUBELOOP_OPERATOR_NAMESPACE=namespace, KUBELOOP_RESYNC_SECONDS="10",
                                KUBELOOP_SERVING_BACKENDS="kubernetes,kserve,local")
    names = [f"pooled-{i:02d}" for i in range(POOLED_SERVICES)]
    try:
        created = time.monotonic()
        for name in names:  # the last on the kserve backend: the same pool serves it
            backend = {"backend": "kserve"} if name == names[-1] else {}
            real.kube.create(inference_service(namespace, name, model, pool="shared", **backend))
        wait_for(lambda: all(isvc_status(real.kube, namespace, n).get("phase") == "Ready" for n in names),
                 timeout=600, interval=2, what=f"{POOLED_SERVICES} pooled InferenceServices Ready")
        print(f"{POOLED_SERVICES} pooled InferenceServices create -> Ready: {time.monotonic() - created:.0f} s")
        urls = {isvc_status(real.kube, namespace, n)["url"] for n in names}
        assert urls == {f"http://{pool_name('shared')}.{namespace}.svc.cluster.local"}, urls
        deployments = real.kube.list("apps/v1", "Deployment", namespace)
        assert [d["metadata"]["name"] for d in deployments] == [pool_name("shared")]
        assert real.kube.list(KSERVE_API, "InferenceService", namespace) == []
        members = {f"member-{i}": server_on_port(MEMBER_PORT + 10 * i) for i in range(2)}
        assert all(members.values()), f"the pool Pod's tritonservers: {members}"
        rows = [[round(float(v), 4) for v in row] for row in synthetic(rows=3, seed=11)[0]]
        expected = expected_probabilities(uri, model, version, rows)
        service = real.kube.get("v1", "Service", pool_name("shared"), namespace)
        with MemorySampler(members) as memory:
            report = client_pod_answer(real, namespace, POOL_CLIENT, [
                f"http://{service['spec']['clusterIP']}", json.dumps([f"{namespace}.{n}" for n in names]),
                json.dumps(v2_body(rows)), json.dumps(expected)], timeout=900)
        print(f"pool on the real node: {report}; members' peaks over their empty selves "
              f"{ {m: round(v) for m, v in memory.peak.items()} } MiB (empty: "
              f"{ {m: round(v) for m, v in memory.empty.items()} } MiB), budget {POOL_BUDGET_MIB:.0f} MiB")
        assert report["failed"] == 0 and report["wrong"] == [], report
        counts = report["counts"]
        assert counts["loads"] >= POOLED_SERVICES and counts["unloads"] >= POOLED_SERVICES - 2 * POOL_HOLDS, counts
        assert counts["failed"] == 0 and counts["loads"] + counts["hits"] >= report["requests"], counts
        assert all(m["models"] <= POOL_HOLDS + 1 and m["used"] <= m["budget"] for m in report["members"].values())
        for member, peak in memory.peak.items():
            assert peak <= POOL_BUDGET_MIB, f"{member} peaked at {peak:.0f} MiB, budget {POOL_BUDGET_MIB:.0f}"
        pods = real.kube.list("v1", "Pod", namespace, "kubeloop.dev/pool=shared")
        assert [c.get("restartCount", 0) for p in pods for c in p["status"]["containerStatuses"]] == [0] * 4
        # The fifty routes are spread over shards the Pod sees as one folder.
        shards = real.kube.list("v1", "ConfigMap", namespace, "kubeloop.dev/pool=shared,kubeloop.dev/pool-part=routes")
        assert len(shards) > 10 and sum(len(cm.get("data") or {}) for cm in shards) == POOLED_SERVICES
        assert_pool_pod_conforms(real, namespace, names[0], pods[0]["status"]["podIP"], version)
    finally:
        _delete_inference_services(real.kube, [namespace])
        operator.stop()
    assert real.kube.get("apps/v1", "Deployment", pool_name("shared"), namespace) is None
    assert real.kube.list("v1", "ConfigMap", namespace, "kubeloop.dev/pool=shared") == []
    pool_objects = frozenset((group, resource, verb) for group, resource in (
        ("apps", "deployments"), ("", "services"), ("", "configmaps")) for verb in ("create", "delete"))
    assert_least_privilege(real, user, since, "kserve", "kserve_cluster", "pools",
                           needed=pool_objects | {("", "pods/proxy", "get")})



# Requests to the services in turn, each on a new connection, until told to
# stop (a POST to the client's port 8080) or a while at most; what was
# answered and what failed (with the second it failed at).
ROLL_CLIENT = """
import http.server, json, sys, threading, time, urllib.request
url, names, body, seconds = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3].encode(), float(sys.argv[4])
stop = threading.Event()

class Stop(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        stop.set()
        self.send_response(200)
        self.end_headers()

threading.Thread(target=http.server.HTTPServer(("0.0.0.0", 8080), Stop).serve_forever, daemon=True).start()
started = time.monotonic()
answered, failures, i = 0, [], 0
while not stop.is_set() and time.monotonic() - started < seconds:
    name = names[i % len(names)]
    i += 1
    try:
        request = urllib.request.Request(f"{url}/v2/models/{name}/infer", body, {"Content-Type": "application/json"})
        json.loads(urllib.request.urlopen(request, timeout=60).read())["outputs"][0]["data"]
        answered += 1
    except Exception as exc:
        failures.append(f"{time.monotonic() - started:.1f} s {name}: {exc}"[:200])
    time.sleep(0.05)
open("/dev/termination-log", "w").write(json.dumps({"answered": answered, "failed": len(failures),
                                                     "failures": failures[:5], "stopped": stop.is_set()}))
"""
ROLL_CLIENT_SECONDS = 180


@pytest.mark.timeout(900)
def test_a_pool_of_two_pods_keeps_answering_while_a_new_size_rolls_them_on_the_real_node(real, tmp_path):
    """Cluster path (kubernetes backend, the real node): a pool sized with
    two replicas serves four InferenceServices from two Pods, each a whole
    pool (front, repository container, one Triton member), and each Pod's
    front answers every service with the registered version's answer, each
    model loaded on one Pod only: its owner's among the Pods the pool's
    headless Service resolves to (the other Pod's front sends it on); a
    hot model gets a copy on the Pod that sent its requests on. A drift
    Job reads a pooled service's rows of the log the fronts write to the
    object store, and an outcome Job joins the labels a team delivers to
    the object store to them (live quality). A canary that cannot load is rolled back (the model held,
    or idle: then loaded without it), and a rollout over both Pods is
    promoted on what their fronts measured (Prometheus scraping each). A
    new size (the operator started again with another spreadAt) rolls the
    Pods, a new one first: it is Ready only once its front has taken up
    every route, and an old one keeps serving while it leaves the Service's
    endpoints. A client Pod calling the services through the pool's Service
    all along gets every request answered, and no service leaves Ready.
    (The pool's single Pod used to be recreated: a new size was an outage.)"""
    import requests
    import threading
    from concurrent.futures import ThreadPoolExecutor
    from kubeloop.front.peers import owner
    from kubeloop.serving.builders.pools import peers_name, pool_name
    from kubeloop.serving.builders.workloads import ROUTER_PORT
    from mlflow import MlflowClient

    namespace, env = real.namespace(), real.platform.env()
    uri = env["MLFLOW_TRACKING_URI"]
    model = f"{namespace}-rolled"
    version = register_model(uri, model, seed=5)
    MlflowClient(uri).set_registered_model_alias(model, "champion", version)

    real.kube.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "request-log", "namespace": namespace},
                      "stringData": {k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}})

    def operator_with(spread_at: int, log: str) -> OperatorProcess:
        pools = {"shared": {"members": 1, "memoryMiB": 400, "replicas": 2, "spreadAt": spread_at}}
        return serving_operator(real, namespace, tmp_path / log, front=True, KUBELOOP_SERVING_POOLS=json.dumps(pools),
                                KUBELOOP_OPERATOR_NAMESPACE=namespace, KUBELOOP_RESYNC_SECONDS="10",
                                KUBELOOP_PROMETHEUS_URL=env["PROMETHEUS_URL"], KUBELOOP_DRIFT_MONITOR="kubernetes",
                                KUBELOOP_REQUEST_LOG=env["KUBELOOP_REQUEST_LOG"],
                                KUBELOOP_OBJECT_STORE_SECRET="request-log",
                                KUBELOOP_OBJECT_STORE_ENDPOINT=env["AWS_ENDPOINT_URL_S3"])

    def pool_pods() -> list[dict]:
        return real.kube.list("v1", "Pod", namespace, "kubeloop.dev/pool=shared")

    names = [f"rolled-{i}" for i in range(4)]
    models = [f"{namespace}.{n}" for n in names]
    rows = [[round(float(v), 4) for v in row] for row in synthetic(rows=3, seed=11)[0]]
    expected = expected_probabilities(uri, model, version, rows)
    operator = operator_with(4, "first")
    try:
        for name in names:
            real.kube.create(inference_service(namespace, name, model, pool="shared"))
        wait_for(lambda: all(isvc_status(real.kube, namespace, n).get("phase") == "Ready" for n in names),
                 timeout=300, interval=2, what="the pooled InferenceServices Ready")
        before = pool_pods()
        assert len(before) == 2, [p["metadata"]["name"] for p in before]
        fronts = [f"http://{pod['status']['podIP']}:{ROUTER_PORT}" for pod in before]
        peers = {f"{pod['status']['podIP']}:{ROUTER_PORT}" for pod in before}
        wait_for(lambda: all(set(requests.get(f"{f}/pool", timeout=10).json()["peers"]) == peers for f in fronts),
                 timeout=60, interval=1, what="each pool Pod's front finding both Pods through the headless Service")
        for front in fronts:
            for served in models:
                answer = requests.post(f"{front}/v2/models/{served}/infer", json=v2_body(rows), timeout=120)
                assert answer.status_code == 200, (front, served, answer.text)
                got = answer.json()["outputs"][0]["data"]
                assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) <= 1e-4, (front, served)
        # Each model was asked of both Pods and loaded on one: its owner's.
        held = {f"{urlsplit(f).hostname}:{ROUTER_PORT}": [m for member in requests.get(f"{f}/pool", timeout=10).json()[
            "members"].values() for m in member["models"]] for f in fronts}
        assert sorted(m for found in held.values() for m in found) == sorted(models), held
        assert all(owner(m, peers) == pod for pod, found in held.items() for m in found), held
        # What sending a request on costs: a loaded model asked of its owner, then of the other Pod.
        warm = models[1]
        at_owner = next(f for f in fronts if warm in held[f"{urlsplit(f).hostname}:{ROUTER_PORT}"])
        timings = {}
        for label, front in (("owner", at_owner), ("sent on", next(f for f in fronts if f != at_owner))):
            took = []
            for _ in range(40):
                began = time.perf_counter()
                assert requests.post(f"{front}/v2/models/{warm}/infer", json=v2_body(rows), timeout=60).ok
                took.append(time.perf_counter() - began)
            timings[label] = sorted(took)[len(took) // 2] * 1000
        print("a loaded model's request, p50 of 40 from the host: " + ", ".join(
            f"{label} {ms:.2f} ms" for label, ms in timings.items()))
        # NVIDIA's clients, every encoding and gRPC, asking the Pod that does not hold a model: each call
        # (inference, metadata, config, statistics, readiness) is sent on and answered as its owner's member
        # answers it, and none loads a copy there.
        conformed = models[2]
        holder_ip = next(urlsplit(f).hostname for f in fronts if conformed in held[f"{urlsplit(f).hostname}:{ROUTER_PORT}"])
        asked_ip = next(urlsplit(f).hostname for f in fronts if urlsplit(f).hostname != holder_ip)
        assert_pool_pod_conforms(real, namespace, names[2], holder_ip, version, asked_at=asked_ip)
        assert not any(conformed in member["models"] for member in requests.get(
            f"http://{asked_ip}:{ROUTER_PORT}/pool", timeout=10).json()["members"].values())
        # A hot model (eight callers at once at the Pod that sends it on; spreadAt 4, one member a Pod)
        # gets a copy on that Pod, which then serves it itself.
        hot = models[0]
        sender = next(f for f in fronts if hot not in held[f"{urlsplit(f).hostname}:{ROUTER_PORT}"])
        copied = threading.Event()

        def call_hot() -> int:
            calls = 0
            while not copied.is_set() and calls < 2000:
                answer = requests.post(f"{sender}/v2/models/{hot}/infer", json=v2_body(rows), timeout=120)
                assert answer.status_code == 200, answer.text
                calls += 1
            return calls

        with ThreadPoolExecutor(8) as callers:
            began = time.monotonic()
            calling = [callers.submit(call_hot) for _ in range(8)]
            try:
                wait_for(lambda: any(hot in member["models"] for member in requests.get(
                    f"{sender}/pool", timeout=10).json()["members"].values()), timeout=120, interval=0.5,
                         what="a copy of the hot model on the Pod that sent its requests on")
            finally:
                copied.set()
            print(f"hot model copied to the sending Pod after {sum(c.result() for c in calling)} requests "
                  f"({time.monotonic() - began:.1f} s)")
        asked = _monitoring_asked_of_the_pools_log(real, namespace, names[3], fronts, rows)
        _a_canary_that_cannot_load_is_rolled_back(real, namespace, names[0], fronts, model, version, rows)
        _a_rollout_is_judged_on_what_both_pods_measured(real, namespace, names, fronts, model)
        _drift_reported(real, namespace, names[3], asked)
        _outcomes_reported(real, namespace, names[3], version, asked)
        operator.stop()
        service = real.kube.get("v1", "Service", pool_name("shared"), namespace)
        with ThreadPoolExecutor(1) as calls:
            client = calls.submit(client_pod_answer, real, namespace, ROLL_CLIENT, [
                f"http://{service['spec']['clusterIP']}", json.dumps(models), json.dumps(v2_body(rows)),
                str(ROLL_CLIENT_SECONDS)], timeout=ROLL_CLIENT_SECONDS + 120)
            caller = wait_for(lambda: next((p for p in real.kube.list("v1", "Pod", namespace)
                                            if p["metadata"]["name"].startswith("client-")
                                            and p["status"].get("phase") == "Running"), None),
                              timeout=60, what="the client calling")
            calling = time.monotonic()
            operator = operator_with(3, "second")
            old, left_ready = {p["metadata"]["name"] for p in before}, set()

            def rolled() -> bool:
                left_ready.update(n for n in names if isvc_status(real.kube, namespace, n).get("phase") != "Ready")
                pods = pool_pods()
                return len(pods) == 2 and not old & {p["metadata"]["name"] for p in pods} and all(
                    _serving_pod(p) for p in pods)

            wait_for(rolled, timeout=ROLL_CLIENT_SECONDS, interval=1, what="the pool's Pods rolled")
            roll_seconds = time.monotonic() - calling
            requests.post(f"http://{caller['status']['podIP']}:8080/stop", timeout=10)
            report = client.result()
        print(f"pool of two Pods rolled in {roll_seconds:.0f} s while a client called it: {report}")
        assert report["stopped"], "the roll must end while the client still calls"
        assert report["failed"] == 0 and report["answered"] >= 100, report
        assert left_ready == set(), f"services that left Ready during the roll: {sorted(left_ready)}"
    finally:
        _delete_inference_services(real.kube, [namespace])
        operator.stop()
    assert real.kube.get("apps/v1", "Deployment", pool_name("shared"), namespace) is None
    assert real.kube.get("v1", "Service", peers_name("shared"), namespace) is None


def _a_canary_that_cannot_load_is_rolled_back(real: RealPlatform, namespace: str, name: str, fronts: list[str],
                                              model: str, version: str, rows: list[list[float]]) -> None:
    """A pooled service's canary version Triton cannot load (its model held
    on both Pods): each Pod's front fails the reload and keeps serving the
    champion, the operator (asking each Pod through the API server's proxy)
    rolls the canary back, and taking the canary out makes it Ready again.
    The same canary given to a service whose model no Pod holds: its first
    requests load the champion without it (the front reads the model's
    config from its Pod's repository volume) and every caller gets the
    champion's answer while the canary is rolled back."""
    import requests
    from mlflow import MlflowClient

    uri = real.platform.env()["MLFLOW_TRACKING_URI"]
    broken = register_broken(uri, model)
    MlflowClient(uri).set_registered_model_alias(model, "challenger", broken)

    asked = time.monotonic()
    change_spec(real.kube, namespace, name, canary={"alias": "challenger", "percent": 20})
    wait_for(lambda: isvc_status(real.kube, namespace, name).get("rolledBackVersion") == broken, timeout=180,
             interval=1, what="the pooled canary that cannot load rolled back")
    print(f"pooled canary that cannot load rolled back {time.monotonic() - asked:.0f} s after it was asked")

    def champion_everywhere() -> bool:
        answers = [requests.post(f"{front}/v2/models/{namespace}.{name}/infer", json=v2_body(rows), timeout=60,
                                 headers={"X-Request-Key": f"k{i}"}) for front in fronts for i in range(20)]
        return all(a.status_code == 200 and a.headers["X-Model-Version"] == version for a in answers)

    wait_for(champion_everywhere, timeout=60, interval=1, what="every Pod answering with the champion alone")
    change_spec(real.kube, namespace, name, canary=None)
    wait_for(lambda: isvc_status(real.kube, namespace, name).get("phase") == "Ready", timeout=60, interval=1,
             what="the service Ready again without its canary")

    idle, created = f"{name}-idle", time.monotonic()
    real.kube.create(inference_service(namespace, idle, model, pool="shared",
                                       canary={"alias": "challenger", "percent": 50}))
    wait_for(lambda: (s := isvc_status(real.kube, namespace, idle)).get("canaryVersion") == broken
             and s.get("phase") == "Ready", timeout=120, interval=1,
             what="the idle service Ready with its canary (not loaded yet) on both Pods")
    answers = [requests.post(f"{front}/v2/models/{namespace}.{idle}/infer", json=v2_body(rows), timeout=120,
                             headers={"X-Request-Key": f"idle-{i}"}) for front in fronts for i in range(20)]
    assert {(a.status_code, a.headers.get("X-Model-Version")) for a in answers} == {(200, version)}, \
        [a.text for a in answers if not a.ok][:3]
    wait_for(lambda: isvc_status(real.kube, namespace, idle).get("rolledBackVersion") == broken, timeout=120,
             interval=1, what="the idle service's broken canary rolled back")
    print(f"a pooled service whose model no Pod held: its canary that cannot load rolled back "
          f"{time.monotonic() - created:.0f} s after it was created, every caller answered by the champion")
    real.kube.delete(API_VERSION, "InferenceService", idle, namespace)
    wait_for(lambda: real.kube.get(API_VERSION, "InferenceService", idle, namespace) is None, timeout=60, interval=1,
             what="the idle service deleted")


OUTCOME_REQUESTS = 40


def _monitoring_asked_of_the_pools_log(real: RealPlatform, namespace: str, name: str, fronts: list[str],
                                       rows: list[list[float]]) -> float:
    """Three rows sent again and again to a pooled service through both
    Pods (a request sent on is logged by the owner's front), the last
    OUTCOME_REQUESTS of them with their rows' labels delivered as a team's
    label pipeline would (Parquet in the object store), and once the object
    store holds the rows, its drift and its outcomes checked once (the
    schedules an hour): when they were asked. The Jobs run while the test
    goes on (_drift_reported and _outcomes_reported read their verdicts)."""
    import io

    import boto3
    import pyarrow as pa
    import pyarrow.parquet as pq
    import requests

    keys = [f"drift-{front}-{i}" for front in range(len(fronts)) for i in range(50)]
    for i, key in enumerate(keys):
        answer = requests.post(f"{fronts[i // 50]}/v2/models/{namespace}.{name}/infer", json=v2_body(rows),
                               timeout=60, headers={"X-Request-Key": key})
        assert answer.status_code == 200, answer.text
    labelled = keys[-OUTCOME_REQUESTS:]
    labels = pa.table({"request_id": [key for key in labelled for _ in rows],
                       "row": pa.array([row for _ in labelled for row in range(len(rows))], pa.int32()),
                       "label": pa.array([(i + row) % 2 for i in range(len(labelled)) for row in range(len(rows))], pa.int64()),
                       "label_timestamp": pa.array([time.time()] * (len(labelled) * len(rows)), pa.float64())})
    parquet = io.BytesIO()
    pq.write_table(labels, parquet)
    env = real.platform.env()
    s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL_S3"], region_name=env["AWS_DEFAULT_REGION"],
                      aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])

    def logged_rows() -> int:
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket="requests", Prefix=f"{namespace}-{name}/")
        return sum(len(json.loads(line)["features"]) for page in pages for o in page.get("Contents", [])
                   for line in s3.get_object(Bucket="requests", Key=o["Key"])["Body"].read().decode().splitlines())

    wait_for(lambda: logged_rows() >= 300, timeout=60, interval=1, what="the pool's fronts' log in the object store",
             seen=lambda: f"{logged_rows()} rows")
    s3.put_object(Bucket="requests", Key=f"{namespace}-labels/labels.parquet", Body=parquet.getvalue())
    change_spec(real.kube, namespace, name, monitoring={
        "schedule": "1h", "window": "1h", "minRows": 300,
        "groundTruth": {"location": f"s3://requests/{namespace}-labels/", "maxDelay": "10m"},
        "performance": {"schedule": "1h", "window": "1h", "minRows": 50}})
    return time.monotonic()


def _drift_reported(real: RealPlatform, namespace: str, name: str, asked: float) -> None:
    """A pooled service's drift check on the cluster path: a Job on the
    runtime image read the rows the pool's fronts logged for that service
    to the object store and flagged them; the operator reports it."""
    drift = wait_for(lambda: (d := isvc_status(real.kube, namespace, name).get("drift") or {}).get("rows", 0) >= 300
                     and "share" in d and d, timeout=240, interval=2, what="a drift Job reading the pool's log",
                     seen=lambda: json.dumps(isvc_status(real.kube, namespace, name).get("drift")))
    print(f"pooled drift Job: {drift} (reported {time.monotonic() - asked:.0f} s after monitoring was asked)")
    assert drift["drifted"] is True and "message" not in drift and drift["report"].startswith("runs:/"), drift
    jobs = real.kube.list("batch/v1", "Job", namespace, "kubeloop.dev/purpose=drift")
    assert jobs and all(j["spec"]["template"]["spec"]["containers"][0]["image"].startswith("localhost/kubeloop/runtime")
                        for j in jobs)


def _outcomes_reported(real: RealPlatform, namespace: str, name: str, version: str, asked: float) -> None:
    """A pooled service's outcome check on the cluster path: a Job on the
    runtime image joined the labels in the object store to the rows the
    pool's fronts logged for that service there, each label matched, and
    judged the served version on its labelled rows; the operator reports it."""
    def judged() -> dict:
        found = isvc_status(real.kube, namespace, name).get("performance") or {}
        return "versions" in found and found

    performance = wait_for(judged, timeout=300, interval=2, what="an outcome Job joining labels to the pool's log",
                           seen=lambda: json.dumps(isvc_status(real.kube, namespace, name).get("performance")))
    print(f"pooled outcome Job: labels {performance['labels']}, versions {performance['versions']} (reported "
          f"{time.monotonic() - asked:.0f} s after monitoring was asked)")
    assert "message" not in performance, performance
    assert performance["labels"]["matched"] == 3 * OUTCOME_REQUESTS, performance["labels"]
    assert {v["version"]: v["rows"] for v in performance["versions"]} == {version: 3 * OUTCOME_REQUESTS}, performance
    jobs = real.kube.list("batch/v1", "Job", namespace, "kubeloop.dev/purpose=outcomes")
    assert jobs and all(j["spec"]["template"]["spec"]["containers"][0]["image"].startswith("localhost/kubeloop/runtime")
                        for j in jobs)


def change_spec(kube, namespace: str, name: str, **spec) -> None:  # noqa: ANN001, ANN003 - fields to set or drop (None)
    live = kube.get(API_VERSION, "InferenceService", name, namespace)
    kept = {k: v for k, v in {**live["spec"], **spec}.items() if v is not None}
    kube.apply({**live, "metadata": {k: live["metadata"][k] for k in ("name", "namespace")}, "spec": kept},
               field_manager="test")


def _a_rollout_is_judged_on_what_both_pods_measured(real: RealPlatform, namespace: str, names: list[str],
                                                    fronts: list[str], model: str) -> None:
    """A pooled service's rollouts on the cluster path: callers keyed and
    spread over both pool Pods (one sends the model's requests on to its
    owner), the platform's Prometheus scraping each Pod's front, and the
    operator's analysis of those series promoting a challenger as good as
    the champion, the alias moved; then a challenger that decides the
    opposite is aborted at its first step by the paired disagreement both
    fronts measured, the alias kept, and both Pods answer every caller with
    the champion again. Every service of that model then rolls forward to
    the promoted version, and none leaves Ready meanwhile: the old version
    answers while the Pods fetch and take up the new one."""
    import random
    import threading

    import requests
    from mlflow import MlflowClient

    uri = real.platform.env()["MLFLOW_TRACKING_URI"]
    registry = MlflowClient(uri)
    good = register_model(uri, model, seed=6)
    contrary = register_model(uri, model, seed=7, contrary=True)
    registry.set_registered_model_alias(model, "challenger", good)
    name = names[-1]
    change_spec(real.kube, namespace, name, canary={"alias": "challenger", "percent": 50},
                rollout={"steps": [{"weight": 50, "duration": "20s"}],
                         "analysis": {"minRequests": 60, "maxLatencyRatio": 4.0, "latencyTolerance": "100ms",
                                      "maxDisagreement": 0.3}})
    stop, rng, answered = threading.Event(), random.Random(3), []

    def call() -> None:
        while not stop.wait(1 / 30):
            rows = [[rng.gauss(0, 1) for _ in range(N_FEATURES)] for _ in range(4)]
            answer = requests.post(f"{rng.choice(fronts)}/v2/models/{namespace}.{name}/infer", json=v2_body(rows),
                                   timeout=60, headers={"X-Request-Key": uuid.uuid4().hex})
            answered.append(answer.headers.get("X-Model-Version") if answer.ok else answer.status_code)

    caller = threading.Thread(target=call)
    began = time.monotonic()
    caller.start()
    try:
        promoted = rollout_of(real.kube, namespace, name, good, timeout=240)
        took = time.monotonic() - began
        registry.set_registered_model_alias(model, "challenger", contrary)
        aborted = rollout_of(real.kube, namespace, name, contrary, timeout=240)
        took_abort = time.monotonic() - began - took
    finally:
        stop.set()
        caller.join()
    print(f"pooled rollout over two Pods, traffic began -> version {good} {promoted['phase']} ({took:.0f} s): "
          f"{promoted['analysis']}")
    print(f"pooled rollout over two Pods, its alias moved -> version {contrary} {aborted['phase']} "
          f"({took_abort:.0f} s): {aborted['analysis']}; answers {Counter(answered)}")
    assert promoted["phase"] == "Promoted" and promoted["analysis"]["verdict"] == "Pass", promoted
    assert promoted["analysis"]["requests"] >= 60, promoted
    assert aborted["phase"] == "Aborted" and aborted["step"] == 0 and aborted["weight"] == 0, aborted
    assert aborted["analysis"]["disagreement"] > 0.3 and "decided differently" in aborted["message"], aborted
    assert registry.get_model_version_by_alias(model, "champion").version == good
    assert all(isinstance(a, str) for a in answered), Counter(answered)
    served = f"{namespace}.{name}"
    wait_for(lambda: all({requests.post(f"{front}/v2/models/{served}/infer", json=v2_body([[0.1] * N_FEATURES]),
                                        timeout=60, headers={"X-Request-Key": uuid.uuid4().hex})
                          .headers.get("X-Model-Version") for _ in range(20)} == {good} for front in fronts),
             timeout=90, interval=1, what=f"both Pods answering every caller with version {good} again")
    change_spec(real.kube, namespace, name, canary=None, rollout=None)
    left_ready = set()

    def rolled_forward() -> bool:
        found = {n: isvc_status(real.kube, namespace, n) for n in names}
        left_ready.update(n for n, status in found.items() if status.get("phase") != "Ready")
        return all(status.get("modelVersion") == good for status in found.values())

    wait_for(rolled_forward, timeout=120, interval=0.5, what=f"every service of {model} on version {good}")
    assert left_ready == set(), f"services that left Ready while rolling forward: {sorted(left_ready)}"


def _serving_pod(pod: dict) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def test_kserve_predictors_claim_their_gpu_slice_through_dra_from_the_real_scheduler(real, tmp_path):
    """Cluster path (kserve backend, KUBELOOP_GPU_ALLOCATION=dra): the
    predictor kubeloop asks KServe for carries a claim from kubeloop's
    ResourceClaimTemplate and no extended resource; KServe's real controller
    (v0.20, a Pod on the real node) passes the claim through to its
    Deployment, and the real v1.36 scheduler puts the Pod on the fake fleet's
    H100 with a 1g.10gb MIG device allocated: the slice the kubernetes
    backend gets for the same spec (tests/e2e/test_serving_placement.py)."""
    from mlflow import MlflowClient

    namespace = real.namespace()
    uri = real.platform.env()["MLFLOW_TRACKING_URI"]
    model = f"{namespace}-dra"
    MlflowClient(uri).set_registered_model_alias(model, "champion", register_model(uri, model, seed=1))
    kserve.install(real.platform)
    operator = serving_operator(real, namespace, tmp_path, KUBELOOP_SERVING_BACKENDS="kserve",
                                KUBELOOP_SERVING_BACKEND="kserve", KUBELOOP_GPU_ALLOCATION="dra")
    try:
        real.kube.create(inference_service(namespace, "gpu", model, resources={"cpu": "100m", "memory": "256Mi"},
                                           gpu={"sharing": "mig", "memoryMib": 8 * 1024}))
        pod = wait_for(lambda: next((p for p in real.kube.list("v1", "Pod", namespace,
                                                               "serving.kserve.io/inferenceservice=gpu-primary")
                                     if p["status"].get("phase") == "Running"), None),
                       timeout=300, interval=1, what="the KServe predictor Pod running on a GPU node")
        assert pod["spec"]["nodeName"] == "gpu-h100-mig-mixed"
        triton = next(c for c in pod["spec"]["containers"] if c["name"] == "kserve-container")
        assert triton["resources"]["claims"] == [{"name": "gpu"}]
        assert not any(k.startswith("nvidia.com/") for k in triton["resources"].get("limits", {}))
        [claim_status] = pod["status"]["resourceClaimStatuses"]
        claim = real.kube.get("resource.k8s.io/v1", "ResourceClaim", claim_status["resourceClaimName"], namespace)
        [result] = claim["status"]["allocation"]["devices"]["results"]
        devices = {d["name"]: d for s in real.kube.list("resource.k8s.io/v1", "ResourceSlice")
                   if s["spec"].get("nodeName") == "gpu-h100-mig-mixed" for d in s["spec"].get("devices", [])}
        assert devices[result["device"]]["attributes"]["profile"]["string"] == "1g.10gb", result
    finally:
        _delete_inference_services(real.kube, [namespace])
        operator.stop()


def fresh_boto3_session(monkeypatch) -> None:  # noqa: ANN001 - pytest's fixture
    """boto3's default session (Feast's S3 registry and boto3.client use it)
    keeps the credentials it first read: this test's own session reads the
    platform's, whatever an earlier test in this process used."""
    import boto3

    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)


def answers_from_a_pod(real: RealPlatform, namespace: str, url: str, bodies: list[dict]) -> list[dict]:
    """POST each body to url from a Pod on the real node; each answer's
    status and body (4xx included)."""
    import json

    return client_pod_answer(real, namespace, STATUS_CLIENT, [url, json.dumps(bodies)])


# Retries while kube-proxy has not yet programmed the Service's rules; keeps
# 4xx answers (urllib raises them).
STATUS_CLIENT = """
import json, sys, time, urllib.error, urllib.request
answers = []
for body in json.loads(sys.argv[2]):
    for attempt in range(20):
        request = urllib.request.Request(sys.argv[1], json.dumps(body).encode(), {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                answers.append({"status": response.status, "body": response.read().decode()})
            break
        except urllib.error.HTTPError as error:
            answers.append({"status": error.code, "body": error.read().decode()})
            break
        except OSError:
            if attempt == 19:
                raise
            time.sleep(0.5)
open("/dev/termination-log", "w").write(json.dumps(answers))
"""


def prometheus_sum(env: dict[str, str], selector: str, at_least: float) -> float:
    """sum(selector) in the platform's Prometheus, once it reaches at_least."""
    import requests

    def value() -> float | None:
        answer = requests.get(f"{env['PROMETHEUS_URL']}/api/v1/query", params={"query": f"sum({selector})"},
                              timeout=5).json()["data"]["result"]
        return float(answer[0]["value"][1]) if answer and float(answer[0]["value"][1]) >= at_least else None
    return wait_for(value, timeout=60, interval=1, what=f"Prometheus scraping {selector}")


def charts_identity(real: RealPlatform, namespace: str, folder: Path, *values: str,
                    release_namespace: str | None = None) -> tuple[str, Path]:
    """The chart's ServiceAccount and RBAC (helm template, with these values,
    watching namespace, released into a namespace of its own unless one is
    named; not its Deployment: the operator runs here), and a kubeconfig
    with a token of that account: (user name, kubeconfig)."""
    import yaml

    from kubeloop.dev.platform import build_kubeconfig

    system = release_namespace or real.namespace()
    # A release name of its own: the rendered ClusterRoles are cluster-wide and
    # outlive the test, and must not collide with a later `helm install` here.
    release = f"id-{system}"
    rendered = subprocess.run([str(binary("helm")), "template", release, str(CHART), "--namespace", system,
                               "--kube-version", versions()["KUBERNETES_VERSION"],
                               "--set", "pipelines.backend=noop", "--set", "webhooks.tokenSecret.name=unused",
                               "--set", f"mlflow.trackingUri={real.platform.env()['MLFLOW_TRACKING_URI']}",
                               "--set", f"watchNamespaces={{{namespace}}}", *values],
                              capture_output=True, text=True, timeout=120, check=True).stdout
    kinds = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
    for doc in (d for d in yaml.safe_load_all(rendered) if d and d["kind"] in kinds):
        real.kube.apply(doc)
    account = f"{release}-kubeloop"
    token = subprocess.run([str(binary("kubectl")), f"--kubeconfig={real.platform.kubeconfig}", "create", "token",
                            account, "-n", system, "--duration=1h"],
                           capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    config = folder / "chart.kubeconfig"
    config.write_text(yaml.safe_dump(build_kubeconfig(real.kube.server, real.platform.pki.ca_cert, token, account)))
    return f"system:serviceaccount:{system}:{account}", config


# What the operator creates for a service on the kserve backend (its own, not a pool's).
KSERVE_CREATES = frozenset(("serving.kserve.io", resource, verb) for resource, verb in (
    ("inferenceservices", "create"), ("inferenceservices", "get"), ("inferenceservices", "list"),
    ("servingruntimes", "create"), ("clusterstoragecontainers", "create")))


def assert_least_privilege(real: RealPlatform, user: str, since: float, *groups: str,
                           needed: frozenset = frozenset()) -> None:
    """Every request the operator made with the chart's identity was allowed,
    each needed a rule the operator's permissions declare (its namespaced
    and cluster rules, and those of groups: kserve, pools...), and the
    requests `needed` names were made."""
    from kubeloop.operator.permissions import operator_permissions
    from tests.e2e.test_chart import audit_events, used_permissions

    events = audit_events(real.platform, user, since)
    assert events, "the audit log holds none of the operator's requests"
    assert [(e["verb"], e.get("objectRef")) for e in events if e.get("responseStatus", {}).get("code") == 403] == []
    wanted = operator_permissions()
    rules = wanted.namespaced + wanted.cluster + sum((getattr(wanted, group) for group in groups), ())
    declared = {(r.api_group, resource, verb) for r in rules for resource in r.resources for verb in r.verbs}
    used = used_permissions(events)
    assert used <= declared, sorted(used - declared)
    assert needed <= used, sorted(needed - used)


def assert_served_by_kserve(real: RealPlatform, namespace: str, name: str,
                            roles: tuple[str, ...] = ("primary", "canary", "shadow")) -> None:
    """Each version is a KServe InferenceService that KServe reports Ready,
    whose predictor Pod KServe's webhook gave kubeloop's storage initializer
    (the runtime image, from the ClusterStorageContainer for models:/ URIs)
    and whose Triton container comes from kubeloop's ServingRuntime."""
    for role in roles:
        isvc = real.kube.get("serving.kserve.io/v1beta1", "InferenceService", f"{name}-{role}", namespace)
        assert any(c["type"] == "Ready" and c["status"] == "True" for c in isvc["status"]["conditions"]), isvc["status"]
        assert isvc["metadata"]["ownerReferences"][0]["kind"] == "InferenceService"
        [predictor] = real.kube.list("v1", "Pod", namespace, f"serving.kserve.io/inferenceservice={name}-{role}")
        [init] = predictor["spec"]["initContainers"]
        assert init["name"] == "storage-initializer" and init["image"].startswith("localhost/kubeloop/runtime")
        assert init["args"][0].startswith("models:/") and init["args"][1] == "/mnt/models"
        assert predictor["status"]["initContainerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"
        triton = next(c for c in predictor["spec"]["containers"] if c["name"] == "kserve-container")
        assert triton["image"].startswith("localhost/kubeloop/triton")


def _seconds(start: str, end: str) -> int:
    from datetime import datetime

    return int((datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds())


def deployed(status: dict) -> dict:
    return next((c for c in status.get("conditions", []) if c["type"] == "Deployed"), {})


def test_an_oom_killed_triton_is_restarted_and_the_inference_service_reports_outage_and_recovery(real, served):
    """Cluster path: the kernel OOM-kills tritonserver at its container's
    memory limit (a process on the host joins the container's memory cgroup
    and allocates past the limit; tritonserver is made the kernel's choice of
    victim); the kubelet restarts the container, the InferenceService's
    Deployed condition goes False with reason ContainersFailing naming the OOM
    kill, then True again with the restart on record, and the Service answers
    again."""
    before = served.pods()[0]
    triton = next(c for c in before["status"]["containerStatuses"] if c["name"] == "triton")
    cgroup = next(cg for cg in host.cgroups() if "memory" in cg.parts and cg.name == triton["containerID"].split("//")[1])
    pids = host._cgroup_pids(cgroup)
    victim = next(pid for pid in pids if psutil.Process(pid).cmdline()[0].endswith("/bin/tritonserver"))
    for pid in pids:  # the kernel kills the process with the highest score: tritonserver, not its python stub
        Path(f"/proc/{pid}/oom_score_adj").write_text("1000" if pid == victim else "0")
    started = time.monotonic()
    hog = subprocess.Popen([sys.executable, "-c", HOG, str(cgroup), str(victim)])
    try:
        outage = wait_for(lambda: (c := deployed(served.isvc_status())).get("reason") == "ContainersFailing" and c,
                          timeout=60, interval=0.2, what="the InferenceService reporting the outage")
        outage_seen = time.monotonic()
        # 0: it saw tritonserver die and left the cgroup; SIGKILL: the kernel,
        # still short of memory after killing tritonserver, chose it next.
        assert hog.wait(30) in (0, -signal.SIGKILL)
    finally:
        if hog.poll() is None:
            hog.kill()
    assert outage["status"] == "False" and "OOMKilled" in outage["message"], outage
    recovered = wait_for(lambda: (s := served.isvc_status()).get("phase") == "Ready" and s, timeout=120,
                         interval=0.5, what="the InferenceService Ready again")
    print(f"OOM: reported {outage_seen - started:.1f} s after the hog started, Ready again after "
          f"{time.monotonic() - started:.1f} s")
    assert deployed(recovered)["status"] == "True" and "restarted 1x (last: OOMKilled" in deployed(recovered)["message"]
    after = served.pods()[0]
    assert after["metadata"]["uid"] == before["metadata"]["uid"]  # the same Pod: its container was restarted
    status = next(c for c in after["status"]["containerStatuses"] if c["name"] == "triton")
    assert status["restartCount"] == 1 and status["lastState"]["terminated"]["reason"] == "OOMKilled"
    answer = served.infer_on_the_cluster([[0.0] * N_FEATURES])
    assert answer["outputs"][0]["shape"] == [1, 1]


# Joins a container's memory cgroup and allocates (touching every page) until
# the kernel has killed the victim, then leaves the cgroup so that the
# container's cgroup can be removed.
HOG = """
import os, sys, time
cgroup, victim = sys.argv[1], int(sys.argv[2])
open(os.path.join(cgroup, "cgroup.procs"), "w").write(str(os.getpid()))
held = []
while os.path.exists(f"/proc/{victim}") and len(held) < 160:
    chunk = bytearray(16 << 20)
    chunk[::4096] = b"x" * len(range(0, len(chunk), 4096))
    held.append(chunk)
deadline = time.monotonic() + 30
while os.path.exists(f"/proc/{victim}") and time.monotonic() < deadline:
    time.sleep(0.02)
root = cgroup.split("/kubepods")[0]
open(os.path.join(root, "cgroup.procs"), "w").write(str(os.getpid()))
sys.exit(0 if not os.path.exists(f"/proc/{victim}") else 1)
"""


# Keeps `threads` requests in flight against url for `seconds` (the test
# deletes the Pod once it has seen what it waits for).
LOAD_CLIENT = """
import sys, threading, time, urllib.request
url, body, threads, seconds = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3]), float(sys.argv[4])
end = time.monotonic() + seconds
def call():
    while time.monotonic() < end:
        try:
            request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
            urllib.request.urlopen(request, timeout=30).read()
        except OSError:
            time.sleep(0.2)
workers = [threading.Thread(target=call) for _ in range(threads)]
for worker in workers:
    worker.start()
for worker in workers:
    worker.join()
"""


def custom_metric(kube, namespace: str, metric: str, selector: str) -> dict[str, float]:
    """The custom metrics API's value of metric for each Pod selector matches
    (what `kubectl get --raw /apis/custom.metrics.k8s.io/v1beta1/namespaces/NS/pods/*/METRIC` shows);
    empty while it has none."""
    from kubernetes.utils.quantity import parse_quantity

    from kubeloop.kube import KubeError

    try:
        answer = kube.request("GET", f"/apis/custom.metrics.k8s.io/v1beta1/namespaces/{namespace}/pods/*/{metric}",
                              query=[("labelSelector", selector)])
    except KubeError as exc:  # 404 until Prometheus has a series for the Pods and the adapter has listed it
        if exc.status in (404, 503):
            return {}
        raise
    assert all(item["metricName"] == metric and item["describedObject"]["kind"] == "Pod" for item in answer["items"])
    return {item["describedObject"]["name"]: float(parse_quantity(item["value"])) for item in answer["items"]}


def hpa_condition(hpa: dict, kind: str) -> dict:
    return next((c for c in (hpa.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def replicas_owners(deployment: dict) -> set[tuple[str, str]]:
    """(manager, subresource) of each managedFields entry that owns spec.replicas."""
    return {(e["manager"], e.get("subresource", "")) for e in deployment["metadata"]["managedFields"]
            if "f:replicas" in e.get("fieldsV1", {}).get("f:spec", {})}


# Microseconds a request may wait in Triton's queue, per replica: eight
# callers in flight against one python-backend instance wait far longer.
QUEUE_TARGET_US = 200


def test_the_hpa_scales_the_primary_on_tritons_queue_time_and_the_next_resync_leaves_its_replicas(real, tmp_path):
    """Cluster path (real node). The platform's custom metrics API
    (prometheus-adapter built from its Go module, `kubeloop dev
    metrics-adapter`, with the chart's adapter rules, on the Prometheus that
    scrapes the real node's Triton Pods) serves Triton's queue time per
    request for the primary's Pods; eight callers in flight from a Pod make it
    exceed the autoscaling target, and the real HPA controller, on that
    metric and by its own decision, scales the primary Deployment from
    minReplicas 1 to maxReplicas 2 (its status shows the metric, its event
    says why). The traffic stops, the InferenceService's spec changes
    (resources, not autoscaling), the operator reconciles it and re-applies
    the Deployment's template, and then a few resyncs later: the replica
    count is still the HPA's. Before: no custom metrics API ran here, and only
    a scale written by hand through the scale subresource was shown to
    survive a reconcile."""
    import json

    from mlflow import MlflowClient

    from kubeloop.dev import metricsadapter

    namespace = real.namespace()
    uri = real.platform.env()["MLFLOW_TRACKING_URI"]
    model = f"{namespace}-scaled"
    version = register_model(uri, model, seed=1)
    MlflowClient(uri).set_registered_model_alias(model, "champion", version)
    started = time.monotonic()
    metricsadapter.install(real.platform)
    print(f"custom metrics API Available {time.monotonic() - started:.1f} s after install began")
    operator = serving_operator(real, namespace, tmp_path)
    load = f"load-{uuid.uuid4().hex[:6]}"
    metric = "nv_inference_queue_duration_us_per_request"
    try:
        real.kube.create(inference_service(namespace, "scaled", model, resources={"cpu": "200m", "memory": "512Mi"},
                                           autoscaling={"minReplicas": 1, "maxReplicas": 2, "metric": "queue-time",
                                                        "target": QUEUE_TARGET_US}))
        wait_for(lambda: isvc_status(real.kube, namespace, "scaled").get("phase") == "Ready", timeout=300,
                 interval=1, what="the autoscaled InferenceService Ready")
        deployment = real.kube.get("apps/v1", "Deployment", "scaled-predictor", namespace)
        selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())
        [first] = [p["metadata"]["name"] for p in real.kube.list("v1", "Pod", namespace, selector)]
        assert deployment["spec"]["replicas"] == 1

        # Idle, the Pod reports 0 (the rule's floor on the request rate), and the HPA holds one replica.
        idle = wait_for(lambda: custom_metric(real.kube, namespace, metric, selector), timeout=120, interval=1,
                        what="the custom metrics API answering for the primary's Pod")
        assert idle == {first: 0.0}, idle
        hpa = wait_for(lambda: (h := real.kube.get("autoscaling/v2", "HorizontalPodAutoscaler", "scaled-predictor",
                                                   namespace)) and hpa_condition(h, "ScalingActive")
                       .get("status") == "True" and h, timeout=60, interval=1, what="the HPA reading the metric")
        assert hpa_condition(hpa, "ScalingActive")["reason"] == "ValidMetricFound"
        assert hpa["status"]["currentReplicas"] == 1 and hpa["status"]["desiredReplicas"] == 1

        service = real.kube.get("v1", "Service", "scaled", namespace)
        url = f"http://{service['spec']['clusterIP']}/v2/models/{triton_name(model)}/infer"
        body = json.dumps(v2_body([[0.1 * i for i in range(N_FEATURES)]]))
        real.kube.create(pod(load, namespace, base_image().ref, ["python3", "-c", LOAD_CLIENT, url, body, "8", "300"],
                             restartPolicy="Never"))
        running(real.kube, load, namespace)
        loaded = time.monotonic()
        busy = wait_for(lambda: (m := custom_metric(real.kube, namespace, metric, selector)) and
                        max(m.values()) > QUEUE_TARGET_US and m, timeout=120, interval=1,
                        what=f"the primary's queue time above {QUEUE_TARGET_US} us")
        over_target = time.monotonic() - loaded

        def scaled() -> dict | None:
            hpa = real.kube.get("autoscaling/v2", "HorizontalPodAutoscaler", "scaled-predictor", namespace)
            return hpa if (hpa.get("status") or {}).get("desiredReplicas", 0) >= 2 else None

        hpa = wait_for(scaled, timeout=120, interval=1, what="the HPA deciding to scale up")
        decided = time.monotonic() - loaded
        deployment = wait_for(lambda: (d := real.kube.get("apps/v1", "Deployment", "scaled-predictor", namespace))
                              ["spec"]["replicas"] == 2 and d, timeout=30, what="the Deployment at 2 replicas")
        current = hpa["status"]["currentMetrics"][0]["pods"]
        from kubernetes.utils.quantity import parse_quantity

        assert current["metric"]["name"] == metric and float(parse_quantity(current["current"]["averageValue"])) \
            > QUEUE_TARGET_US, hpa["status"]
        assert hpa_condition(hpa, "AbleToScale")["status"] == "True"
        assert hpa_condition(hpa, "ScalingActive")["reason"] == "ValidMetricFound"
        # It wanted more than maxReplicas: the metric, not a floor, decided.
        assert hpa_condition(hpa, "ScalingLimited")["reason"] == "TooManyReplicas"
        # The HPA's own account of the decision, and its write through the scale subresource.
        rescaled = wait_for(lambda: [e for e in real.kube.list("v1", "Event", namespace)
                                     if e["involvedObject"]["kind"] == "HorizontalPodAutoscaler"
                                     and e["reason"] == "SuccessfulRescale"], timeout=30, what="the HPA's event")
        assert f"New size: 2; reason: pods metric {metric} above target" in rescaled[0]["message"], rescaled
        print("managedFields after the scale-up:", [(e["manager"], e["operation"], e.get("subresource", ""),
                                                     sorted(e.get("fieldsV1", {}).get("f:spec", {})))
                                                    for e in deployment["metadata"]["managedFields"]])
        assert not any(manager == "kubeloop" for manager, _ in replicas_owners(deployment))
        wait_for(lambda: (real.kube.get("apps/v1", "Deployment", "scaled-predictor", namespace)["status"]
                          .get("availableReplicas") or 0) == 2, timeout=180, interval=1,
                 what="the second replica available")
        available = time.monotonic() - loaded
        print(f"HPA on {metric}: idle {idle}; under load {busy} (target {QUEUE_TARGET_US}); load -> metric over "
              f"target {over_target:.1f} s, -> HPA decided 2 replicas {decided:.1f} s, -> second replica available "
              f"{available:.1f} s; HPA status {hpa['status']['currentMetrics']}, conditions "
              f"{[(c['type'], c['status'], c['reason']) for c in hpa['status']['conditions']]}; "
              f"event: {rescaled[0]['message']}")

        real.kube.delete("v1", "Pod", load, namespace)
        # A spec change that leaves autoscaling alone: the operator applies the
        # Deployment again (a new template) and must leave its replicas to the HPA,
        # which keeps 2 (its scale-down stabilisation window is five minutes).
        changed = real.kube.merge_patch(API_VERSION, "InferenceService", "scaled",
                                        {"spec": {"resources": {"cpu": "250m"}}}, namespace)
        generation = changed["metadata"]["generation"]
        wait_for(lambda: isvc_status(real.kube, namespace, "scaled").get("observedGeneration") == generation,
                 timeout=60, interval=0.5, what="the operator reconciling the changed spec")
        deployment = real.kube.get("apps/v1", "Deployment", "scaled-predictor", namespace)
        triton = deployment["spec"]["template"]["spec"]["containers"][0]
        assert triton["resources"]["requests"]["cpu"] == "250m", "the operator applied the new spec"
        assert deployment["spec"]["replicas"] == 2
        time.sleep(3 * 2 + 1)  # three resyncs (KUBELOOP_RESYNC_SECONDS=2)
        deployment = real.kube.get("apps/v1", "Deployment", "scaled-predictor", namespace)
        assert deployment["spec"]["replicas"] == 2 and not any(m == "kubeloop" for m, _ in replicas_owners(deployment))
        print(f"after the reconcile of generation {generation} and three resyncs: replicas "
              f"{deployment['spec']['replicas']} (owners of spec.replicas: {replicas_owners(deployment)})")
    finally:
        real.kube.delete("v1", "Pod", load, namespace)
        try:
            _delete_inference_services(real.kube, [namespace])
        finally:
            operator.stop()
            metricsadapter.uninstall(real.platform)


def operator_process(pod_uid: str) -> psutil.Process:
    """The operator's Python process, found in its Pod's cgroup."""
    def probe():
        for cg in host.cgroups():
            if pod_uid.replace("-", "_") in str(cg) or pod_uid in str(cg):
                for pid in host._cgroup_pids(cg):
                    proc = psutil.Process(pid)
                    if "operator" in proc.cmdline() and "tini" not in proc.name():
                        return proc
        return None
    return wait_for(probe, timeout=30, what="the operator's process")


@pytest.mark.timeout(1500)  # a cold training image (torch) takes most of it
def test_the_kfp_multi_node_step_trains_in_kubeloops_trainjob_through_the_real_trainer_controller(
        real, tmp_path, monkeypatch):
    """Cluster path, on the real node: the kfp backend's multi-node training
    step (components.steps.train_on_trainer_step, called as its Pod calls it:
    Kubeflow Pipelines' own backend cannot run here) on data its pipeline
    prepared. It publishes the data below the run's prefix and creates the
    trainer backend's TrainJob (`kubeloop dev trainer`'s Trainer, JobSet and
    runtime), whose initializer keeps that data; two node Pods meet under
    torchrun (gloo: rank 0 would wait for ever without rank 1), rank 0
    publishes a checkpoint every epoch and leaves the model, credentials by
    Secret reference; the step records the run in MLflow naming the TrainJob,
    and the model learnt the data."""
    import numpy as np
    import pandas
    from mlflow import MlflowClient

    from kubeloop.api.training import TrainingJobSpec
    from kubeloop.components.model import load_model
    from kubeloop.components.steps import train_on_trainer_step
    from kubeloop.components.training import predict
    from kubeloop.components.trainjob import trainjob_name
    from kubeloop.dev import trainer
    from kubeloop.pipelines.environment import StepEnvironment
    from sklearn.metrics import roc_auc_score
    from tests.support.models import synthetic_dataset
    from tests.support.trainjobs import COMPLETION_INDEX

    started = time.monotonic()
    image = python_image(PYTHON_IMAGES["training"], [sys.executable, "-m", "pip"])
    real.platform.import_image(image)
    imported = time.monotonic()
    trainer.install(real.platform, image.ref)
    print(f"training image imported in {imported - started:.0f} s, Trainer installed in "
          f"{time.monotonic() - imported:.0f} s")
    env, namespace, epochs = real.platform.env(), real.namespace(), 3
    for name, value in env.items():  # this process is the step: it writes the data to the object store
        if name.startswith("AWS_"):
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("KUBECONFIG", str(real.platform.kubeconfig))
    fresh_boto3_session(monkeypatch)
    real.kube.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "object-store", "namespace": namespace},
                      "stringData": {k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}})
    # Enough to learn the synthetic rule (AUC about 0.85) in a few hundred steps; what is shown is the path.
    info = synthetic_dataset(tmp_path / "data.parquet", rows=16_000, holdout=4_000)
    spec = TrainingJobSpec.model_validate({
        "modelName": f"{namespace}-ddp", "features": {"featureViews": ["synthetic"], "labels": {"source": "t", "column": "y"}},
        "distributed": {"nodes": 2}, "hyperparameters": {"epochs": epochs, "batchSize": 64},
        "resources": {"cpu": "500m", "memory": "1536Mi"}})
    steps = StepEnvironment(image=image.ref, object_store_secret="object-store",
                            object_store_endpoint=env["AWS_ENDPOINT_URL_S3"])
    run_id = train_on_trainer_step(spec.to_json(), str(tmp_path / "data.parquet"), info.to_json(), "",
                                   str(tmp_path / "model"), env["MLFLOW_TRACKING_URI"], "kfp-ddp", f"{namespace}/ddp",
                                   "h", "sha", namespace, steps.trainer_settings(), timeout=900)
    trainjob = trainjob_name("kfp-ddp")
    pods = real.kube.list("v1", "Pod", namespace, f"jobset.sigs.k8s.io/jobset-name={trainjob}")
    ran = sorted((p["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"], p["metadata"]["labels"][COMPLETION_INDEX])
                 for p in pods if p["status"]["phase"] == "Succeeded")
    assert ran == [("dataset-initializer", "0"), ("node", "0"), ("node", "1")], ran
    assert env["AWS_SECRET_ACCESS_KEY"] not in json.dumps([p["spec"] for p in pods])  # by reference only
    tags = MlflowClient(env["MLFLOW_TRACKING_URI"]).get_run(run_id).data.tags
    assert (tags["train.trainjob"], tags["train.processes"], tags["train.resumed_from_epoch"]) == (
        f"{namespace}/{trainjob}", "2", "0")
    assert json.loads((tmp_path / "model" / "result.json").read_text())["history"][-1]["epoch"] == epochs
    model = load_model(tmp_path / "model")
    frame = pandas.read_parquet(tmp_path / "data.parquet")
    holdout = frame[frame["split"] == "holdout"]
    assert roc_auc_score(holdout["y"], predict(model, holdout[info.feature_columns].to_numpy(np.float32))) > 0.75
    print(f"kfp multi-node step: {time.monotonic() - imported:.0f} s from the install to the model")


def trainer_cluster(real: RealPlatform, tmp_path: Path, monkeypatch):  # noqa: ANN001, ANN201 - a TrainerCluster
    """The trainer backend on this module's real node
    (tests.support.trainjobs.TrainerCluster), this process reaching the
    object store as the platform's client."""
    from tests.support.trainjobs import TrainerCluster

    for name, value in real.platform.env().items():  # this process writes the store's registry and sources
        if name.startswith(("AWS_", "FEAST_")):
            monkeypatch.setenv(name, value)
    fresh_boto3_session(monkeypatch)
    return TrainerCluster(real.platform, real.kube, real.namespace(), tmp_path)


@pytest.mark.timeout(2400)  # a training image whose code layer changed takes minutes to build and import
def test_the_trainer_backend_trains_on_two_nodes_and_survives_a_lost_node_the_operator_and_the_kubelet(real, tmp_path, monkeypatch):
    """Cluster path (the trainer pipeline backend; the operator on the host
    with KUBELOOP_PIPELINE_BACKENDS=trainer, its TrainJob through the real
    Trainer and JobSet controllers on the real node; see TrainerCluster).

    Training: a TrainingJob with `distributed.nodes: 2` becomes one TrainJob,
    owned by it; its spec changed while that runs, the TrainJob is replaced
    by the new spec's. The dataset initializer's Pod joins the features; its
    process is killed once (as a crash or the OOM killer would), and a new
    Pod joins them again. Two node Pods train. Once rank 0 has published a checkpoint, a node Pod
    is deleted, the operator is killed (SIGKILL) and the kubelet restarted,
    then the operator starts again: the lost node fails its Job at once,
    JobSet starts every Job again, the initializer keeps the prepared data
    and both nodes resume from the last checkpoint (at most the epoch in
    progress is trained again). The restarted operator finds the TrainJob it
    created, and rank 0 registers one version, its lineage naming the
    TrainJob; credentials and the store's text reach the Pods by reference.

    Deleting the TrainingJob removes its TrainJob. (An OptimizedModel on this
    backend, a Job, is the cluster loop's to prove, and so is the operator
    as the chart's Pod, deleted mid-run:
    test_the_whole_loop_closes_on_the_cluster_path_with_the_operator_as_the_charts_pod.)"""
    import torch
    from mlflow import MlflowClient

    from kubeloop.components.objects import download
    from kubeloop.components.training import SHARED_CHECKPOINT
    from kubeloop.components.trainjob import INITIALIZER
    from kubeloop.registry import tags

    cluster = trainer_cluster(real, tmp_path, monkeypatch)
    namespace, env, epochs = cluster.namespace, cluster.env, 8
    try:
        real.kube.create(cluster.trainingjob("fraud", epochs=3))
        first = wait_for(lambda: cluster.status("fraud").get("runId"), timeout=120, interval=1,
                         what="the first run submitted")
        real.kube.merge_patch(API_VERSION, "TrainingJob", "fraud",
                              {"spec": {"hyperparameters": {"epochs": epochs, "batchSize": 64}}}, namespace)
        trainjob = wait_for(lambda: next((t for t in cluster.trainjobs()
                                          if f"{namespace}/{t['metadata']['name']}" != first), None),
                            timeout=120, interval=1, what="the changed spec's TrainJob")
        name, run = trainjob["metadata"]["name"], trainjob["metadata"]["annotations"]["kubeloop.dev/pipeline-run"]
        checkpoint = f"s3://training/{namespace}/{run}/checkpoints/{SHARED_CHECKPOINT}"
        wait_for(lambda: _killed(f"{name}-{INITIALIZER}", "kubeloop.components.initializer"), timeout=300,
                 interval=0.2, what="the initializer's process killed")

        def published() -> int:
            local = download(checkpoint, tmp_path / "checkpoint.pt", missing_ok=True)
            return torch.load(local, map_location="cpu", weights_only=True)["epoch"] if local else 0

        at_loss = wait_for(lambda: published(), timeout=900, interval=0.5, what="rank 0's first checkpoint",
                           seen=lambda: str([(p["metadata"]["name"], p["status"]["phase"]) for p in cluster.pods(name)]))
        assert at_loss < epochs, "the run ended before a node could be lost: give it more epochs"
        prepared = real.kube.get("batch/v1", "Job", f"{name}-{INITIALIZER}-0", namespace)["status"]
        assert (prepared.get("failed"), prepared.get("succeeded")) == (1, 1), prepared  # the killed try, then a new Pod
        assert [t["metadata"]["name"] for t in cluster.trainjobs()] == [name]  # the first spec's TrainJob deleted
        pods = cluster.pods(name)
        assert env["AWS_SECRET_ACCESS_KEY"] not in json.dumps([p["spec"] for p in pods])  # by reference only
        assert "online_store" not in json.dumps([p["spec"] for p in pods])
        (victim,) = [p for p in pods if p["status"]["phase"] == "Running"
                     and p["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index") == "1"
                     and p["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"] == "node"]
        real.kube.delete("v1", "Pod", victim["metadata"]["name"], namespace)
        cluster.operator.kill()
        real.platform.restart_process("kubelet")
        cluster.operator.start().wait_for_log("Initial authentication has finished", timeout=60)
        done = cluster.finished("fraud")
        assert done["phase"] == "Succeeded", done
        assert done["backend"] == "trainer" and done["runId"] == f"{namespace}/{name}"
        (left,) = cluster.trainjobs()  # the restarted operator made no second
        owner = real.kube.get(API_VERSION, "TrainingJob", "fraud", namespace)["metadata"]
        assert left["metadata"]["ownerReferences"][0]["uid"] == owner["uid"]
        jobset = real.kube.get("jobset.x-k8s.io/v1alpha2", "JobSet", name, namespace)
        assert jobset["status"].get("restarts", 0) >= 1, jobset["status"]
        steps = [p["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"] for p in cluster.pods(name)
                 if p["status"]["phase"] == "Succeeded"]
        assert steps.count("node") == 2 and "dataset-initializer" in steps, steps
        (version,) = cluster.versions("fraud")
        lineage = version.tags
        assert lineage[tags.TRAINJOB] == done["runId"] and lineage[tags.PIPELINE_RUN] == run
        assert float(lineage["metric.auc"]) > 0.75
        resumed = int(MlflowClient(env["MLFLOW_TRACKING_URI"]).get_run(version.run_id)
                      .data.tags["train.resumed_from_epoch"])
        assert resumed >= at_loss, (resumed, at_loss)  # nothing published before the loss was trained again
        print(f"node lost after checkpoint {at_loss} of {epochs}, operator killed, kubelet restarted: resumed "
              f"from epoch {resumed} (JobSet restarts {jobset['status']['restarts']})")

        real.kube.delete(API_VERSION, "TrainingJob", "fraud", namespace)
        wait_for(lambda: not cluster.trainjobs(), timeout=120, interval=1, what="the TrainJob removed with its owner")
    finally:
        cluster.close()


def _killed(pod_prefix: str, module: str) -> int | None:
    """SIGKILL the process that runs module in a container of a Pod whose
    name starts with pod_prefix (its hostname); its pid, None if none runs."""
    for process in psutil.process_iter(["cmdline"]):
        try:
            if module in (process.info["cmdline"] or []) and \
                    process.environ().get("HOSTNAME", "").startswith(pod_prefix):
                process.kill()
                return process.pid
        except psutil.Error:  # ended while looked at
            continue
    return None


def test_the_chart_runs_the_operator_on_the_real_node(real):
    """Cluster path: `helm install` of charts/kubeloop with the locally built
    operator image. The Pod is admitted under the restricted Pod Security
    profile, runs as 65532 with a read-only root, reaches the API server
    through the kubernetes Service, reconciles an example with the noop
    pipeline backend, answers its webhooks through its Service, and is
    restarted by its liveness probe when wedged."""
    image = python_image(PYTHON_IMAGES["operator"], [sys.executable, "-m", "pip"])
    real.platform.import_image(image)
    system = real.namespace({"pod-security.kubernetes.io/enforce": "restricted"})
    apps = real.namespace()
    real.kube.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "webhook", "namespace": system},
                      "stringData": {"token": "s3cret-token"}})
    repository, tag = image.ref.rsplit(":", 1)
    helm = subprocess.run([str(binary("helm")), f"--kubeconfig={real.platform.kubeconfig}", "install", "kl", str(CHART),
                           "--namespace", system, "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
                           "--set", "image.pullPolicy=Never", "--set", "pipelines.backend=noop",
                           "--set", f"mlflow.trackingUri={real.platform.env()['MLFLOW_TRACKING_URI']}",
                           "--set", "webhooks.tokenSecret.name=webhook", "--set", f"watchNamespaces={{{apps}}}"],
                          capture_output=True, text=True, timeout=120)
    assert helm.returncode == 0, helm.stderr

    def ready_pod():
        pods = real.kube.list("v1", "Pod", system)
        ready = [p for p in pods if any(c["type"] == "Ready" and c["status"] == "True"
                                        for c in p.get("status", {}).get("conditions", []))]
        return ready[0] if ready else None
    def seen() -> str:
        return "; ".join(f"{p['metadata']['name']} {p.get('status', {}).get('containerStatuses')}\n"
                         f"{pod_log(real, system, p['metadata']['name'])[-3000:]}"
                         for p in real.kube.list("v1", "Pod", system))

    started = wait_for(ready_pod, timeout=120, what="the operator Pod Ready", seen=seen)
    assert started["spec"]["nodeName"] == NODE_NAME
    proc = operator_process(started["metadata"]["uid"])
    assert proc.uids().real == 65532
    root = next(line.split() for line in Path(f"/proc/{proc.pid}/mountinfo").read_text().splitlines()
                if line.split()[4] == "/")
    assert "ro" in root[5].split(","), root

    examples = {d["kind"]: d for d in load_examples(repo_root() / "examples")}
    job = examples["TrainingJob"]
    job["metadata"]["namespace"] = apps
    real.kube.create(job)
    wait_for(lambda: ((real.kube.get(API_VERSION, "TrainingJob", job["metadata"]["name"], apps) or {})
                      .get("status") or {}).get("phase") == "Succeeded", timeout=60, what="the TrainingJob reconciled")

    service = real.kube.get("v1", "Service", "kl-kubeloop", system)
    url = f"http://{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}/hooks/alertmanager"
    real.platform.import_image(base_image())
    client = pod("hooks", apps, base_image().ref, ["python3", "-c", WEBHOOK_CLIENT, url, apps], restartPolicy="Never")
    real.kube.create(client)
    done = wait_for(lambda: (p := real.kube.get("v1", "Pod", "hooks", apps)) and
                    p["status"].get("phase") in ("Succeeded", "Failed") and p, timeout=60, what="the webhook client")
    assert done["status"]["phase"] == "Succeeded", done["status"]

    os.kill(proc.pid, signal.SIGSTOP)  # wedged: alive, answering nothing
    try:
        restarted = wait_for(lambda: (p := ready_pod()) and p["status"]["containerStatuses"][0]["restartCount"] >= 1
                             and p, timeout=180, interval=1, what="the liveness probe restarting the operator")
    finally:
        if proc.is_running():
            os.kill(proc.pid, signal.SIGCONT)
    assert restarted["metadata"]["uid"] == started["metadata"]["uid"]  # the same Pod, its container restarted


# Posts one alert with the right token and one with a wrong one: the first
# reaches the operator's API request (404: no such InferenceService in the
# watched namespace), the second stops at the token (401).
WEBHOOK_CLIENT = """
import json, sys, urllib.error, urllib.request
alert = {"version": "4", "status": "firing", "receiver": "kubeloop-operator", "alerts": [{"status": "firing",
         "labels": {"alertname": "KubeloopDataDrift", "namespace": sys.argv[2], "inferenceservice": "none"},
         "annotations": {}, "startsAt": "2026-01-01T00:00:00Z", "fingerprint": "realnode00000001"}]}
def post(token):
    request = urllib.request.Request(sys.argv[1], json.dumps(alert).encode(), method="POST",
                                     headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    try:
        return urllib.request.urlopen(request, timeout=10).status
    except urllib.error.HTTPError as error:
        return error.code
codes = (post("s3cret-token"), post("wrong"))
print(codes)
assert codes == (404, 401), codes
"""


def node_pids(platform: Platform) -> list[int]:
    pids = [p.pid for p in platform.state().processes]
    return pids + [p.pid for p in host.node_processes(platform.dir)]


def assert_host_clean(state_dirs: list[Path], pids: list[int], sysctls_before: dict[str, str]) -> None:
    """Each kind of change the real node makes, checked with the host's own tools."""
    alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert alive == [], [psutil.Process(pid).cmdline() for pid in alive]
    mounts = Path("/proc/self/mountinfo").read_text()
    for state_dir in state_dirs:
        assert str(state_dir) not in mounts
        assert not state_dir.exists()
        assert not host.socket_dir(state_dir).exists()
    assert "/run/netns/cni-" not in mounts
    assert not list(Path("/sys/fs/cgroup").glob("*/kubepods"))
    assert not Path("/sys/class/net", host.BRIDGE).exists()
    for command in ("iptables", "ip6tables"):
        for table in host.TABLES:
            rules = subprocess.run([command, "-w", "5", "-t", table, "-S"], capture_output=True, text=True).stdout
            assert not [line for line in rules.splitlines() if any(p in line for p in host.CHAIN_PREFIXES)], \
                (command, table, rules)
    routes = subprocess.run(["ip", "route", "show", "type", "blackhole"], capture_output=True, text=True).stdout
    assert routes.strip() == ""
    assert sysctls() == sysctls_before
    assert not host.CLAIM.exists()
    # CNI results, shim and device-plugin sockets: paths the parts hard-code.
    for folder in ("/var/lib/cni", "/var/lib/kubelet", "/run/containerd", "/run/kubeloop"):
        assert not Path(folder).exists(), list(Path(folder).rglob("*"))


def test_dev_up_cleans_up_after_a_crashed_real_node_and_dev_down_leaves_nothing(real, served, tmp_path_factory):
    """Cluster path: a second real node is refused while one runs; a real
    node killed without teardown (every process
    SIGKILLed, its Pods' processes left running) is cleaned up by the next
    `dev up`, whose node removes the containers the crashed one left in the
    kept containerd root and then runs Pods; its `dev down` leaves no
    process, mount, cgroup, bridge, iptables chain, route or sysctl change
    behind."""
    served.close()  # the crash below takes the API server the operator needs to stop its local Triton
    # Beside the first node's state (the kubelet's sockets live under it, and
    # a test's own folder can be too long for them).
    refused = Platform(tmp_path_factory.mktemp("refused") / "state", real_node=True)
    with pytest.raises(NodeBusy, match=f"dev down --state-dir {real.platform.dir}"):
        refused.up()  # while the first node runs, a second is refused before it starts anything
    assert not refused.dir.exists()

    namespace = real.namespace()
    real.kube.create(pod("survivor", namespace, pause_image().ref))
    running(real.kube, "survivor", namespace)
    crashed = real.platform
    left = set(node.containers(crashed.node_paths))
    assert left, "the first node's Pods should have containers"
    pids = node_pids(crashed)
    # Found without its state directory too: a kubelet whose claim is gone
    # still holds the node's address and port from the next one.
    kubelet = next(r.pid for r in crashed.state().processes if r.name == "kubelet")
    assert kubelet in [p.pid for p in host.node_processes(None)]
    # A crash kills the platform's processes, not what they started (MLflow's server workers).
    pids += [child.pid for pid in pids if psutil.pid_exists(pid) for child in psutil.Process(pid).children(True)]
    for record in crashed.state().processes:
        os.kill(record.pid, signal.SIGKILL)
    assert host.leftovers(crashed.dir)["cgroups"], "the crash should have left the Pod's cgroups"

    second = Platform(tmp_path_factory.mktemp("second") / "state", real_node=True)
    try:
        second.up()
        kept = set(node.containers(second.node_paths))
        assert not kept & left, f"containers of the crashed node still in containerd: {sorted(kept & left)}"
        kube = second.kube()
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "after"}})
        wait_for(lambda: kube.get("v1", "ServiceAccount", "default", "after"), timeout=30, what="a ServiceAccount")
        kube.create(pod("after", "after", pause_image().ref))
        assert running(kube, "after", "after")["spec"]["nodeName"] == NODE_NAME
        pids += node_pids(second)
        kube.close()
    finally:
        second.down()
    assert_host_clean([crashed.dir, second.dir], pids, real.sysctls_before)
