"""Desired objects of an InferenceService, table-driven."""

from __future__ import annotations

import json

import pytest

from kubeloop.api.refs import ObjectRef
from kubeloop.api.serving import InferenceServiceSpec, ServingGPU
from kubeloop.gpu.placement import CPU, plan
from kubeloop.serving.builders.workloads import (
    ServingImages, build_children, effective_split, planned_replicas, split_replicas,
)
from kubeloop.registry.base import ModelVersion
from tests.unit.test_placement import fleet

REF = ObjectRef("InferenceService", "ml", "fraud", "uid-9", generation=3)
V1 = ModelVersion("fraud", "1", "s3://m/1")
V2 = ModelVersion("fraud", "2", "s3://m/2")


def spec(**fields):
    return InferenceServiceSpec.model_validate({"model": {"name": "fraud", "alias": "champion"}, **fields})


@pytest.mark.parametrize("total, percent, expected", [
    (1, 0, (1, 0)), (1, 20, (1, 1)), (5, 20, (4, 1)), (10, 20, (8, 2)), (4, 50, (2, 2)), (3, 99, (1, 2)),
    (0, 20, (0, 0)),
])
def test_replica_split(total, percent, expected):
    assert split_replicas(total, percent) == expected


def test_pods_run_restricted_and_owned():
    children = build_children(REF, spec(), {"primary": (V1, 100)}, CPU, ServingImages())
    deployment = next(c for c in children if c["kind"] == "Deployment")
    assert deployment["metadata"]["ownerReferences"][0]["uid"] == "uid-9"
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in pod["containers"] + pod["initContainers"]:
        ctx = container["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False and ctx["capabilities"] == {"drop": ["ALL"]}
        assert ctx["readOnlyRootFilesystem"] is True
    assert pod["initContainers"][0]["command"][3:] == ["models:/fraud/1", "--repository", "/models",
                                                       "--backend", "onnxruntime"]
    assert "nodeSelector" not in pod and "tolerations" not in pod


@pytest.mark.parametrize("backend", ["onnxruntime", "python"])
def test_the_puller_lays_out_the_repository_for_the_configured_triton_backend(backend):
    """Cluster path (builder): an image with only the python backend gets a
    python-backend repository from the init container."""
    children = build_children(REF, spec(), {"primary": (V1, 100)}, CPU, ServingImages(triton_backend=backend))
    puller = children[0]["spec"]["template"]["spec"]["initContainers"][0]
    assert puller["command"][-2:] == ["--backend", backend]


def test_placement_becomes_limits_selector_tolerations_and_env():
    decision = plan(ServingGPU(sharing="mps"), 4096, fleet())
    children = build_children(REF, spec(), {"primary": (V1, 100)}, decision, ServingImages())
    pod = children[0]["spec"]["template"]["spec"]
    triton = pod["containers"][0]
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["nodeSelector"]["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert {e["name"] for e in triton["env"]} == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                                                   "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"}


def test_canary_shadow_and_autoscaler_children():
    s = spec(autoscaling={"minReplicas": 5, "maxReplicas": 10}, shadow={"version": "2", "percent": 10})
    children = build_children(REF, s, {"primary": (V1, 80), "canary": (V2, 20), "shadow": (V2, 10)},
                              CPU, ServingImages())
    names = sorted((c["kind"], c["metadata"]["name"]) for c in children)
    assert names == [("Deployment", "fraud-predictor"), ("Deployment", "fraud-predictor-canary"),
                     ("Deployment", "fraud-predictor-shadow"), ("HorizontalPodAutoscaler", "fraud-predictor"),
                     ("Service", "fraud"), ("Service", "fraud-shadow")]
    replicas = {c["metadata"]["name"]: c["spec"].get("replicas") for c in children if c["kind"] == "Deployment"}
    # The HPA owns the primary's count: applying one would undo its scaling at every resync.
    assert replicas == {"fraud-predictor": None, "fraud-predictor-canary": 1, "fraud-predictor-shadow": 1}


@pytest.mark.parametrize("fields, percent, exact, expected", [
    ({"replicas": 3}, 0, False, {"primary": 3, "canary": 0, "shadow": 1}),
    ({"replicas": 1}, 20, False, {"primary": 1, "canary": 1, "shadow": 1}),
    ({"autoscaling": {"minReplicas": 5, "maxReplicas": 9}}, 20, False, {"primary": None, "canary": 1, "shadow": 1}),
    ({"autoscaling": {"minReplicas": 2, "maxReplicas": 9}}, 0, True, {"primary": None, "canary": 0, "shadow": 1}),
    ({"replicas": 4}, 20, True, {"primary": 4, "canary": 2, "shadow": 1}),
    ({"replicas": 0}, 20, False, {"primary": 0, "canary": 0, "shadow": 0}),
])
def test_planned_replicas(fields, percent, exact, expected):
    assert planned_replicas(spec(**fields), percent, exact) == expected


@pytest.mark.parametrize("requested, available, wanted, exact, expected", [
    # One primary and one canary replica behind one Service: 20% asked is 50% served.
    ({"primary": 80, "canary": 20}, {"primary": 1, "canary": 1}, {"primary": 1, "canary": 1}, False,
     {"primary": 50, "canary": 50}),
    ({"primary": 80, "canary": 20}, {"primary": 4, "canary": 1}, {"primary": 4, "canary": 1}, False,
     {"primary": 80, "canary": 20}),
    # The HPA scaled the primary to 9: the canary's one replica now gets a tenth.
    ({"primary": 80, "canary": 20}, {"primary": 9, "canary": 1}, {"primary": 9, "canary": 1}, False,
     {"primary": 90, "canary": 10}),
    # A canary not ready yet gets nothing.
    ({"primary": 80, "canary": 20}, {"primary": 4, "canary": 0}, {"primary": 4, "canary": 1}, False,
     {"primary": 100, "canary": 0}),
    # Nothing ready: what the wanted replicas will give.
    ({"primary": 80, "canary": 20}, {"primary": 0, "canary": 0}, {"primary": 1, "canary": 1}, False,
     {"primary": 50, "canary": 50}),
    # An HTTPRoute splits by weight whatever the replicas.
    ({"primary": 80, "canary": 20}, {"primary": 1, "canary": 1}, {"primary": 1, "canary": 1}, True,
     {"primary": 80, "canary": 20}),
    ({"primary": 100}, {"primary": 2}, {"primary": 2}, False, {"primary": 100}),
])
def test_effective_split(requested, available, wanted, exact, expected):
    assert effective_split(requested, available, wanted, exact) == expected


@pytest.mark.parametrize("gpu, device", [(None, None), ({"sharing": "mig", "memoryMib": 4096}, "gpu"),
                                         ({"sharing": "mps", "memoryMib": 4096}, "gpu"),
                                         ({"sharing": "exclusive", "memoryMib": 30000}, "gpu")])
def test_a_version_placed_on_a_gpu_is_fetched_with_gpu_instances(gpu, device):
    """Cluster path (builder): the init container asks for a GPU instance
    group wherever placement put the Pod on a GPU (MIG slice, MPS share, whole GPU)."""
    decision = plan(ServingGPU.model_validate(gpu), 4096, fleet()) if gpu else CPU
    children = build_children(REF, spec(), {"primary": (V1, 100)}, decision, ServingImages())
    command = children[0]["spec"]["template"]["spec"]["initContainers"][0]["command"]
    assert (command[command.index("--device") + 1] if "--device" in command else None) == device


def test_children_are_deterministic():
    a = build_children(REF, spec(), {"primary": (V1, 100)}, CPU, ServingImages())
    b = build_children(REF, spec(), {"primary": (V1, 100)}, CPU, ServingImages())
    assert a == b
    c = build_children(REF, spec(), {"primary": (V2, 100)}, CPU, ServingImages())
    key = "kubeloop.dev/input-hash"
    assert a[0]["metadata"]["annotations"][key] != c[0]["metadata"]["annotations"][key]


def test_with_a_gateway_an_httproute_splits_by_weight():
    images = ServingImages(gateway="gateways/public", gateway_domain="ml.example")
    s = spec(replicas=2, canary={"alias": "challenger", "percent": 20})
    children = build_children(REF, s, {"primary": (V1, 80), "canary": (V2, 20)}, CPU, images)
    route = next(c for c in children if c["kind"] == "HTTPRoute")
    assert route["spec"]["parentRefs"] == [{"name": "public", "namespace": "gateways"}]
    assert route["spec"]["hostnames"] == ["fraud.ml.ml.example"]
    assert [(b["name"], b["weight"]) for b in route["spec"]["rules"][0]["backendRefs"]] == [
        ("fraud-primary", 80), ("fraud-canary", 20)]
    services = {c["metadata"]["name"]: c["spec"]["selector"] for c in children if c["kind"] == "Service"}
    assert services["fraud-canary"]["kubeloop.dev/role"] == "canary"
    assert "kubeloop.dev/role" not in services["fraud"]
    replicas = {c["metadata"]["name"]: c["spec"]["replicas"] for c in children if c["kind"] == "Deployment"}
    assert replicas == {"fraud-predictor": 2, "fraud-predictor-canary": 1}


def test_a_stuck_rollout_is_detected():
    from kubeloop.serving.builders.workloads import rollout_failed

    stuck = {"status": {"conditions": [{"type": "Progressing", "status": "False",
                                        "reason": "ProgressDeadlineExceeded", "message": "timed out"}]}}
    assert rollout_failed(stuck) == "timed out"
    progressing = {"status": {"conditions": [{"type": "Progressing", "status": "True",
                                              "reason": "NewReplicaSetAvailable"}]}}
    assert rollout_failed(progressing) is None and rollout_failed({}) is None


def _pod(name: str, *containers: dict, init: tuple[dict, ...] = ()) -> dict:
    return {"metadata": {"name": name}, "status": {"containerStatuses": list(containers),
                                                   "initContainerStatuses": list(init)}}


@pytest.mark.parametrize("pods, expected", [
    ([_pod("p", {"name": "triton", "restartCount": 0, "state": {"running": {}}})], []),
    ([_pod("p", {"name": "triton", "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}})], []),
    ([_pod("p", {"name": "triton", "restartCount": 1, "state": {"running": {}},
                 "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137, "finishedAt": "T1"}}})],
     ["p/triton restarted 1x (last: OOMKilled at T1)"]),
    ([_pod("p", {"name": "triton", "restartCount": 3, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                 "lastState": {"terminated": {"exitCode": 1, "finishedAt": "T2"}}})],
     ["p/triton restarted 3x (last: exit 1 at T2) now CrashLoopBackOff"]),
    ([_pod("q", init=({"name": "model-puller", "restartCount": 0,
                       "state": {"waiting": {"reason": "ErrImageNeverPull"}}},))],
     ["q/model-puller now ErrImageNeverPull"]),
], ids=["running", "starting", "oom-killed-and-back", "crash-looping", "image-missing"])
def test_container_troubles_say_why_replicas_are_missing(pods, expected):
    """Cluster path (pure): what the kubelet reports about a version's Pods
    becomes the Deployed condition's message."""
    from kubeloop.serving.builders.workloads import container_troubles

    assert container_troubles(pods) == expected


def test_the_kubernetes_backend_says_why_replicas_are_missing_and_keeps_the_record_after_recovery():
    """Cluster path (backend, objects in memory): a Pod whose Triton was
    OOM-killed makes the missing replica an outage (failing) named in the
    message; once the Deployment is available again the restart stays on record."""
    from kubeloop.serving.base import ServedVersion, ServingRequest
    from kubeloop.serving.kubernetes import KubernetesServing
    from tests.unit.fakes import FakeObjects

    objects = FakeObjects()
    backend = KubernetesServing(objects, ServingImages())
    request = ServingRequest(REF, spec(), (ServedVersion("primary", V1, 100),), CPU)
    starting = backend.ensure(request)
    assert (starting.primary_ready, starting.failing, starting.message) == (False, False,
                                                                            "primary: 0/1 replicas available")
    labels = objects.get("apps/v1", "Deployment", "fraud-predictor", "ml")["spec"]["template"]["metadata"]["labels"]
    oom = {"name": "triton", "restartCount": 1, "state": {"running": {}},
           "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137, "finishedAt": "T1"}}}
    objects.apply({"kind": "Pod", "metadata": {"name": "p", "namespace": "ml", "labels": labels},
                   "status": {"containerStatuses": [oom]}})
    outage = backend.ensure(request)
    assert outage.failing and not outage.primary_ready
    assert outage.message == "primary: 0/1 replicas available; primary: p/triton restarted 1x (last: OOMKilled at T1)"
    objects.set_status("Deployment", "ml", "fraud-predictor", availableReplicas=1, updatedReplicas=1)
    recovered = backend.ensure(request)
    assert recovered.primary_ready and not recovered.failing
    assert recovered.message == "primary: p/triton restarted 1x (last: OOMKilled at T1)"


FRONT = ServingImages(router="kubeloop/runtime:1", request_log="s3://requests", object_store_secret="logs-s3",
                      object_store_endpoint="http://s3.storage:8333")


def _front_request(**fields):
    from kubeloop.serving.base import ServedVersion, ServingRequest

    s = spec(canary={"alias": "challenger", "percent": 20}, shadow={"version": "3", "percent": 10}, **fields)
    versions = (ServedVersion("primary", V1, 80), ServedVersion("canary", V2, 20),
                ServedVersion("shadow", ModelVersion("fraud", "3", "s3://m/3"), 10))
    return ServingRequest(REF, s, versions, CPU)


def test_with_the_front_the_service_selects_the_router_and_each_version_has_its_own_service():
    """Cluster path (builder): the router is the entry; it calls each
    version's Triton through that version's Service."""
    from kubeloop.serving.kubernetes import KubernetesServing
    from tests.unit.fakes import FakeObjects

    objects = FakeObjects()
    state = KubernetesServing(objects, FRONT).ensure(_front_request(replicas=5))
    services = {name: o["spec"]["selector"] for (kind, _ns, name), o in objects.objects.items() if kind == "Service"}
    assert services == {
        "fraud": {"kubeloop.dev/inferenceservice": "fraud", "kubeloop.dev/role": "router"},
        "fraud-primary": {"kubeloop.dev/inferenceservice": "fraud", "kubeloop.dev/role": "primary"},
        "fraud-canary": {"kubeloop.dev/inferenceservice": "fraud", "kubeloop.dev/role": "canary"},
        "fraud-shadow": {"kubeloop.dev/inferenceservice": "fraud", "kubeloop.dev/role": "shadow"}}
    replicas = {name: o["spec"]["replicas"] for (kind, _ns, name), o in objects.objects.items() if kind == "Deployment"}
    # The router splits by request key: each version keeps the replicas it needs.
    assert replicas == {"fraud-predictor": 5, "fraud-predictor-canary": 2, "fraud-predictor-shadow": 1,
                        "fraud-router": 2}
    routes = json.loads(objects.objects[("ConfigMap", "ml", "fraud-router")]["data"]["router.json"])
    assert routes["routes"] == [{"role": "primary", "version": "1", "percent": 80},
                                {"role": "canary", "version": "2", "percent": 20}]
    assert routes["shadow"] == {"role": "shadow", "version": "3", "percent": 10}
    assert routes["compare"] == {"percent": 25}  # 25% of a 20% canary: 5% of all requests paired
    assert routes["version_urls"] == {"1": "http://fraud-primary.ml.svc.cluster.local",
                                      "2": "http://fraud-canary.ml.svc.cluster.local",
                                      "3": "http://fraud-shadow.ml.svc.cluster.local"}
    assert routes["request_log"] == "s3://requests/ml-fraud" and routes["triton_model"] == "fraud"
    # gRPC reaches the router on Triton's gRPC port of the service's Service, as without the router.
    front = objects.objects[("Service", "ml", "fraud")]["spec"]["ports"]
    assert {p["name"]: (p["port"], p["targetPort"]) for p in front} == {"http": (80, "http"), "grpc": (8001, "grpc")}
    router = objects.objects[("Deployment", "ml", "fraud-router")]["spec"]["template"]["spec"]["containers"][0]
    assert router["ports"] == [{"name": "http", "containerPort": 8080}, {"name": "grpc", "containerPort": 8081}]
    assert router["command"][router["command"].index("--grpc-port") + 1] == "8081"
    assert state.grpc_address == "fraud.ml.svc.cluster.local:8001"


def test_the_router_runs_restricted_with_its_routes_and_the_object_stores_secret_by_reference():
    from kubeloop.serving.builders.workloads import build_router

    config = {"routes": [{"role": "primary", "version": "1", "percent": 100}]}
    config_map, deployment = build_router(REF, spec(), config, FRONT)
    pod = deployment["spec"]["template"]["spec"]
    router = pod["containers"][0]
    assert router["image"] == "kubeloop/runtime:1" and router["command"][-2:] == ["--host", "0.0.0.0"]
    assert router["securityContext"]["readOnlyRootFilesystem"] is True and pod["securityContext"]["runAsNonRoot"]
    assert router["envFrom"] == [{"secretRef": {"name": "logs-s3"}}]
    assert router["env"] == [{"name": name, "value": "http://s3.storage:8333"}
                             for name in ("AWS_ENDPOINT_URL_S3", "FEAST_S3_ENDPOINT_URL")]
    assert json.loads(config_map["data"]["router.json"]) == config
    assert pod["volumes"][0] == {"name": "routes", "configMap": {"name": "fraud-router"}}
    moved = build_router(REF, spec(), {"routes": [{"role": "primary", "version": "2", "percent": 100}]}, FRONT)[1]
    key = "kubeloop.dev/routes-hash"
    # New routes roll the router rather than wait for the kubelet's volume sync.
    assert moved["spec"]["template"]["metadata"]["annotations"][key] != \
        deployment["spec"]["template"]["metadata"]["annotations"][key]


def test_with_the_front_status_gets_the_split_asked_and_the_shadows_mirrored_share():
    from kubeloop.serving.kubernetes import KubernetesServing
    from tests.unit.fakes import FakeObjects

    objects = FakeObjects()
    backend = KubernetesServing(objects, FRONT)
    first = backend.ensure(_front_request(replicas=1))
    assert first.traffic == {"primary": 80, "canary": 20, "shadow": 10}
    assert not first.primary_ready
    for (kind, ns, name), obj in list(objects.objects.items()):
        if kind == "Deployment":
            want = obj["spec"]["replicas"]
            objects.set_status(kind, ns, name, availableReplicas=want, updatedReplicas=want)
    served = backend.ensure(_front_request(replicas=1))
    assert served.primary_ready and "router" not in served.ready
    # Triton replicas only: 1 primary, 1 canary, 1 shadow (the router's one is not a model replica).
    assert served.ready_replicas == 3


def test_without_an_object_store_the_cluster_backend_keeps_no_request_log():
    """A folder in a router's Pod would vanish with it."""
    from kubeloop.serving.kubernetes import KubernetesServing
    from tests.unit.fakes import FakeObjects

    assert KubernetesServing(FakeObjects(), FRONT).request_log(REF, spec()) == "s3://requests/ml-fraud"
    folder = ServingImages(router="r", request_log="/var/log/requests")
    assert KubernetesServing(FakeObjects(), folder).request_log(REF, spec()) is None
    assert KubernetesServing(FakeObjects(), ServingImages()).request_log(REF, spec()) is None
    given = spec(requestLogging={"destination": "s3://team/logs"})
    assert KubernetesServing(FakeObjects(), FRONT).request_log(REF, given) == "s3://team/logs"


@pytest.mark.parametrize("canary, paired", [(0, 0), (1, 100), (5, 100), (10, 50), (20, 25), (50, 10), (100, 5)])
def test_the_paired_share_keeps_the_extra_load_at_five_percent_of_requests(canary, paired):
    """Local and cluster routers take the same config: every request of a
    small first step is paired, a large step a few."""
    from kubeloop.serving.routes import compare_percent

    assert compare_percent(canary) == paired
    assert canary * paired / 100 <= 5 or canary < 5


def test_the_backends_list_a_services_children_for_unwanted_ones_only_when_what_it_wants_changed():
    """Cluster path (backends, objects in memory): once a service's unwanted
    children are gone, reconciles that want the same children list none of
    its kinds (at 5,000 services those LISTs were most of what the API server
    was asked); a canary that leaves, an operator that starts again, or a
    move to the other backend and back lists again, and what is unwanted goes."""
    from kubeloop.serving.base import ServedVersion, ServingRequest
    from kubeloop.serving.steady import CleanedUp
    from kubeloop.serving.kserve import KServeServing
    from kubeloop.serving.kubernetes import KubernetesServing
    from tests.unit.fakes import FakeObjects

    class Counting(FakeObjects):
        def __init__(self):
            super().__init__()
            self.listed = []

        def list(self, api_version, kind, namespace=None, label_selector=None, field_selector=None):  # noqa: ANN001
            if kind != "Pod":
                self.listed.append(kind)
            return super().list(api_version, kind, namespace, label_selector, field_selector)

    objects, cleaned = Counting(), CleanedUp()
    backend = KubernetesServing(objects, ServingImages(), cleaned=cleaned)
    both = ServingRequest(REF, spec(canary={"alias": "challenger", "percent": 20}),
                          (ServedVersion("primary", V1, 80), ServedVersion("canary", V2, 20)), CPU)
    alone = ServingRequest(REF, spec(), (ServedVersion("primary", V1, 100),), CPU)

    def listed(serving, request) -> list[str]:  # noqa: ANN001
        objects.listed.clear()
        serving.ensure(request)
        return sorted(objects.listed)

    owned = sorted(["Deployment", "Service", "ConfigMap", "HorizontalPodAutoscaler"])
    assert listed(backend, both) == owned
    assert listed(backend, both) == []
    assert ("Deployment", "ml", "fraud-predictor-canary") in objects.objects
    assert listed(backend, alone) == owned
    assert ("Deployment", "ml", "fraud-predictor-canary") not in objects.objects
    assert listed(backend, alone) == []
    assert listed(KubernetesServing(objects, ServingImages()), alone) == owned  # a new process remembers nothing
    kserve = KServeServing(objects, ServingImages(), cleaned=cleaned)
    assert "InferenceService" in listed(kserve, alone)
    assert ("Deployment", "ml", "fraud-predictor") not in objects.objects  # the kubernetes backend's went
    assert listed(backend, alone) == owned
    backend.delete(REF)
    assert listed(backend, alone) == owned


def test_the_clean_up_record_is_bounded_and_a_dropped_service_is_listed_again():
    """Unit: beyond its bound the least recently cleaned service is dropped;
    that one is due again (listed once more), the others are not."""
    from kubeloop.serving.steady import CleanedUp

    cleaned = CleanedUp(kept=2)
    refs = [ObjectRef("InferenceService", "ml", f"s{i}", f"uid-{i}") for i in range(3)]
    wanted = ("kubernetes", frozenset({("Deployment", "x")}))
    for ref in refs:
        cleaned.done(ref, wanted)
    assert [cleaned.due(ref, wanted) for ref in refs] == [True, False, False]


def test_a_child_nobody_changed_since_its_apply_is_read_not_applied_again():
    """Unit (an API in memory that versions what it holds): the same object
    applied again is one GET; a change by anyone else, a changed object, a
    deleted child or a new process applies again; each answer is the object as held."""
    import copy

    from kubeloop.serving.steady import Applied

    class Versioned:
        def __init__(self):
            self.held, self.version, self.calls = {}, 0, []

        def _bump(self, obj: dict) -> dict:
            self.version += 1
            obj["metadata"]["resourceVersion"] = str(self.version)
            self.held[obj["metadata"]["name"]] = obj
            return copy.deepcopy(obj)

        def apply(self, obj: dict) -> dict:
            self.calls.append("apply")
            return self._bump({**copy.deepcopy(obj), "status": {"ready": 1}})

        def get(self, api_version, kind, name, namespace=None):  # noqa: ANN001
            self.calls.append("get")
            return copy.deepcopy(self.held.get(name))

    kube = Versioned()
    applied = Applied(kube)
    obj = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "ml"}, "spec": {"a": 1}}

    def calls(child: dict, by: Applied = applied) -> list[str]:
        kube.calls.clear()
        answer = by.apply(child)
        assert answer == kube.held["s"]
        return list(kube.calls)

    assert calls(obj) == ["apply"]
    assert calls(obj) == ["get"]
    kube._bump({**kube.held["s"], "spec": {"a": 2}})  # edited by hand
    assert calls(obj) == ["get", "apply"]
    assert kube.held["s"]["spec"] == {"a": 1}
    assert calls({**obj, "spec": {"a": 3}}) == ["apply"]
    del kube.held["s"]  # deleted by hand
    assert calls({**obj, "spec": {"a": 3}}) == ["get", "apply"]
    assert calls({**obj, "spec": {"a": 3}}, Applied(kube)) == ["apply"]

    # What must run before an apply (the hand-over of an HPA's replica count)
    # gets the child as it is, from the one read, and only where it is applied.
    seen = []
    applied.apply({**obj, "spec": {"a": 3}})
    kube.calls.clear()
    applied.apply({**obj, "spec": {"a": 3}}, before=seen.append)
    assert (kube.calls, seen) == (["get"], [])  # unchanged: not applied, nothing before
    kube._bump({**kube.held["s"], "spec": {"a": 4}})
    kube.calls.clear()
    applied.apply({**obj, "spec": {"a": 3}}, before=seen.append)
    assert kube.calls == ["get", "apply"] and [o["spec"] for o in seen] == [{"a": 4}]
    kube.calls.clear()
    applied.apply({**obj, "spec": {"a": 5}}, before=seen.append)  # changed: read for `before` alone
    assert kube.calls == ["get", "apply"] and [o["spec"] for o in seen] == [{"a": 4}, {"a": 3}]
    del kube.held["s"]
    applied.apply({**obj, "spec": {"a": 6}}, before=seen.append)
    assert seen[-1] is None
