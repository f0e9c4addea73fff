"""InferenceService with the kubernetes backend on the fake GPU fleet: the
planner picks the slice, the real kube-scheduler places the Pods."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager

import pytest
from mlflow import MlflowClient

from kubeloop.api.conditions import ConditionType
from kubeloop.api.constants import API_VERSION
from kubeloop.dev.fleet import GpuSpec, NodeSpec, build_node, build_resource_slices, load_fleet
from kubeloop.gpu.dra import device_request
from kubeloop.api.refs import ObjectRef
from kubeloop.api.times import epoch
from kubeloop.gpu.placement import PlacementDecision
from kubeloop.operator.fleet import observe_fleet
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e
GiB = 1024


@pytest.fixture
def model(platform, namespace):
    """A registered version (the kubernetes backend's Pods would pull it; KWOK
    runs no containers, so its artifacts are never read here)."""
    client = MlflowClient(platform.env()["MLFLOW_TRACKING_URI"])
    name = f"{namespace}-placed"
    client.create_registered_model(name)
    version = client.create_model_version(name, source=f"s3://models/{name}/1")
    client.set_registered_model_alias(name, "champion", version.version)
    client.create_model_version(name, source=f"s3://models/{name}/2")
    client.set_registered_model_alias(name, "challenger", "2")
    return name


@pytest.fixture
def operator(platform, namespace, start_operator):
    op = start_operator([namespace], KUBELOOP_REGISTRY="mlflow",
                        MLFLOW_TRACKING_URI=platform.env()["MLFLOW_TRACKING_URI"],
                        KUBELOOP_SERVING_BACKENDS="kubernetes", KUBELOOP_SERVING_BACKEND="kubernetes")
    op.wait_for_log("Initial authentication has finished")
    return op


CASES = {
    # name: (gpu spec, node, resource, extra expectations)
    "mig-8g": ({"sharing": "mig", "mig": {"profile": "auto"}, "memoryMib": 8 * GiB},
               "gpu-h100-mig-mixed", "nvidia.com/mig-1g.10gb", {}),
    "mig-15g": ({"sharing": "mig", "memoryMib": 15 * GiB}, "gpu-h100-mig-mixed", "nvidia.com/mig-2g.20gb", {}),
    "a100-single": ({"sharing": "mig", "product": "NVIDIA-A100-SXM4-40GB", "memoryMib": 4 * GiB},
                    "gpu-a100-mig-single", "nvidia.com/gpu",
                    {"selector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"}}),
    "mps": ({"sharing": "mps", "mps": {"activeThreadPercentage": 25}, "memoryMib": 4 * GiB},
            "gpu-l4-mps", "nvidia.com/gpu",
            {"env": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4505M"}}),
    "whole": ({"sharing": "exclusive", "memoryMib": 30 * GiB}, "gpu-l40s", "nvidia.com/gpu", {}),
}


def isvc(namespace: str, name: str, model: str, gpu: dict, **spec) -> dict:
    return {"apiVersion": API_VERSION, "kind": "InferenceService", "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": {"name": model, "alias": "champion"}, "backend": "kubernetes",
                     "resources": {"cpu": "100m", "memory": "128Mi"}, "gpu": gpu, **spec}}


def pods_of(kube, namespace: str, name: str) -> list[dict]:
    return kube.list("v1", "Pod", namespace, f"kubeloop.dev/inferenceservice={name}")


def test_the_scheduler_places_each_model_on_the_slice_the_planner_chose(kube, namespace, model, operator):
    for name, (gpu, *_rest) in CASES.items():
        kube.create(isvc(namespace, name, model, gpu))
    for name, (_gpu, node, resource, extra) in CASES.items():
        status = wait_for(lambda name=name: (o := kube.get(API_VERSION, "InferenceService", name, namespace))
                          and o.get("status", {}).get("phase") == "Ready" and o["status"], timeout=60,
                          what=f"{name} Ready")
        assert status["placement"]["resource"] == resource and node in status["placement"]["nodes"], name
        pods = wait_for(lambda name=name: [p for p in pods_of(kube, namespace, name) if p["status"].get("phase") == "Running"],
                        timeout=30, what=f"{name} pods running")
        pod = pods[0]
        assert pod["spec"]["nodeName"] == node, name
        triton = pod["spec"]["containers"][0]
        assert triton["resources"]["limits"][resource] == "1", name
        for key, value in extra.get("selector", {}).items():
            assert pod["spec"]["nodeSelector"][key] == value
        env = {e["name"]: e["value"] for e in triton.get("env", [])}
        for key, value in extra.get("env", {}).items():
            assert env[key] == value, (name, env)
        assert any(t["key"] == "nvidia.com/gpu" for t in pod["spec"]["tolerations"])


def test_an_impossible_request_is_a_condition_not_a_pending_pod(kube, namespace, model, operator):
    kube.create(isvc(namespace, "too-big", model, {"sharing": "mig", "mig": {"profile": "1g.10gb"},
                                                   "memoryMib": 80 * GiB}))
    status = wait_for(lambda: (o := kube.get(API_VERSION, "InferenceService", "too-big", namespace))
                      and o.get("status", {}).get("phase") == "Failed" and o["status"], timeout=30, what="Failed")
    placed = next(c for c in status["conditions"] if c["type"] == "Placed")
    assert placed["status"] == "False" and placed["reason"] == "NoFittingCapacity"
    assert "81920 MiB does not fit MIG profile 1g.10gb" in placed["message"]
    assert kube.list("apps/v1", "Deployment", namespace) == []
    assert pods_of(kube, namespace, "too-big") == []


def test_a_canary_splits_by_replica_ratio(kube, namespace, model, operator):
    kube.create(isvc(namespace, "canary", model, {"sharing": "mig", "memoryMib": 4 * GiB}, replicas=5,
                     canary={"alias": "challenger", "percent": 20}))
    wait_for(lambda: (o := kube.get(API_VERSION, "InferenceService", "canary", namespace))
             and o.get("status", {}).get("canaryVersion") == "2" and o["status"]["phase"] == "Ready", timeout=60,
             what="canary Ready")
    running = wait_for(lambda: (p := [x for x in pods_of(kube, namespace, "canary")
                                      if x["status"].get("phase") == "Running"]) and len(p) == 5 and p,
                       timeout=30, what="5 pods")
    roles = sorted(p["metadata"]["labels"]["kubeloop.dev/role"] for p in running)
    assert roles == ["canary", "primary", "primary", "primary", "primary"]
    # One of five ready replicas: the split asked for is the split served.
    wait_for(lambda: [t["percent"] for t in _status(kube, namespace, "canary").get("traffic", [])] == [80, 20],
             timeout=30, what="status traffic 80/20")
    versions = {p["metadata"]["labels"]["kubeloop.dev/role"]: p["metadata"]["labels"]["kubeloop.dev/model-version"]
                for p in running}
    assert versions == {"primary": "1", "canary": "2"}
    service = kube.get("v1", "Service", "canary", namespace)
    assert service["spec"]["selector"] == {"kubeloop.dev/inferenceservice": "canary"}
    # Resyncs that want the same children list none of them; the canary's end changes what is wanted, and
    # its Deployment goes.
    kube.merge_patch(API_VERSION, "InferenceService", "canary", {"spec": {"canary": None}}, namespace)
    wait_for(lambda: kube.get("apps/v1", "Deployment", "canary-predictor-canary", namespace) is None, timeout=60,
             what="the canary's Deployment deleted once the spec no longer has a canary")
    assert kube.get("apps/v1", "Deployment", "canary-predictor", namespace)
    # A child is read, not applied, while it is as last applied: an edit by hand or a deletion is applied over
    # at the next resync. Ready with one version, the service is steady: no kopf timer of its own, resynced by
    # the operator's steady-resync thread.
    wait_for(lambda: (s := _status(kube, namespace, "canary")).get("phase") == "Ready" and not s.get("canaryVersion"),
             timeout=60, what="the service steady: Ready, no canary")
    kube.merge_patch("v1", "Service", "canary", {"spec": {"selector": {"kubeloop.dev/inferenceservice": "x"}}},
                     namespace)
    wait_for(lambda: kube.get("v1", "Service", "canary", namespace)["spec"]["selector"]
             == {"kubeloop.dev/inferenceservice": "canary"}, timeout=60, what="the edited Service's selector restored")
    kube.delete("v1", "Service", "canary", namespace)
    wait_for(lambda: kube.get("v1", "Service", "canary", namespace), timeout=60, what="the deleted Service made again")


def test_a_service_waiting_for_its_gpu_is_ready_once_its_pod_is_and_kopf_never_retried_it(
        kube, namespace, model, operator):
    """Cluster path (kubernetes backend; real API server and scheduler, a KWOK
    node of its own with one A10G). The GPU is held by another Pod, so the
    service's Pod waits for capacity. While the service waits, the operator
    looks again from its resync thread: kopf never writes its retry state
    onto the object (it did at each try, a PATCH each; 5,000 services waiting
    made 100 a second). The holder gone, the scheduler binds the service's
    Pod, the operator's Pod watch pokes the service, and it is Ready."""
    node = f"a10g-{namespace}"
    kube.create(build_node(NodeSpec(name=node, gpu=GpuSpec(product="NVIDIA-A10G", count=1)), load_fleet()))
    holder = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "holder", "namespace": namespace},
              "spec": {"nodeName": node, "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                       "containers": [{"name": "c", "image": "example.invalid/none:1",
                                       "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    try:
        kube.create(holder)
        kube.create(isvc(namespace, "waits", model, {"sharing": "exclusive", "product": "NVIDIA-A10G",
                                                     "memoryMib": 8 * GiB}))
        placed = wait_for(lambda: next((c for c in _status(kube, namespace, "waits").get("conditions", [])
                                        if c["type"] == ConditionType.PLACED), None), timeout=60, what="placed")
        assert placed["reason"] == "WaitingForCapacity", placed
        retried = []
        deadline = time.monotonic() + 25  # long enough for kopf's retries to have written 1, 2, 4, 8 s
        while time.monotonic() < deadline:
            obj = kube.get(API_VERSION, "InferenceService", "waits", namespace)
            assert obj["status"]["phase"] == "Pending", obj["status"]
            retried += [v for v in obj["metadata"].get("annotations", {}).values()
                        if v.startswith("{") and json.loads(v).get("retries")]
            time.sleep(0.5)
        assert retried == [], "kopf wrote retry state onto the waiting service"
        kube.delete("v1", "Pod", "holder", namespace)
        status = wait_for(lambda: (s := _status(kube, namespace, "waits")).get("phase") == "Ready" and s,
                          timeout=90, what="Ready once its Pod is")
        pod = next(p for p in pods_of(kube, namespace, "waits") if p["spec"].get("nodeName") == node)
        pod_ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        print(f"the service Ready {epoch(ready['lastTransitionTime']) - epoch(pod_ready['lastTransitionTime']):.0f} s "
              "after its Pod (1 s resolution)")
    finally:
        kube.delete(API_VERSION, "InferenceService", "waits", namespace)
        kube.delete("v1", "Pod", "holder", namespace)
        wait_for(lambda: _gpu_pods_on(kube, node) == [], timeout=60, what=f"{node} drained")
        kube.delete("v1", "Node", node)


def _status(kube, namespace: str, name: str) -> dict:
    return (kube.get(API_VERSION, "InferenceService", name, namespace) or {}).get("status", {})


def _replicas(kube, namespace: str, name: str) -> int | None:
    deployment = kube.get("apps/v1", "Deployment", f"{name}-predictor", namespace)
    return deployment["spec"].get("replicas") if deployment else None


def _reconciled(kube, namespace: str, name: str, generation: int) -> dict:
    """The status once the operator has reconciled this generation."""
    return wait_for(lambda: (s := _status(kube, namespace, name)).get("observedGeneration", 0) >= generation
                    and s.get("phase") == "Ready" and s, timeout=60, what=f"{name} generation {generation} Ready")


def _change_cpu(kube, namespace: str, name: str, cpu: str) -> int:
    """A spec change that rebuilds the Deployment's template; returns the new generation."""
    changed = kube.merge_patch(API_VERSION, "InferenceService", name, {"spec": {"resources": {"cpu": cpu}}},
                               namespace)
    return changed["metadata"]["generation"]


def test_the_hpa_owns_the_primarys_replicas_and_a_resync_leaves_them(kube, namespace, model, operator):
    """Cluster path (kubernetes backend; real API server, HPA and Deployment
    controllers; Pods on KWOK's fake MIG slices). The real HPA controller
    raises the primary to minReplicas; a scale-up written through the scale
    subresource (what the HPA writes under load: no custom metrics API runs
    here to make it decide one) survives the operator's next reconcile of a
    changed spec. Before: every reconcile applied spec.replicas again."""
    kube.create(isvc(namespace, "scaled", model, {"sharing": "mig", "memoryMib": 4 * GiB},
                     autoscaling={"minReplicas": 3, "maxReplicas": 6}))
    _reconciled(kube, namespace, "scaled", 1)
    wait_for(lambda: _replicas(kube, namespace, "scaled") == 3, timeout=90, what="the HPA raised replicas to 3")
    hpa = kube.get("autoscaling/v2", "HorizontalPodAutoscaler", "scaled-predictor", namespace)
    assert hpa["spec"]["minReplicas"] == 3 and hpa["spec"]["scaleTargetRef"]["name"] == "scaled-predictor"

    kube.merge_patch("apps/v1", "Deployment", "scaled-predictor", {"spec": {"replicas": 5}}, namespace,
                     subresource="scale")
    generation = _change_cpu(kube, namespace, "scaled", "150m")
    _reconciled(kube, namespace, "scaled", generation)
    deployment = kube.get("apps/v1", "Deployment", "scaled-predictor", namespace)
    triton = deployment["spec"]["template"]["spec"]["containers"][0]
    assert triton["resources"]["requests"]["cpu"] == "150m", "the operator applied the new spec"
    assert deployment["spec"]["replicas"] == 5


def test_turning_autoscaling_on_keeps_the_running_replicas(kube, namespace, model, operator):
    """Cluster path (as above). kubeloop stops owning the count and hands it
    over at the value it has: server-side apply would otherwise drop the
    field and the Deployment to one replica."""
    kube.create(isvc(namespace, "handover", model, {"sharing": "mig", "memoryMib": 4 * GiB}, replicas=2))
    _reconciled(kube, namespace, "handover", 1)
    assert _replicas(kube, namespace, "handover") == 2
    changed = kube.merge_patch(API_VERSION, "InferenceService", "handover",
                               {"spec": {"autoscaling": {"minReplicas": 1, "maxReplicas": 4}}}, namespace)
    _reconciled(kube, namespace, "handover", changed["metadata"]["generation"])
    wait_for(lambda: kube.get("autoscaling/v2", "HorizontalPodAutoscaler", "handover-predictor", namespace),
             timeout=30, what="the HPA")
    deployment = kube.get("apps/v1", "Deployment", "handover-predictor", namespace)
    owners = {e["manager"] for e in deployment["metadata"]["managedFields"]
              if "f:replicas" in e.get("fieldsV1", {}).get("f:spec", {})}
    assert "kubeloop" not in owners and deployment["spec"]["replicas"] == 2, owners


def test_status_reports_the_canary_share_the_replicas_really_give(kube, namespace, model, operator):
    """Cluster path (as above). One primary and one canary replica behind one
    Service: a 20% canary really gets half the requests, and status says so."""
    kube.create(isvc(namespace, "halves", model, {"sharing": "mig", "memoryMib": 4 * GiB}, replicas=1,
                     canary={"alias": "challenger", "percent": 20}))
    status = wait_for(lambda: (s := _status(kube, namespace, "halves")).get("phase") == "Ready"
                      and any(c["type"] == "CanaryReady" and c["status"] == "True" for c in s["conditions"]) and s,
                      timeout=60, what="canary ready")
    assert status["traffic"] == [{"role": "primary", "version": "1", "percent": 50},
                                 {"role": "canary", "version": "2", "percent": 50}]
    canary = next(c for c in status["conditions"] if c["type"] == "CanaryReady")
    assert canary["message"].startswith("version 2 gets 50% of requests (20% asked")


def _node(kube, name: str) -> dict:
    return kube.get("v1", "Node", name)


def _relabel(kube, node: str, config: str) -> None:
    """What a platform engineer does (after draining the node), and the fake
    fleet's MIG manager applying it."""
    kube.merge_patch("v1", "Node", node, {"metadata": {"labels": {"nvidia.com/mig.config": config}}})
    wait_for(lambda: (n := _node(kube, node))["metadata"].get("annotations", {}).get(
        "kubeloop.dev/mig-config-applied") == config and n, timeout=60, what=f"{node} re-partitioned to {config}")


def _gpu_pods_on(kube, node: str) -> list[str]:
    return [p["metadata"]["name"] for p in kube.list("v1", "Pod") if p["spec"].get("nodeName") == node
            and any(k.startswith("nvidia.com/") for c in p["spec"]["containers"]
                    for k in (c.get("resources", {}).get("limits") or {}))]


def test_a_model_no_slice_holds_fits_after_a_relayout_and_is_placed_once_the_node_is_relabelled(
        kube, namespace, model, operator):
    """Cluster path (kubernetes backend; real API server and scheduler; the
    fake fleet's MIG manager re-partitions a KWOK node as NVIDIA's mig-manager
    would). 60 GiB fits no slice of the fleet as it is: the status says it
    fits after relabelling the H100 node, names a layout that passes the MIG
    rules, and deploys nothing. The node relabelled to that layout (once no
    Pod holds its GPUs), the fleet advertises the new slices and the
    InferenceService is placed on one."""
    import re

    from kubeloop.gpu.catalog import gpu_model
    from kubeloop.gpu.mig import layout_error, standard_configs

    node = "gpu-h100-mig-mixed"
    original = _node(kube, node)["metadata"]["labels"]["nvidia.com/mig.config"]
    kube.create(isvc(namespace, "big", model, {"sharing": "mig", "memoryMib": 60 * GiB}))
    placed = wait_for(lambda: next((c for c in ((kube.get(API_VERSION, "InferenceService", "big", namespace) or {})
                                                .get("status") or {}).get("conditions", [])
                                    if c["type"] == "Placed"), None), timeout=30, what="a placement verdict")
    assert placed["status"] == "False" and placed["reason"] == "FitsAfterRelayout", placed
    config = re.search(rf"relabelling node {node} to nvidia.com/mig.config=(\S+) ", placed["message"]).group(1)
    h100 = gpu_model("NVIDIA-H100-80GB-HBM3")
    assert layout_error(h100, standard_configs(h100)[config]) is None
    assert pods_of(kube, namespace, "big") == []
    wait_for(lambda: _gpu_pods_on(kube, node) == [], timeout=60, what=f"{node} drained of GPU Pods")
    try:
        _relabel(kube, node, config)
        assert int(_node(kube, node)["status"]["allocatable"].get("nvidia.com/mig-7g.80gb", 0)) >= 1
        status = wait_for(lambda: (o := kube.get(API_VERSION, "InferenceService", "big", namespace))
                          and o.get("status", {}).get("phase") == "Ready" and o["status"], timeout=120,
                          what="big placed and Ready after the relayout")
        assert status["placement"]["resource"] == "nvidia.com/mig-7g.80gb"
        pod = wait_for(lambda: next((p for p in pods_of(kube, namespace, "big")
                                     if p["status"].get("phase") == "Running"), None), timeout=30, what="big running")
        assert pod["spec"]["nodeName"] == node
    finally:
        kube.delete(API_VERSION, "InferenceService", "big", namespace)
        wait_for(lambda: _gpu_pods_on(kube, node) == [], timeout=60, what=f"{node} drained again")
        _relabel(kube, node, original)


# The cases DRA serves (MPS shares stay with the device plugin): each must get
# the same slice the device-plugin path gets in the test above.
DRA_CASES = {name: CASES[name] for name in ("mig-8g", "mig-15g", "a100-single", "whole")}
DRA_TYPE = {"mig-8g": ("mig", "1g.10gb"), "mig-15g": ("mig", "2g.20gb"), "a100-single": ("mig", "1g.5gb"),
            "whole": ("gpu", None)}


def test_through_dra_the_real_scheduler_allocates_the_slice_the_device_plugin_path_gets(
        platform, kube, namespace, model, start_operator):
    """Cluster path (kubernetes backend, KUBELOOP_GPU_ALLOCATION=dra; the
    fake fleet also publishes its GPUs as NVIDIA's DRA driver does:
    DeviceClasses and a ResourceSlice per node). The planner's choice becomes
    a ResourceClaimTemplate with a CEL selector on product, profile and
    memory; the real v1.36 scheduler allocates a device for each Pod's claim,
    and it is the same kind of slice, on the same node, as the device-plugin
    path places the same spec on (CASES above)."""
    op = start_operator([namespace], KUBELOOP_REGISTRY="mlflow",
                        MLFLOW_TRACKING_URI=platform.env()["MLFLOW_TRACKING_URI"],
                        KUBELOOP_SERVING_BACKENDS="kubernetes", KUBELOOP_SERVING_BACKEND="kubernetes",
                        KUBELOOP_GPU_ALLOCATION="dra")
    op.wait_for_log("Initial authentication has finished")
    for name, (gpu, *_rest) in DRA_CASES.items():
        kube.create(isvc(namespace, name, model, gpu))
    slices = {s["spec"]["nodeName"]: {d["name"]: d for d in s["spec"]["devices"]}
              for s in kube.list("resource.k8s.io/v1", "ResourceSlice")}
    for name, (_gpu, node, _resource, _extra) in DRA_CASES.items():
        wait_for(lambda name=name: (o := kube.get(API_VERSION, "InferenceService", name, namespace))
                 and o.get("status", {}).get("phase") == "Ready", timeout=90, what=f"{name} Ready through DRA")
        pod = wait_for(lambda name=name: next((p for p in pods_of(kube, namespace, name)
                                               if p["status"].get("phase") == "Running"), None),
                       timeout=30, what=f"{name} running")
        assert pod["spec"]["nodeName"] == node, name
        triton = pod["spec"]["containers"][0]
        assert triton["resources"]["claims"] == [{"name": "gpu"}]
        assert not any(k.startswith("nvidia.com/") for k in triton["resources"].get("limits", {})), name
        claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        claim = kube.get("resource.k8s.io/v1", "ResourceClaim", claim_name, namespace)
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert result["driver"] == "gpu.nvidia.com" and result["pool"] == node, (name, result)
        device = slices[node][result["device"]]
        kind, profile = DRA_TYPE[name]
        assert device["attributes"]["type"]["string"] == kind, (name, device)
        if profile:
            assert device["attributes"]["profile"]["string"] == profile, (name, device)


def _partition_pod(namespace: str, name: str, node: str, profile: str) -> list[dict]:
    """A Pod on node claiming one H200 MIG device of profile, the claim built
    by kubeloop's DRA request builder from a MIG placement decision."""
    decision = PlacementDecision(feasible=True, mode="mig", reason="test", resources={f"nvidia.com/mig-{profile}": 1},
                                 product="NVIDIA-H200", profile=profile)
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": name, "namespace": namespace},
             "spec": {"devices": {"requests": [device_request(decision)]}}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
           "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                    "containers": [{"name": "c", "image": "example.invalid/triton:1",
                                    "resources": {"claims": [{"name": "gpu"}]}}]}}
    return [claim, pod]


def _allocated(kube, namespace: str, name: str) -> str | None:  # noqa: ANN001
    claim = kube.get("resource.k8s.io/v1", "ResourceClaim", name, namespace) or {}
    results = claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
    return results[0]["device"] if results else None


def test_partitionable_gpus_let_the_scheduler_cut_mig_devices_by_nvidias_rules(platform, kube, namespace):
    """Cluster path, DRA with partitionable devices (beta in 1.36): a fake
    H200 node of the fleet's partitionable kind publishes its GPU as a
    counter set and every profile placement as a device (no device-plugin
    capacity); the real scheduler
    allocates a 4g.71gb and a 3g.71gb on the one GPU, holds a 1g.18gb back
    (Unschedulable: no memory slice is left) and allocates it once the 4g's
    claim is gone, at a start slot inside what the 4g freed."""
    node = f"h200-{namespace}"
    with _partitionable_h200(kube, node):
        for name, profile in (("big", "4g.71gb"), ("mid", "3g.71gb")):
            for obj in _partition_pod(namespace, name, node, profile):
                kube.create(obj)
        placed = {name: wait_for(lambda name=name: _allocated(kube, namespace, name), timeout=60,
                                 what=f"{name}'s claim allocated") for name in ("big", "mid")}
        assert placed == {"big": "gpu-0-4g-71gb-at-0", "mid": "gpu-0-3g-71gb-at-4"}
        for obj in _partition_pod(namespace, "small", node, "1g.18gb"):
            kube.create(obj)
        wait_for(lambda: any(c["type"] == "PodScheduled" and c["status"] == "False" and c["reason"] == "Unschedulable"
                             for c in (kube.get("v1", "Pod", "small", namespace) or {}).get("status", {})
                             .get("conditions", [])), timeout=60, what="the 1g.18gb Pod unschedulable")
        assert _allocated(kube, namespace, "small") is None
        kube.delete("v1", "Pod", "big", namespace)
        wait_for(lambda: kube.get("v1", "Pod", "big", namespace) is None, timeout=60, what="the 4g Pod gone")
        kube.delete("resource.k8s.io/v1", "ResourceClaim", "big", namespace)
        small = wait_for(lambda: _allocated(kube, namespace, "small"), timeout=120, what="the 1g.18gb allocated")
        assert small in {f"gpu-0-1g-18gb-at-{s}" for s in range(4)}, small
        wait_for(lambda: (p := kube.get("v1", "Pod", "small", namespace)) and p["status"].get("phase") == "Running",
                 timeout=60, what="the 1g.18gb Pod running")


@contextmanager
def _partitionable_h200(kube, node: str):  # noqa: ANN001
    """A KWOK node with one H200 that only NVIDIA's DRA driver publishes (as
    partitionable devices; no device-plugin capacity), gone afterwards."""
    spec = NodeSpec(name=node, gpu=GpuSpec(product="NVIDIA-H200", count=1, partitionable=True))
    kube.create(build_node(spec, load_fleet()))
    assert not any(k.startswith("nvidia.com/") for k in kube.get("v1", "Node", node)["status"]["capacity"])
    slices = build_resource_slices([spec])
    try:
        for obj in slices:
            kube.apply(obj, field_manager="test")
        yield
    finally:
        for obj in slices:
            kube.delete("resource.k8s.io/v1", "ResourceSlice", obj["metadata"]["name"])
        kube.delete("v1", "Node", node)


def test_the_planner_sees_partitionable_gpus_and_waits_when_their_counters_are_spent(
        platform, kube, namespace, model, start_operator):
    """Cluster path (kubernetes backend, KUBELOOP_GPU_ALLOCATION=dra; real
    v1.36 scheduler; a fake H200 node published only as partitionable DRA
    devices). The operator reads ResourceSlices and allocated claims: two
    60 GiB InferenceServices are each planned onto a 3g.71gb partition and
    the scheduler cuts them at slots 0 and 4; the fleet as each sees it
    leaves it its own partition; a third finds no 3g.71gb left, and its
    status says its Pods wait for capacity."""
    op = start_operator([namespace], KUBELOOP_REGISTRY="mlflow",
                        MLFLOW_TRACKING_URI=platform.env()["MLFLOW_TRACKING_URI"],
                        KUBELOOP_SERVING_BACKENDS="kubernetes", KUBELOOP_SERVING_BACKEND="kubernetes",
                        KUBELOOP_GPU_ALLOCATION="dra")
    op.wait_for_log("Initial authentication has finished")
    node = f"h200-{namespace}"
    big = {"sharing": "mig", "product": "NVIDIA-H200", "memoryMib": 60 * GiB}
    with _partitionable_h200(kube, node):
        devices = set()
        for name in ("first", "second"):
            kube.create(isvc(namespace, name, model, big))
            status = wait_for(lambda name=name: (o := kube.get(API_VERSION, "InferenceService", name, namespace))
                              and o.get("status", {}).get("phase") == "Ready" and o["status"], timeout=90,
                              what=f"{name} Ready on a partition")
            assert "3g.71gb partition of an NVIDIA-H200" in status["placement"]["reason"], status["placement"]
            pod = wait_for(lambda name=name: next((p for p in pods_of(kube, namespace, name)
                                                   if p["status"].get("phase") == "Running"), None),
                           timeout=30, what=f"{name} running")
            assert pod["spec"]["nodeName"] == node
            claim = kube.get("resource.k8s.io/v1", "ResourceClaim",
                             pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"], namespace)
            devices.add(claim["status"]["allocation"]["devices"]["results"][0]["device"])
        assert devices == {"gpu-0-3g-71gb-at-0", "gpu-0-3g-71gb-at-4"}
        # Each sees its own partition as its own: one 3g.71gb free to it, none to a newcomer.
        def free(name: str) -> int:
            ref = ObjectRef("InferenceService", namespace, name, uid="")
            [seen] = [n for n in observe_fleet(kube, dra=True, excluding=ref) if n.name == node]
            return seen.partitions.free["3g.71gb"]

        assert (free("first"), free("second"), free("third")) == (1, 1, 0)
        kube.create(isvc(namespace, "third", model, big))
        def planned() -> dict | None:
            status = (kube.get(API_VERSION, "InferenceService", "third", namespace) or {}).get("status") or {}
            return status if status.get("placement") else None

        status = wait_for(planned, timeout=60, what="third planned")
        placement = status["placement"]
        assert "3g.71gb" in placement["reason"] and "no free capacity now" in placement["reason"], placement
        placed = next(c for c in status["conditions"] if c["type"] == "Placed")
        assert (placed["status"], placed["reason"]) == ("True", "WaitingForCapacity"), placed
        wait_for(lambda: any(c["type"] == "PodScheduled" and c["reason"] == "Unschedulable"
                             for p in pods_of(kube, namespace, "third")
                             for c in p.get("status", {}).get("conditions", [])),
                 timeout=60, what="the third's Pod unschedulable")
        for name in ("first", "second", "third"):
            kube.delete(API_VERSION, "InferenceService", name, namespace)
        wait_for(lambda: not kube.list("v1", "Pod", namespace), timeout=60, what="the Pods gone")
