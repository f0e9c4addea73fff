"""Cluster path (real API server, KWOK's fake GPU nodes): the operator's
fleet view is kept by watches. It follows Pods as they come and go, agrees
with a fresh LIST of the cluster, and reading it, however often, lists
nothing again."""

from __future__ import annotations

import pytest

from kubeloop.operator.fleet import FleetView, observe_fleet
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e
NODE = "gpu-l40s"


def gpu_pod(namespace: str, name: str, gpus: int) -> dict:
    """Bound to the node by name: the fleet view, not the scheduler, is under test."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeName": NODE, "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                     "containers": [{"name": "c", "image": "example.invalid/none:1",
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def test_the_fleet_view_follows_pods_and_lists_once(kube, namespace):
    view = FleetView(kube).start()
    try:
        def held() -> int:
            return next(n for n in view() if n.name == NODE).requested.get("nvidia.com/gpu", 0)

        before = held()
        kube.create(gpu_pod(namespace, "holder", 3))
        wait_for(lambda: held() == before + 3, timeout=30, what="the view counts the new Pod's GPUs",
                 seen=lambda: str(held()))
        wait_for(lambda: view() == observe_fleet(kube), timeout=30, what="the view agrees with a fresh LIST")
        kube.delete("v1", "Pod", "holder", namespace)
        wait_for(lambda: held() == before, timeout=60, what="the deleted Pod's GPUs free again",
                 seen=lambda: str(held()))
        assert (view.pods.lists, view.nodes.lists) == (1, 1)
    finally:
        view.stop()
