"""The local platform is a real control plane with the fake GPU fleet."""

from __future__ import annotations

import json

import pytest

from kubeloop.api.resources import KINDS
from kubeloop.dev.binaries import versions
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e


def test_server_reports_the_pinned_kubernetes_version(kubectl):
    out = json.loads(kubectl("version", "-o", "json").stdout)
    assert out["serverVersion"]["gitVersion"] == versions()["KUBERNETES_VERSION"]
    assert out["serverVersion"]["minor"].startswith("3")


def test_nodes_advertise_nvidia_resources(kubectl):
    nodes = json.loads(kubectl("get", "nodes", "-o", "json").stdout)["items"]
    by_name = {n["metadata"]["name"]: n for n in nodes}
    assert set(by_name) == {"gpu-h100-mig-mixed", "gpu-a100-mig-single", "gpu-l4-mps", "gpu-l40s", "cpu-1"}
    for node in nodes:
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
        assert ready == "True", node["metadata"]["name"]
    assert by_name["gpu-h100-mig-mixed"]["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "16"
    assert by_name["gpu-l4-mps"]["status"]["allocatable"]["nvidia.com/gpu"] == "16"


def test_a_mig_pod_is_placed_on_the_h100_by_the_scheduler(kubectl, kube, namespace):
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mig-probe", "namespace": namespace},
        "spec": {
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "c", "image": "example.invalid/cuda:1",
                            "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}}}],
        },
    }
    kube.create(pod)
    running = wait_for(lambda: (p := kube.get("v1", "Pod", "mig-probe", namespace))
                       and p["status"].get("phase") == "Running" and p, what="pod Running")
    assert running["spec"]["nodeName"] == "gpu-h100-mig-mixed"
    # The scheduler records its events asynchronously, after binding.
    wait_for(lambda: any(e["reason"] == "Scheduled" and "gpu-h100-mig-mixed" in e["message"]
                         for e in kube.list("v1", "Event", namespace)), timeout=30, what="the Scheduled event")


def test_a_pod_without_toleration_stays_off_gpu_nodes(kube, namespace):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cpu-probe", "namespace": namespace},
           "spec": {"containers": [{"name": "c", "image": "example.invalid/x:1"}]}}
    kube.create(pod)
    running = wait_for(lambda: (p := kube.get("v1", "Pod", "cpu-probe", namespace))
                       and p["status"].get("phase") == "Running" and p, what="pod Running")
    assert running["spec"]["nodeName"] == "cpu-1"


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
def test_kubectl_explain_documents_every_kind(kubectl, kind):
    out = kubectl("explain", f"{kind.plural}.spec").stdout
    assert kind.spec.__doc__.split("\n")[0].strip().rstrip(".") in out
    assert "FIELDS:" in out
    deep = kubectl("explain", f"{kind.plural}.status.conditions.reason").stdout
    assert "CamelCase" in deep
