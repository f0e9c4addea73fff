"""Unit (no cluster): the fleet the planner sees, from plain objects, and the
informer's list-then-watch bookkeeping against a scripted API. The cluster
path is tests/e2e/test_fleet_view.py."""

from __future__ import annotations

import threading

import pytest

from kubeloop.api.refs import ObjectRef
from kubeloop.kube import Informer, KubeError
from kubeloop.operator.fleet import ClaimUse, NodeGPUs, claim_use, node_gpus, plan_fleet, pod_use

L40S = NodeGPUs("gpu-l40s", {"nvidia.com/gpu.product": "NVIDIA-L40S"}, {"nvidia.com/gpu": 8})


def pod(name: str, node: str | None = "gpu-l40s", gpus: int = 1, phase: str = "Running",
        serving: str | None = None, namespace: str = "ml") -> dict:
    labels = {"kubeloop.dev/inferenceservice": serving} if serving else {}
    limits = {"nvidia.com/gpu": str(gpus), "cpu": "1"} if gpus else {"cpu": "1"}
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "labels": labels,
                         "resourceVersion": "1"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": limits}}]},
            "status": {"phase": phase}}


def test_only_live_scheduled_pods_that_hold_gpus_or_serve_are_kept():
    assert pod_use(pod("a", gpus=2)).gpus == (("nvidia.com/gpu", 2),)
    assert pod_use(pod("pending", node=None)) is None
    assert pod_use(pod("done", phase="Succeeded")) is None
    assert pod_use(pod("cpu-only", gpus=0)) is None
    assert pod_use(pod("dra-served", gpus=0, serving="fraud")).serving == "fraud"


def test_requests_add_up_per_node_and_the_placed_services_own_pods_count_as_free():
    pods = [pod_use(pod("a", gpus=2)), pod_use(pod("b", gpus=1, serving="fraud")),
            pod_use(pod("c", gpus=3, serving="fraud", namespace="other"))]
    [seen] = plan_fleet(pods, [L40S])
    assert seen.requested == {"nvidia.com/gpu": 6}
    [mine] = plan_fleet(pods, [L40S], excluding=ObjectRef("InferenceService", "ml", "fraud", uid=""))
    assert mine.requested == {"nvidia.com/gpu": 5}


def test_node_reduction_keeps_only_gpu_resources():
    node = {"metadata": {"name": "n", "labels": {"a": "b"}},
            "status": {"allocatable": {"cpu": "8", "nvidia.com/gpu": "4", "nvidia.com/mig-1g.10gb": "x"}}}
    assert node_gpus(node) == NodeGPUs("n", {"a": "b"}, {"nvidia.com/gpu": 4, "nvidia.com/mig-1g.10gb": 0})


def test_claims_keep_the_drivers_devices_and_the_pods_they_were_made_for():
    claim = {"metadata": {"namespace": "ml", "ownerReferences": [{"kind": "Pod", "name": "p"}]},
             "status": {"allocation": {"devices": {"results": [
                 {"driver": "gpu.nvidia.com", "pool": "n", "device": "gpu-0-3g"},
                 {"driver": "other.example", "pool": "n", "device": "nic-0"}]}}}}
    assert claim_use(claim) == ClaimUse("ml", frozenset({"p"}), frozenset({("n", "gpu-0-3g")}))
    assert claim_use({"metadata": {}, "status": {}}) is None


class ScriptedKube:
    """Answers snapshot() and watch() from a script; each watch plays the next
    list of events, then the test decides whether the informer goes on."""

    def __init__(self, objects: list[dict], watches: list[list[tuple[str, dict]]]):
        self.objects, self.watches = objects, watches
        self.lists, self.watched_from = 0, []
        self.idle = threading.Event()

    def snapshot(self, api_version, kind, namespace=None, label_selector=None):
        self.lists += 1
        return list(self.objects), str(100 * self.lists)

    def watch(self, api_version, kind, namespace=None, resource_version=None, timeout=300):
        self.watched_from.append(resource_version)
        if not self.watches:
            self.idle.set()
            threading.Event().wait(0.05)
            return
        events = self.watches.pop(0)
        if isinstance(events, KubeError):
            raise events
        yield from events


def test_the_informer_lists_once_then_follows_the_watch():
    added, gone = pod("added", gpus=2), pod("first", gpus=1)
    added["metadata"]["resourceVersion"] = "101"
    gone["metadata"]["resourceVersion"] = "102"
    kube = ScriptedKube([pod("first")], [[("ADDED", added), ("DELETED", gone)]])
    informer = Informer(kube, "v1", "Pod", pod_use).start()
    try:
        assert kube.idle.wait(5)
        assert [u.name for u in informer.values()] == ["added"]
        assert informer.lists == 1
        assert kube.watched_from[:2] == ["100", "102"]
    finally:
        informer.stop()


def test_a_forgotten_resource_version_or_a_broken_watch_means_listing_again():
    expired = ("ERROR", {"code": 410, "reason": "Expired", "message": "too old resource version"})
    kube = ScriptedKube([pod("first")], [[expired], KubeError(0, "Unreachable", "reset")])
    informer = Informer(kube, "v1", "Pod", pod_use).start()
    try:
        assert kube.idle.wait(10)
        assert informer.lists == 3
        assert kube.watched_from[:3] == ["100", "200", "300"]
        assert [u.name for u in informer.values()] == ["first"]
    finally:
        informer.stop()


def test_the_index_follows_what_the_watch_changes_and_a_new_list_rebuilds_it():
    """Unit (scripted API): an object is filed under its key; one the watch
    moves to another key leaves the old one, a deleted one leaves the index,
    an object filed under no key is still kept, and after a 410 the new
    list's objects alone are filed."""
    moved, deleted, added = pod("b", serving="other"), pod("c", serving="fraud"), pod("d", serving="fraud")
    for obj, version in ((moved, "101"), (deleted, "102"), (added, "103")):
        obj["metadata"]["resourceVersion"] = version
    expired = ("ERROR", {"code": 410, "reason": "Expired", "message": "too old resource version"})
    kube = ScriptedKube([pod("a", serving="fraud"), pod("b", serving="fraud"), pod("c", serving="fraud"),
                         pod("gpu-only")],
                        [[("MODIFIED", moved), ("DELETED", deleted), ("ADDED", added)], [expired]])
    informer = Informer(kube, "v1", "Pod", pod_use, index=lambda u: u.serving).start()
    names = lambda key: sorted(u.name for u in informer.indexed(key))  # noqa: E731
    try:
        assert kube.idle.wait(10)
        # Listed again after the 410: the script's list, as at the start.
        assert informer.lists == 2
        assert names("fraud") == ["a", "b", "c"] and names("other") == [] and names(None) == []
        assert sorted(u.name for u in informer.values()) == ["a", "b", "c", "gpu-only"]
    finally:
        informer.stop()
    kube = ScriptedKube([pod("a", serving="fraud"), pod("b", serving="solo"), pod("c", serving="fraud")],
                        [[("MODIFIED", moved), ("DELETED", deleted), ("ADDED", added)]])
    informer = Informer(kube, "v1", "Pod", pod_use, index=lambda u: u.serving).start()
    try:
        assert kube.idle.wait(10)
        assert names("fraud") == ["a", "d"] and names("other") == ["b"] and names("solo") == []
        assert informer._index.keys() == {"fraud", "other"}  # an emptied key is dropped: the index stays bounded
    finally:
        informer.stop()


def test_reading_before_the_first_list_names_what_failed():
    kube = ScriptedKube([], [])
    kube.snapshot = lambda *a, **k: (_ for _ in ()).throw(KubeError(403, "Forbidden", "pods is forbidden"))
    informer = Informer(kube, "v1", "Pod", pod_use).start()
    try:
        with pytest.raises(KubeError, match="no Pod list within 1 s: 403 Forbidden: pods is forbidden"):
            informer.values(timeout=1)
    finally:
        informer.stop()


def test_a_roles_container_troubles_come_from_the_watch_as_a_list_of_its_pods_gives_them():
    """Unit (scripted API): what FleetView.troubles reads from the Pod watch
    equals container_troubles over the role's Pods, in their name order; other
    roles, services and namespaces stay out, and a Pod whose restart the watch
    then reports (OOM-killed) shows it."""
    from kubeloop.operator.fleet import FleetView
    from kubeloop.serving.builders.workloads import container_troubles

    def serving_pod(name: str, role: str, restarts: int = 0, namespace: str = "ml", service: str = "fraud") -> dict:
        made = pod(name, gpus=0, serving=service, namespace=namespace)
        made["metadata"]["labels"]["kubeloop.dev/role"] = role
        last = {"terminated": {"reason": "OOMKilled", "exitCode": 137, "finishedAt": "T1"}} if restarts else {}
        made["status"]["containerStatuses"] = [{"name": "triton", "restartCount": restarts, "lastState": last,
                                                "state": {"running": {}}}]
        return made

    pods = [serving_pod("fraud-b", "primary", 2), serving_pod("fraud-a", "primary", 1),
            serving_pod("fraud-c", "canary", 3), serving_pod("x", "primary", 1, service="other"),
            serving_pod("y", "primary", 1, namespace="team-b")]
    restarted = serving_pod("fraud-d", "primary", 1)
    restarted["metadata"]["resourceVersion"] = "101"
    kube = ScriptedKube(pods + [serving_pod("fraud-d", "primary")], [[("MODIFIED", restarted)]])
    view = FleetView(kube)
    view.pods.start()
    try:
        assert kube.idle.wait(5)
        ref = ObjectRef("InferenceService", "ml", "fraud", uid="u")
        assert view.troubles(ref, "primary") == container_troubles(pods[:2] + [restarted])
        assert view.troubles(ref, "primary") == ["fraud-a/triton restarted 1x (last: OOMKilled at T1)",
                                                 "fraud-b/triton restarted 2x (last: OOMKilled at T1)",
                                                 "fraud-d/triton restarted 1x (last: OOMKilled at T1)"]
        assert view.troubles(ref, "canary") == ["fraud-c/triton restarted 3x (last: OOMKilled at T1)"]
        assert view.troubles(ref, "shadow") == []
    finally:
        view.pods.stop()


def test_a_services_pods_tell_the_operator_when_they_become_ready_or_go_and_nothing_else_does():
    """Unit (scripted API): FleetView.on_serving_pod names the service of a
    Pod the watch shows becoming ready, restarting or deleted, once per
    change; a Pod's update that changes nothing kept (a new resourceVersion
    alone), a GPU Pod that serves nothing, and the first LIST tell nothing."""
    from kubeloop.operator.fleet import FleetView

    def version(obj: dict, number: int) -> dict:
        obj["metadata"]["resourceVersion"] = str(number)
        return obj

    ready = version(pod("fraud-a", gpus=0, serving="fraud"), 101)
    ready["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    same = version(pod("fraud-a", gpus=0, serving="fraud"), 102)
    same["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    restarted = version(pod("fraud-a", gpus=0, serving="fraud"), 103)
    restarted["status"]["containerStatuses"] = [{"name": "triton", "restartCount": 1, "state": {"running": {}},
                                                 "lastState": {"terminated": {"reason": "Error", "exitCode": 1}}}]
    events = [("MODIFIED", ready), ("MODIFIED", same), ("MODIFIED", version(pod("gpu-only"), 104)),
              ("ADDED", version(pod("churn-a", gpus=0, serving="churn", namespace="team-b"), 105)),
              ("MODIFIED", restarted), ("DELETED", version(pod("fraud-a", gpus=0, serving="fraud"), 106))]
    kube = ScriptedKube([pod("fraud-a", gpus=0, serving="fraud"), pod("gpu-only")], [events])
    told: list[tuple[str, str]] = []
    view = FleetView(kube)
    view.on_serving_pod(lambda namespace, service: told.append((namespace, service)))
    view.pods.start()
    try:
        assert kube.idle.wait(5)
    finally:
        view.pods.stop()
    assert pod_use(ready).ready and not pod_use(restarted).ready
    assert told == [("ml", "fraud"), ("team-b", "churn"), ("ml", "fraud"), ("ml", "fraud")]


def test_the_client_keeps_more_connections_than_the_operator_has_threads_talking_at_once():
    """Unit: the kubernetes client's default pool is 5 connections a core; on
    2 cores the operator's 16 handler threads, resync threads and watches
    found it full and each discarded connection cost a TLS handshake."""
    from kubernetes.client import ApiClient, Configuration

    from kubeloop.kube import CONNECTIONS_KEPT, Kube

    kept = Kube(ApiClient(Configuration()))._api.rest_client.pool_manager.connection_pool_kw
    assert kept["maxsize"] >= CONNECTIONS_KEPT >= 16 + 4 + 4
    assert kept["retries"] == 0
