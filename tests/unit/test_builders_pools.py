"""A pool on the cluster as objects (kubeloop.serving.builders.pools), and
why a service cannot join one there. Unit, plain data; the Pod running on
the real node is tests/e2e/test_real_node.py (cluster path)."""

from __future__ import annotations

import json
from pathlib import Path

from kubeloop.front import poolfront
from kubeloop.serving.base import PoolSize
from kubeloop.serving.builders.pools import (
    LABEL_ROUTES_SHARD, MEMBER_PORT, MEMBER_STOP_DELAY_SECONDS, POD_IP, ROUTE_SHARDS, ROUTES_DIR, SERVED_DIR, STOP_DELAY_SECONDS, build_pool,
    build_routes, front_config, route_manager, route_shard,
)
from kubeloop.serving.builders.workloads import MODEL_REPOSITORY, ServingImages
from kubeloop.serving.clusterpools import ClusterPools
from kubeloop.serving.poolsync import PoolFolders

SIZE = PoolSize(members=3, memory_mib=400, spread_at=2)
IMAGES = ServingImages(triton="triton:1", puller="runtime:1", router="runtime:1", triton_backend="python",
                       tracking_uri="http://mlflow:5000")


def by_kind(objects: list[dict]) -> dict[str, dict]:
    """Each object by its kind; the pool's second Service (its Pods' peers) by "Peers"."""
    return {"Peers" if o["metadata"]["name"].endswith("-peers") else o["kind"]: o for o in objects}


def test_one_pod_holds_the_front_the_repository_container_and_each_member():
    objects = by_kind(build_pool("shared", SIZE, "kubeloop-system", IMAGES))
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    assert objects["Deployment"]["spec"]["replicas"] == 1
    # Rolled a new Pod before an old one goes: the pool's services stay answered through a change of size.
    assert objects["Deployment"]["spec"]["strategy"] == {"type": "RollingUpdate",
                                                         "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    assert pod["shareProcessNamespace"] is True and pod["automountServiceAccountToken"] is False
    containers = {c["name"]: c for c in pod["containers"]}
    assert list(containers) == ["front", "repository", "member-0", "member-1", "member-2"]
    assert all(c["securityContext"]["runAsNonRoot"] and c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
               for c in containers.values())
    member = containers["member-2"]
    assert f"--http-port={MEMBER_PORT + 20}" in member["args"] and "--model-control-mode=explicit" in member["args"]
    assert member["resources"]["limits"]["memory"] == f"{400 + 512}Mi"
    sync = containers["repository"]["command"]
    assert sync[:3] == ["kubeloop", "serving", "pool-sync"] and sync[sync.index("--backend") + 1] == "python"
    mounts = {m["name"]: m for m in containers["front"]["volumeMounts"]}
    # The front reads only what the repository container handed over, never the ConfigMap itself.
    assert mounts["served"]["mountPath"] == SERVED_DIR and "routes" not in mounts
    # It reads a model's config (to load it without a version that cannot load), never writes one.
    assert mounts["models"] == {"name": "models", "mountPath": MODEL_REPOSITORY, "readOnly": True}
    assert {m["name"]: m["mountPath"] for m in containers["repository"]["volumeMounts"]}["routes"] == ROUTES_DIR
    assert objects["Service"]["spec"]["selector"] == objects["Deployment"]["spec"]["selector"]["matchLabels"]
    # Every container keeps serving while the stopping Pod leaves the Service's endpoints, and the
    # members outlive the front's grace for the requests it still has (other Pods may send it some).
    delay = {name: c["lifecycle"]["preStop"]["sleep"]["seconds"] for name, c in containers.items()}
    assert delay == {"front": STOP_DELAY_SECONDS, "repository": STOP_DELAY_SECONDS,
                     **dict.fromkeys(("member-0", "member-1", "member-2"), MEMBER_STOP_DELAY_SECONDS)}
    assert MEMBER_STOP_DELAY_SECONDS >= STOP_DELAY_SECONDS + 10, "the front waits up to 10 s for requests under way"
    assert pod["terminationGracePeriodSeconds"] > MEMBER_STOP_DELAY_SECONDS


def test_each_front_finds_its_peers_by_a_headless_service_of_the_ready_pods_and_itself_by_its_pod_ip():
    objects = by_kind(build_pool("shared", SIZE, "team-ns", IMAGES))
    peers = objects["Peers"]
    assert peers["spec"]["clusterIP"] == "None" and not peers["spec"].get("publishNotReadyAddresses")
    assert peers["spec"]["selector"] == objects["Deployment"]["spec"]["selector"]["matchLabels"]
    config = json.loads(objects["ConfigMap"]["data"]["pool.json"])
    assert config["peers"] == {"host": "kubeloop-pool-shared-peers.team-ns.svc.cluster.local", "port": 8080}
    assert peers["spec"]["ports"][0]["port"] == config["peers"]["port"]
    front = next(c for c in objects["Deployment"]["spec"]["template"]["spec"]["containers"] if c["name"] == "front")
    env = {e["name"]: e for e in front["env"]}
    assert POD_IP == poolfront.POD_IP, "the builder sets the variable the front reads"
    assert env[POD_IP]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}


def test_replicas_are_whole_pools_and_a_new_count_changes_no_pod():
    three = PoolSize(members=3, memory_mib=400, spread_at=2, replicas=3)
    deployment = by_kind(build_pool("shared", three, "ns", IMAGES))["Deployment"]
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["template"] == by_kind(build_pool("shared", SIZE, "ns", IMAGES))["Deployment"]["spec"][
        "template"], "a new count of replicas adds or removes Pods, it rolls none"


def test_the_fronts_members_are_found_by_port_with_the_budget_the_operator_sized():
    config = front_config("shared", "ns", SIZE)
    grpc_port = MEMBER_PORT + 11
    assert config["members"]["member-1"] == {"url": f"http://127.0.0.1:{MEMBER_PORT + 10}",
                                             "grpc": f"127.0.0.1:{grpc_port}", "budget_mib": 400}
    containers = by_kind(build_pool("shared", SIZE, "ns", IMAGES))["Deployment"]["spec"]["template"]["spec"]["containers"]
    member = next(c for c in containers if c["name"] == "member-1")
    assert f"--grpc-port={grpc_port}" in member["args"], "the pool loads models through the member's own gRPC port"
    assert config["spread_at"] == 2 and config["routes"] == SERVED_DIR and config["repository"] == MODEL_REPOSITORY
    # The front is ready once the file the repository container writes after its first round is there.
    served = PoolFolders(Path(ROUTES_DIR), Path(SERVED_DIR), Path("/models"), Path("/work"))
    assert config["synced"] == str(served.synced)
    data = json.loads(by_kind(build_pool("shared", SIZE, "ns", IMAGES))["ConfigMap"]["data"]["pool.json"])
    assert data == config


def test_a_new_size_restarts_the_pool_and_a_new_service_does_not():
    pod = lambda size: by_kind(build_pool("shared", size, "ns", IMAGES))["Deployment"]["spec"]["template"]  # noqa: E731
    assert pod(SIZE) == pod(PoolSize(members=3, memory_mib=400, spread_at=2))
    assert pod(SIZE)["metadata"]["annotations"] != pod(PoolSize(members=3, memory_mib=500))["metadata"]["annotations"]


def test_each_service_owns_one_key_of_its_shard_of_the_routes_configmaps():
    joined = build_routes("shared", "ns", "team.fraud.json", {"routes": []})
    left = build_routes("shared", "ns", "team.fraud.json", None)
    assert list(joined["data"]) == ["team.fraud.json"] and "data" not in left
    assert joined["metadata"] == left["metadata"]
    assert joined["metadata"]["labels"][LABEL_ROUTES_SHARD] == str(route_shard("team.fraud.json"))
    assert route_manager("team.fraud") != route_manager("team.churn")
    # The Pod sees every shard's keys in one folder, before any shard exists.
    volume = next(v for v in by_kind(build_pool("shared", SIZE, "ns", IMAGES))["Deployment"]["spec"]["template"]
                  ["spec"]["volumes"] if v["name"] == "routes")
    names = [source["configMap"]["name"] for source in volume["projected"]["sources"]]
    assert len(set(names)) == ROUTE_SHARDS and joined["metadata"]["name"] in names
    assert all(source["configMap"]["optional"] for source in volume["projected"]["sources"])


def entity_request():
    """A service that reads the fraud example's features, with a canary of
    another version: the larger kind of router file."""
    from kubeloop.api.serving import InferenceServiceSpec
    from kubeloop.api.signature import TAG, ModelSignature
    from kubeloop.gpu.placement import CPU
    from kubeloop.registry.base import ModelVersion
    from kubeloop.registry.tags import FEATURE_STORE
    from kubeloop.serving.base import ServedVersion, ServingRequest
    from tests.unit.test_builders_serving import REF

    signature = ModelSignature(
        feature_columns=[f"{view}_{i}" for view in ("card_activity", "card_profile", "merchant_risk") for i in range(6)],
        feature_views=["card_activity", "card_profile", "merchant_risk", "transaction_context"],
        entities=["card_id", "merchant_id"], request_columns=["amount", "hour", "channel"])
    store = json.dumps({"config": "project: fraud\nregistry: s3://feast/fraud/registry.db\nprovider: local\n"
                                  "online_store:\n  type: redis\n  connection_string: redis.feast.svc:6379\n"})
    versions = [ModelVersion("fraud", v, f"runs:/{v}", tags={TAG: signature.to_json(), FEATURE_STORE: store})
                for v in ("3", "4")]
    spec = InferenceServiceSpec.model_validate({"model": {"name": "fraud", "alias": "champion"},
                                                "canary": {"alias": "challenger", "percent": 10}})
    return ServingRequest(REF, spec, (ServedVersion("primary", versions[0], 90),
                                      ServedVersion("canary", versions[1], 10)), CPU)


def test_five_thousand_services_routes_fit_their_shards_within_a_configmaps_limit():
    """Router files as the operator writes them for pooled services that
    read features: 5,000 services spread so that no shard nears the API
    server's 1 MiB, where one ConfigMap held a few hundred."""
    from kubeloop.serving.routes import build_router_config

    request, shards = entity_request(), {}
    for i in range(5000):
        key = f"team-{i % 40}.service-{i:04d}.json"
        built = build_routes("shared", "ns", key, build_router_config(
            request, key[:-5], "", "s3://requests/x", ("primary", "canary", "shadow"), published_stores_only=True))
        name = built["metadata"]["name"]
        shards[name] = shards.get(name, 0) + len(key) + len(built["data"][key])
    assert len(shards) == ROUTE_SHARDS
    assert max(shards.values()) < 0.75 * 2**20, max(shards.values())
    assert sum(shards.values()) > 2**20  # more than one ConfigMap could hold


def test_a_pool_needs_the_front_the_operators_namespace_and_a_size():
    sizes = {"shared": SIZE}
    no_front = ClusterPools(None, ServingImages(), sizes, "kubeloop-system").problem("shared")
    assert "KUBELOOP_ROUTER_IMAGE" in no_front and "spec.pool shared" in no_front
    assert "KUBELOOP_OPERATOR_NAMESPACE" in ClusterPools(None, IMAGES, sizes, None).problem("shared")
    assert "no pool 'other'" in ClusterPools(None, IMAGES, sizes, "kubeloop-system").problem("other")
    assert ClusterPools(None, IMAGES, sizes, "kubeloop-system").problem("shared") is None


class PoolPodsKube:
    """The pool's Pods, and which of their fronts answer the model ready (a fake of one module's I/O)."""

    def __init__(self, pods: list[dict], taken_up: set[str]):
        self.pods, self.taken_up, self.asked = pods, taken_up, []
        self.failed: dict[str, str] = {}
        """Version -> why the fronts say its load failed."""
        self.answering: dict[str, str] = {}
        """Pod -> the version its front answers the model with (not there: none)."""

    def list(self, api_version, kind, namespace, selector):  # noqa: ANN001, ANN201
        return self.pods

    def request(self, method, path, timeout):  # noqa: ANN001, ANN201
        from kubeloop.kube import KubeError

        pod = path.split("/pods/")[1].split(":")[0]
        self.asked.append(pod)
        if pod not in self.taken_up:
            raise KubeError(404, "Not Found", "pool shared serves no model")
        version = path.split("/versions/")[1].split("/")[0]
        if version in self.failed:
            raise KubeError(503, "Service Unavailable", f"version {version} failed to load: {self.failed[version]}")
        return {}


    def headers(self, method, path, timeout):  # noqa: ANN001, ANN201
        from kubeloop.kube import KubeError

        pod = path.split("/pods/")[1].split(":")[0]
        if pod not in self.answering:
            raise KubeError(404, "Not Found", "pool shared serves no model")
        return {"X-Model-Version": self.answering[pod]}


def pool_pod(name: str, ready: bool = True, stopping: bool = False) -> dict:
    metadata = {"name": name, **({"deletionTimestamp": "2026-12-05T06:00:00Z"} if stopping else {})}
    return {"metadata": metadata, "status": {"conditions": [{"type": "Ready", "status": str(ready)}],
                                             "containerStatuses": []}}


def test_a_pooled_service_is_ready_once_every_pod_its_service_sends_requests_to_has_taken_it_up():
    """Unit, plain data: with two pool Pods, a service one front has not
    taken up yet is not Ready (a request could reach that Pod); a Pod not
    yet Ready, or stopping, gets no requests and is not asked."""
    deployment = {"metadata": {"generation": 2}, "status": {"observedGeneration": 2, "availableReplicas": 2}}
    pods = [pool_pod("pool-a"), pool_pod("pool-b"), pool_pod("pool-new", ready=False), pool_pod("pool-old", stopping=True)]
    kube = PoolPodsKube(pods, taken_up={"pool-a"})
    pools = ClusterPools(kube, IMAGES, {"shared": SIZE}, "ns")
    waiting = pools._observe("shared", "ns.fraud", deployment, {"primary": "1"})
    assert waiting.ready == {"primary": False} and "pool-b is taking up ns.fraud" in waiting.message
    assert sorted(kube.asked) == ["pool-a", "pool-b"]
    kube.taken_up.add("pool-b")
    serving = pools._observe("shared", "ns.fraud", deployment, {"primary": "1"})
    assert serving.ready == {"primary": True} and serving.ready_replicas == 2 and serving.message == ""


def test_while_the_fronts_take_up_a_new_primary_the_old_version_is_said_to_answer():
    """Unit, plain data: a new primary version one Pod's front has not
    taken up is not ready, but both fronts still answer the service (one
    with the old version): the old version answers, and the Pods count as
    serving; once neither front answers, nothing does."""
    deployment = {"metadata": {"generation": 1}, "status": {"observedGeneration": 1, "availableReplicas": 2}}
    kube = PoolPodsKube([pool_pod("pool-a"), pool_pod("pool-b")], taken_up={"pool-a"})
    kube.answering = {"pool-a": "3", "pool-b": "1"}
    pools = ClusterPools(kube, IMAGES, {"shared": SIZE}, "ns")
    state = pools._observe("shared", "ns.fraud", deployment, {"primary": "3"})
    assert (state.ready, state.answering, state.ready_replicas) == ({"primary": False}, "1", 2), state
    kube.answering = {}
    state = pools._observe("shared", "ns.fraud", deployment, {"primary": "3"})
    assert (state.answering, state.ready_replicas) == (None, 0), state
    kube.taken_up.add("pool-b")
    state = pools._observe("shared", "ns.fraud", deployment, {"primary": "3"})
    assert (state.ready, state.answering) == ({"primary": True}, None), state


def test_a_pooled_canary_whose_version_failed_to_load_is_rolled_back_and_the_primary_stays_ready():
    """Unit, plain data: Triton loads a model's versions all or none, so a
    canary version the fronts say failed to load is rolled back (to leave
    the model), while the primary, which the fronts answer ready, stays."""
    deployment = {"metadata": {"generation": 1}, "status": {"observedGeneration": 1, "availableReplicas": 1}}
    kube = PoolPodsKube([pool_pod("pool-a")], taken_up={"pool-a"})
    kube.failed["2"] = "Internal: InvalidProtobuf"
    pools = ClusterPools(kube, IMAGES, {"shared": SIZE}, "ns")
    state = pools._observe("shared", "ns.fraud", deployment, {"primary": "1", "canary": "2"})
    assert state.rolled_back == ("canary",) and state.ready == {"primary": True}, state
    assert "version 2 failed to load: Internal: InvalidProtobuf" in state.message
    kube.failed["1"] = "Internal: InvalidProtobuf"  # the primary's own version: nothing to roll back to
    state = pools._observe("shared", "ns.fraud", deployment, {"primary": "1", "canary": "2"})
    assert state.rolled_back == () and state.ready == {"primary": False, "canary": False}, state
