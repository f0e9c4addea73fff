"""Desired KServe objects of an InferenceService (the kserve backend's
builders, with plain data). Unit level: the real KServe controller turning
them into Pods is proven on the real node (tests/e2e/test_real_node.py)."""

from __future__ import annotations

import pytest

from kubeloop.api.serving import ServingGPU
from kubeloop.gpu.placement import CPU, plan
from kubeloop.serving.builders.kserve import (
    DEVICE_ANNOTATION, build_inference_services, build_serving_runtime, build_storage_container, kserve_message,
    kserve_ready, predictor_urls,
)
from kubeloop.serving.builders.workloads import ServingImages
from tests.unit.test_builders_serving import REF, V1, V2, spec
from tests.unit.test_placement import fleet


def by_name(children: list[dict]) -> dict[str, dict]:
    return {c["metadata"]["name"]: c for c in children}


def test_each_version_is_a_kserve_inference_service_owned_by_kubeloops():
    children = by_name(build_inference_services(REF, spec(replicas=2), {"primary": (V1, 80), "canary": (V2, 20)},
                                                CPU, ServingImages(triton_backend="python")))
    assert sorted(children) == ["fraud-canary", "fraud-primary"]
    primary = children["fraud-primary"]
    assert primary["apiVersion"] == "serving.kserve.io/v1beta1"
    assert primary["metadata"]["ownerReferences"][0]["uid"] == "uid-9"
    assert primary["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Standard"
    # A fixed count: KServe holds it (autoscaler class none), min = max.
    assert primary["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "none"
    predictor = primary["spec"]["predictor"]
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (2, 2)
    assert predictor["model"]["storageUri"] == "models:/fraud/1"
    assert predictor["model"]["runtime"] == "kubeloop-triton"
    assert predictor["labels"] == {"kubeloop.dev/inferenceservice": "fraud", "kubeloop.dev/role": "primary",
                                   "kubeloop.dev/model-version": "1"}
    assert predictor["annotations"][DEVICE_ANNOTATION] == "cpu"
    assert predictor["model"]["securityContext"]["runAsNonRoot"] is True
    assert children["fraud-canary"]["spec"]["predictor"]["model"]["storageUri"] == "models:/fraud/2"


def test_gpu_placement_becomes_the_predictors_resources_selector_tolerations_env_and_device():
    decision = plan(ServingGPU(sharing="mps"), 4096, fleet())
    [isvc] = build_inference_services(REF, spec(), {"primary": (V1, 100)}, decision, ServingImages())
    predictor = isvc["spec"]["predictor"]
    assert predictor["model"]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert predictor["nodeSelector"]["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert predictor["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert {e["name"] for e in predictor["model"]["env"]} == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                                                              "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"}
    # The storage initializer reads this annotation: a GPU instance group.
    assert predictor["annotations"][DEVICE_ANNOTATION] == "gpu"


def test_with_dra_each_predictor_claims_its_slice_from_a_template_of_its_own():
    """Unit (builder): KUBELOOP_GPU_ALLOCATION=dra on the kserve backend: no
    extended resource; the predictor's Pod claims from a ResourceClaimTemplate
    per version holding the planner's device request."""
    from kubeloop.gpu.dra import device_request

    decision = plan(ServingGPU(sharing="mig"), 8 * 1024, fleet())
    children = build_inference_services(REF, spec(), {"primary": (V1, 80), "canary": (V2, 20)}, decision,
                                        ServingImages(gpu_allocation="dra"))
    templates = {c["metadata"]["name"]: c for c in children if c["kind"] == "ResourceClaimTemplate"}
    assert len(templates) == 2
    for isvc in (c for c in children if c["kind"] == "InferenceService"):
        predictor = isvc["spec"]["predictor"]
        [claim] = predictor["resourceClaims"]
        assert templates[claim["resourceClaimTemplateName"]]["spec"]["spec"]["devices"]["requests"] == [
            device_request(decision)]
        assert predictor["model"]["resources"]["claims"] == [{"name": claim["name"]}]
        assert not any(k.startswith("nvidia.com/") for k in predictor["model"]["resources"]["limits"])


def test_autoscaling_leaves_the_count_to_kubeloops_hpa_on_the_triton_metric():
    s = spec(autoscaling={"minReplicas": 2, "maxReplicas": 6, "metric": "queue-time", "target": 500})
    children = build_inference_services(REF, s, {"primary": (V1, 100)}, CPU, ServingImages())
    isvc, hpa = children
    assert isvc["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "external"
    assert (isvc["spec"]["predictor"]["minReplicas"], isvc["spec"]["predictor"]["maxReplicas"]) == (2, 6)
    assert hpa["kind"] == "HorizontalPodAutoscaler"
    assert hpa["spec"]["scaleTargetRef"]["name"] == "fraud-primary-predictor"
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "nv_inference_queue_duration_us_per_request"


def test_the_router_calls_each_versions_predictor_service():
    assert predictor_urls(REF, {"primary": (V1, 80), "canary": (V2, 20)}) == {
        "1": "http://fraud-primary-predictor.ml.svc.cluster.local",
        "2": "http://fraud-canary-predictor.ml.svc.cluster.local"}


def test_the_runtime_and_storage_container_carry_the_configured_images():
    images = ServingImages(triton="t:1", puller="r:1", triton_backend="python", registry_secret="mlflow-creds",
                           tracking_uri="http://mlflow:5000")
    runtime = build_serving_runtime("ml", images)
    [container] = runtime["spec"]["containers"]
    assert container["image"] == "t:1" and "--model-store=/mnt/models" in container["args"]
    assert runtime["metadata"]["namespace"] == "ml"
    storage = build_storage_container(images)
    assert storage["spec"]["supportedUriFormats"] == [{"prefix": "models:/"}]
    init = storage["spec"]["container"]
    assert init["image"] == "r:1" and init["command"] == ["kubeloop", "serving", "storage-initializer"]
    env = {e["name"]: e for e in init["env"]}
    assert env["KUBELOOP_TRITON_BACKEND"]["value"] == "python"
    assert env["KUBELOOP_TRITON_DEVICE"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        f"metadata.annotations['{DEVICE_ANNOTATION}']"
    assert init["envFrom"] == [{"secretRef": {"name": "mlflow-creds"}}]  # by reference only


@pytest.mark.parametrize("live, ready, message", [
    ({"metadata": {"generation": 2}, "status": {"observedGeneration": 2, "conditions": [
        {"type": "Ready", "status": "True"}]}}, True, ""),
    ({"metadata": {"generation": 3}, "status": {"observedGeneration": 2, "conditions": [
        {"type": "Ready", "status": "True"}]}}, False, ""),
    ({"metadata": {"generation": 1}, "status": {"conditions": [
        {"type": "PredictorReady", "status": "False", "message": "no runtime"}]}}, False, "PredictorReady: no runtime"),
    ({"metadata": {"generation": 1}}, False, ""),
])
def test_kserves_verdict(live, ready, message):
    assert kserve_ready(live) is ready
    assert kserve_message(live) == message


def test_the_kserve_backend_deletes_only_what_kubeloops_inference_service_owns():
    """Unit (backend, objects in memory): KServe copies an InferenceService's
    labels onto the Deployment and Service it makes, so the owner labels
    match those too. Dropping the canary deletes kubeloop's KServe
    InferenceService for it, never KServe's predictor children (deleting
    them made KServe and kubeloop fight on the real node: Pods churned)."""
    from kubeloop.serving.kserve import KServeServing
    from tests.unit.fakes import FakeObjects
    from tests.unit.test_builders_serving import FRONT, _front_request

    objects = FakeObjects()
    backend = KServeServing(objects, FRONT)
    backend.ensure(_front_request(replicas=1))
    primary = objects.get("serving.kserve.io/v1beta1", "InferenceService", "fraud-primary", "ml")
    # What KServe makes for it: same labels, owned by the KServe InferenceService.
    objects.apply({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {
        "name": "fraud-primary-predictor", "namespace": "ml", "labels": primary["metadata"]["labels"],
        "ownerReferences": [{"kind": "InferenceService", "uid": "kserve-uid"}]}, "spec": {}})
    from kubeloop.serving.base import ServedVersion, ServingRequest

    backend.ensure(ServingRequest(REF, spec(), (ServedVersion("primary", V1, 100),), CPU))
    kinds = sorted((kind, name) for (kind, _ns, name) in objects.objects)
    assert ("InferenceService", "fraud-canary") not in kinds and ("InferenceService", "fraud-shadow") not in kinds
    assert ("Deployment", "fraud-primary-predictor") in kinds
    assert ("ServingRuntime", "kubeloop-triton") in kinds and ("ClusterStorageContainer", "kubeloop-registry") in kinds


def test_the_kserve_backend_reports_kserves_readiness_and_the_split_through_the_front():
    from kubeloop.serving.kserve import KServeServing
    from tests.unit.fakes import FakeObjects
    from tests.unit.test_builders_serving import FRONT, _front_request

    objects = FakeObjects()
    backend = KServeServing(objects, FRONT)
    first = backend.ensure(_front_request(replicas=1))
    assert first.traffic == {"primary": 80, "canary": 20, "shadow": 10}
    assert not first.primary_ready and "primary: KServe has not reported Ready" in first.message
    assert first.url == "http://fraud.ml.svc.cluster.local"
    assert first.grpc_address == "fraud.ml.svc.cluster.local:8001"  # the router's gRPC
    for role in ("primary", "canary", "shadow"):
        objects.set_status("InferenceService", "ml", f"fraud-{role}", conditions=[{"type": "Ready", "status": "True"}])
        objects.apply({"kind": "Deployment", "metadata": {"name": f"fraud-{role}-predictor", "namespace": "ml"},
                       "status": {"availableReplicas": 1}})
    objects.set_status("Deployment", "ml", "fraud-router", availableReplicas=1)
    served = backend.ensure(_front_request(replicas=1))
    assert served.primary_ready and served.ready_replicas == 3 and served.message == ""
    # Without the front, callers reach the primary's predictor alone; the status says so.
    bare = KServeServing(FakeObjects(), ServingImages()).ensure(_front_request(replicas=1))
    assert bare.traffic == {"primary": 100, "canary": 0, "shadow": 0}
    assert bare.url == "http://fraud-primary-predictor.ml.svc.cluster.local"
    assert bare.grpc_address is None  # KServe's predictor Service carries HTTP only


def test_a_canary_whose_predictor_rollout_is_stuck_is_rolled_back_on_kserve():
    """Unit (backend, objects in memory): the Deployment controller says the
    canary's predictor passed its progress deadline; kubeloop's KServe
    InferenceService for the canary goes, the front's routes keep the
    primary, and the state names the reason. A canary still progressing stays."""
    from kubeloop.serving.kserve import KServeServing
    from tests.unit.fakes import FakeObjects
    from tests.unit.test_builders_serving import FRONT, _front_request

    objects = FakeObjects()
    backend = KServeServing(objects, FRONT)
    backend.ensure(_front_request(replicas=1))
    objects.apply({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {
        "name": "fraud-canary-predictor", "namespace": "ml"}, "spec": {}, "status": {"conditions": [
            {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"}]}})
    progressing = backend.ensure(_front_request(replicas=1))
    assert progressing.rolled_back == () and objects.get(
        "serving.kserve.io/v1beta1", "InferenceService", "fraud-canary", "ml") is not None
    objects.set_status("Deployment", "ml", "fraud-canary-predictor", conditions=[
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
         "message": 'ReplicaSet "fraud-canary-predictor-5d9" has timed out progressing.'}])
    stuck = backend.ensure(_front_request(replicas=1))
    assert stuck.rolled_back == ("canary",) and "canary rolled back: ReplicaSet" in stuck.message
    assert objects.get("serving.kserve.io/v1beta1", "InferenceService", "fraud-canary", "ml") is None
    assert "canary" not in stuck.traffic
    routes = objects.get("v1", "ConfigMap", "fraud-router", "ml")
    assert routes is not None and '"canary"' not in str(routes["data"])
