"""Desired KServe objects of an InferenceService (pure), for the kserve
serving backend.

Each served version (primary, canary, shadow) is a KServe InferenceService
of its own in Standard mode: KServe makes its Deployment, Service and
autoscaler. Its predictor runs kubeloop's Triton ServingRuntime, and its
storageUri is the registry's `models:/<name>/<version>`: KServe injects the
init container of kubeloop's ClusterStorageContainer for such URIs, which
lays out the version's Triton repository in /mnt/models (KServe's storage
initializer contract: the URI and the destination as arguments). The GPU
placement becomes the predictor's resources (or, with DRA, a claim from a
ResourceClaimTemplate, as for the kubernetes backend), node selector,
tolerations and MPS environment; the device the version runs on reaches the init container
through a Pod annotation, so one cluster-wide storage container serves CPU
and GPU predictors alike.

KServe v0.20 splits canaries by replica ratio and mirrors nothing, so the
serving front (kubeloop.serving.builders.workloads.build_router) stands in
front of the versions' predictor Services, as with the kubernetes backend.

Autoscaling: KServe's own HPA scales on CPU or memory only; an
InferenceService's scaling metric is one of Triton's (queue time, inference
rate). So the predictor is marked `autoscalerClass: external` (KServe then
leaves its replica count alone) and kubeloop's HPA on the Triton metric
targets the Deployment KServe made. Without autoscaling the class is `none`
and KServe holds the count at minReplicas.
"""

from __future__ import annotations

from kubeloop.api.constants import LABEL_ROLE
from kubeloop.api.refs import ObjectRef
from kubeloop.api.serving import InferenceServiceSpec
from kubeloop.gpu.dra import CLAIM
from kubeloop.gpu.placement import PlacementDecision
from kubeloop.api.children import child_metadata, dns_name, restricted, with_input_hash
from kubeloop.serving.builders.workloads import (
    LABEL_MODEL_VERSION, LABEL_SERVING, METRICS_PORT, ServingImages, build_autoscaler, build_claim_template,
    claim_template_name, planned_replicas,
)
from kubeloop.registry.base import ModelVersion

KSERVE_API = "serving.kserve.io/v1beta1"
RUNTIME_API = "serving.kserve.io/v1alpha1"
RUNTIME = "kubeloop-triton"
STORAGE_CONTAINER = "kubeloop-registry"
DEVICE_ANNOTATION = "kubeloop.dev/triton-device"
MODEL_DIR = "/mnt/models"
HTTP_PORT, GRPC_PORT = 8080, 9000


def kserve_name(ref: ObjectRef, role: str) -> str:
    return dns_name(ref.name, role)


def predictor_name(ref: ObjectRef, role: str) -> str:
    """The Deployment and Service KServe names after an InferenceService's predictor."""
    return f"{kserve_name(ref, role)}-predictor"


def predictor_urls(ref: ObjectRef, versions: dict[str, tuple[ModelVersion, int]]) -> dict[str, str]:
    """Version -> its predictor's Service, as the router calls it."""
    return {model.version: f"http://{predictor_name(ref, role)}.{ref.namespace}.svc.cluster.local"
            for role, (model, _percent) in versions.items()}


def build_inference_service(ref: ObjectRef, spec: InferenceServiceSpec, role: str, model: ModelVersion,
                            replicas: int | None, placement: PlacementDecision, images: ServingImages) -> dict:
    """One served version as a KServe InferenceService; replicas None: an
    HPA of kubeloop's scales it (see the module's note)."""
    own = {LABEL_SERVING: ref.name, LABEL_ROLE: role, LABEL_MODEL_VERSION: model.version}
    requests = {"cpu": str(spec.resources.cpu), "memory": str(spec.resources.memory)}
    claim = claim_template_name(ref, role, placement, images)
    limits = {**requests, **({} if claim else {k: str(v) for k, v in placement.resources.items()})}
    container = restricted({
        "modelFormat": {"name": "triton"}, "runtime": RUNTIME, "protocolVersion": "v2",
        "storageUri": f"models:/{model.name}/{model.version}",
        "resources": {"requests": requests, "limits": limits},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, {"name": "shm", "mountPath": "/dev/shm"}],
    })
    if placement.env:
        container["env"] = [{"name": k, "value": v} for k, v in sorted(placement.env.items())]
    predictor: dict = {
        "minReplicas": replicas if replicas is not None else spec.autoscaling.min_replicas,
        "maxReplicas": replicas if replicas is not None else spec.autoscaling.max_replicas,
        "labels": own,
        "annotations": {DEVICE_ANNOTATION: "cpu" if placement.mode == "cpu" else "gpu",
                        "prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT)},
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "volumes": [{"name": "tmp", "emptyDir": {}},
                    {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}],
        "model": container,
    }
    if placement.node_selector:
        predictor["nodeSelector"] = dict(placement.node_selector)
    if placement.tolerations:
        predictor["tolerations"] = [dict(t) for t in placement.tolerations]
    if claim:
        predictor["resourceClaims"] = [{"name": CLAIM, "resourceClaimTemplateName": claim}]
        container["resources"]["claims"] = [{"name": CLAIM}]
    annotations = {"serving.kserve.io/deploymentMode": "Standard",
                   "serving.kserve.io/autoscalerClass": "none" if replicas is not None else "external"}
    return with_input_hash({
        "apiVersion": KSERVE_API, "kind": "InferenceService",
        "metadata": child_metadata(ref, kserve_name(ref, role), own, annotations),
        "spec": {"predictor": predictor},
    })


def build_inference_services(ref: ObjectRef, spec: InferenceServiceSpec,
                             versions: dict[str, tuple[ModelVersion, int]], placement: PlacementDecision,
                             images: ServingImages) -> list[dict]:
    """A KServe InferenceService per served version, and kubeloop's HPA on
    the primary's predictor when the service autoscales. The front splits
    exactly, so each version keeps the replicas it needs."""
    replicas = planned_replicas(spec, versions.get("canary", (None, 0))[1], exact=True)
    children = [build_inference_service(ref, spec, role, model, replicas[role], placement, images)
                for role, (model, _percent) in versions.items()]
    claims = [build_claim_template(ref, role, placement, images) for role in versions]
    autoscaler = build_autoscaler(ref, spec, target=predictor_name(ref, "primary"))
    return children + [c for c in claims if c] + ([autoscaler] if autoscaler else [])


def build_serving_runtime(namespace: str, images: ServingImages) -> dict:
    """kubeloop's Triton as a KServe ServingRuntime in the namespace: the
    image and backend the operator is configured with, restricted, with its
    metrics port for scraping."""
    container = restricted({
        "name": "kserve-container", "image": images.triton,
        "args": ["tritonserver", f"--model-store={MODEL_DIR}", f"--http-port={HTTP_PORT}",
                 f"--grpc-port={GRPC_PORT}", f"--metrics-port={METRICS_PORT}", "--strict-readiness=true",
                 "--exit-on-error=false"],
        "ports": [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": HTTP_PORT}, "periodSeconds": 5},
    })
    return {
        "apiVersion": RUNTIME_API, "kind": "ServingRuntime",
        "metadata": {"name": RUNTIME, "namespace": namespace, "labels": {"app.kubernetes.io/managed-by": "kubeloop"}},
        "spec": {
            "supportedModelFormats": [{"name": "triton", "version": "2", "autoSelect": True}],
            "protocolVersions": ["v2"],
            "annotations": {"prometheus.kserve.io/port": str(METRICS_PORT), "prometheus.kserve.io/path": "/metrics"},
            "containers": [container],
        },
    }


def build_storage_container(images: ServingImages) -> dict:
    """The init container KServe injects for `models:/` URIs: kubeloop's
    runtime image writes the registered version's Triton repository."""
    container = restricted({
        "name": "storage-initializer", "image": images.puller,
        "command": ["kubeloop", "serving", "storage-initializer"],
        "env": [{"name": "MLFLOW_TRACKING_URI", "value": images.tracking_uri},
                {"name": "KUBELOOP_TRITON_BACKEND", "value": images.triton_backend},
                {"name": "KUBELOOP_TRITON_DEVICE",
                 "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{DEVICE_ANNOTATION}']"}}}],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        # Every predictor kubeloop builds has this volume (a read-only root needs a writable /tmp).
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    })
    if images.registry_secret:
        container["envFrom"] = [{"secretRef": {"name": images.registry_secret}}]
    return {
        "apiVersion": RUNTIME_API, "kind": "ClusterStorageContainer",
        "metadata": {"name": STORAGE_CONTAINER, "labels": {"app.kubernetes.io/managed-by": "kubeloop"}},
        "spec": {"container": container, "supportedUriFormats": [{"prefix": "models:/"}]},
    }


def kserve_ready(live: dict) -> bool:
    """KServe's verdict on an InferenceService: its Ready condition, for the
    generation it last saw."""
    status = live.get("status") or {}
    if status.get("observedGeneration", live.get("metadata", {}).get("generation")) != \
            live.get("metadata", {}).get("generation"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))


def kserve_message(live: dict) -> str:
    """Why KServe says an InferenceService is not ready ('' when it is, or has said nothing)."""
    for condition in (live.get("status") or {}).get("conditions", []):
        if condition.get("status") == "False" and condition.get("message"):
            return f"{condition['type']}: {condition['message']}"
    return ""
