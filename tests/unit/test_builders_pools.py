"""A pool on the cluster as objects (kubeloop.serving.builders.pools), and
why a service cannot join one there. Unit, plain data; the Pod running on
the real node is tests/e2e/test_real_node.py (cluster path)."""

from __future__ import annotations

import json

from kubeloop.serving.base import PoolSize
from kubeloop.serving.builders.pools import (
    MEMBER_PORT, ROUTES_DIR, SERVED_DIR, build_pool, build_routes, front_config, route_manager,
)
from kubeloop.serving.builders.workloads import ServingImages
from kubeloop.serving.clusterpools import ClusterPools

SIZE = PoolSize(members=3, memory_mib=400, spread_at=2)
IMAGES = ServingImages(triton="triton:1", puller="runtime:1", router="runtime:1", triton_backend="python",
                       tracking_uri="http://mlflow:5000")


def by_kind(objects: list[dict]) -> dict[str, dict]:
    return {o["kind"]: o for o in objects}


def test_one_pod_holds_the_front_the_repository_container_and_each_member():
    objects = by_kind(build_pool("shared", SIZE, "kubeloop-system", IMAGES))
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    assert objects["Deployment"]["spec"]["replicas"] == 1
    assert objects["Deployment"]["spec"]["strategy"] == {"type": "Recreate"}
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
    assert {m["name"]: m["mountPath"] for m in containers["repository"]["volumeMounts"]}["routes"] == ROUTES_DIR
    assert objects["Service"]["spec"]["selector"] == objects["Deployment"]["spec"]["selector"]["matchLabels"]


def test_the_fronts_members_are_found_by_port_with_the_budget_the_operator_sized():
    config = front_config("shared", SIZE)
    assert config["members"]["member-1"] == {"url": f"http://127.0.0.1:{MEMBER_PORT + 10}", "budget_mib": 400}
    assert config["spread_at"] == 2 and config["routes"] == SERVED_DIR
    data = json.loads(by_kind(build_pool("shared", SIZE, "ns", IMAGES))["ConfigMap"]["data"]["pool.json"])
    assert data == config


def test_a_new_size_restarts_the_pool_and_a_new_service_does_not():
    pod = lambda size: by_kind(build_pool("shared", size, "ns", IMAGES))["Deployment"]["spec"]["template"]  # noqa: E731
    assert pod(SIZE) == pod(PoolSize(members=3, memory_mib=400, spread_at=2))
    assert pod(SIZE)["metadata"]["annotations"] != pod(PoolSize(members=3, memory_mib=500))["metadata"]["annotations"]


def test_each_service_owns_one_key_of_the_routes_configmap():
    joined = build_routes("shared", "ns", "team.fraud.json", {"routes": []})
    left = build_routes("shared", "ns", "team.fraud.json", None)
    assert list(joined["data"]) == ["team.fraud.json"] and "data" not in left
    assert joined["metadata"] == left["metadata"]
    assert route_manager("team.fraud") != route_manager("team.churn")


def test_a_pool_needs_the_front_the_operators_namespace_and_a_size():
    sizes = {"shared": SIZE}
    no_front = ClusterPools(None, ServingImages(), sizes, "kubeloop-system").problem("shared")
    assert "KUBELOOP_ROUTER_IMAGE" in no_front and "spec.pool shared" in no_front
    assert "KUBELOOP_OPERATOR_NAMESPACE" in ClusterPools(None, IMAGES, sizes, None).problem("shared")
    assert "no pool 'other'" in ClusterPools(None, IMAGES, sizes, "kubeloop-system").problem("other")
    assert ClusterPools(None, IMAGES, sizes, "kubeloop-system").problem("shared") is None
