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


def test_reading_before_the_first_list_names_what_failed():
    kube = ScriptedKube([], [])
    kube.snapshot = lambda *a, **k: (_ for _ in ()).throw(KubeError(403, "Forbidden", "pods is forbidden"))
    informer = Informer(kube, "v1", "Pod", pod_use).start()
    try:
        with pytest.raises(KubeError, match="no Pod list within 1 s: 403 Forbidden: pods is forbidden"):
            informer.values(timeout=1)
    finally:
        informer.stop()
