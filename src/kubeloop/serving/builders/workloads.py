"""Desired Kubernetes objects of an InferenceService (pure).

Each served version (primary, canary, shadow) is a Triton Deployment of its
own. An init container pulls the registered version from the registry into a
Triton model repository on an emptyDir, so the Pod never needs write access
to its image.

Canary traffic, two ways:
- by default the canary's Pods sit behind the primary's Service and get their
  share by replica ratio (coarse with few replicas: 1 of 5 replicas is 20%,
  1 of 2 is 50%; `effective_split` says what callers really get);
- with a Gateway configured (Gateway API), each version gets a Service of its
  own and an HTTPRoute splits requests by weight, exactly, whatever the
  replica counts.
The shadow has a Service of its own that mirroring sends copies to.

With a router image configured, the serving front (kubeloop.front.router,
the same data plane the local backend runs) is the InferenceService's entry
Deployment: the Service selects the router, which splits primary and canary
by consistent hashing of the request key (exactly as asked, whatever the
replicas), mirrors the shadow's share, logs requests and exports metrics,
and calls each version's Triton through a Service of its own.

With autoscaling the HPA owns the primary's replica count: the Deployment is
applied without `spec.replicas`, so a resync never undoes what the HPA chose.

The GPU slice is an extended resource of NVIDIA's device plugin, or with DRA
(gpu_allocation "dra") a claim from a ResourceClaimTemplate per version whose
CEL selector asks for the same slice (kubeloop.gpu.dra).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kubeloop.api.constants import LABEL_ROLE
from kubeloop.api.refs import ObjectRef
from kubeloop.api.serving import InferenceServiceSpec
from kubeloop.gpu.dra import CLAIM, device_request
from kubeloop.gpu.placement import PlacementDecision
from kubeloop.api.children import child_metadata, content_hash, dns_name, restricted, with_input_hash
from kubeloop.registry.base import ModelVersion
from kubeloop.serving.base import triton_name

HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
ROUTER_PORT, ROUTER_GRPC_PORT = 8080, 8081
ROUTER_CONFIG_DIR = "/etc/kubeloop/router"
PROGRESS_DEADLINE_SECONDS = 300
MODEL_REPOSITORY = "/models"
LABEL_SERVING = "kubeloop.dev/inferenceservice"
LABEL_MODEL_VERSION = "kubeloop.dev/model-version"


@dataclass(frozen=True)
class ServingImages:
    """Images and endpoints the serving Pods use (operator configuration)."""

    triton: str = "nvcr.io/nvidia/tritonserver:24.10-py3"
    triton_backend: str = "onnxruntime"
    """The Triton backend the pulled repository is laid out for: onnxruntime
    (a stock NVIDIA image), or python (an image with only the python backend,
    such as kubeloop's own, built from the nvidia-pytriton wheel)."""
    puller: str = "ghcr.io/kubeloop/components:0.1.0"
    tracking_uri: str = "http://mlflow.mlflow.svc:5000"
    registry_secret: str | None = None
    """A Secret whose keys (MLFLOW_TRACKING_USERNAME, ...) the puller gets as env."""
    gateway: str | None = None
    """namespace/name of a Gateway (Gateway API): canaries split by HTTPRoute weights."""
    gateway_domain: str = "example.com"
    """Hostnames of HTTPRoutes: <name>.<namespace>.<domain>."""
    gpu_allocation: str = "device-plugin"
    """device-plugin: the slice as an extended resource; dra: as a
    ResourceClaim from a template (kubeloop.gpu.dra) the scheduler allocates."""
    router: str | None = None
    """The serving front's image (the runtime image holds it): set, each
    InferenceService gets a router Deployment in front of its versions."""
    request_log: str | None = None
    """The s3:// prefix routers log requests under (one prefix per service)."""
    object_store_secret: str | None = None
    """A Secret with AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY the router writes the request log with."""
    object_store_endpoint: str | None = None
    """The S3 endpoint (any S3-compatible store)."""


def deployment_name(ref: ObjectRef, role: str) -> str:
    return dns_name(ref.name, "predictor") if role == "primary" else dns_name(ref.name, "predictor", role)


def service_name(ref: ObjectRef, role: str = "primary") -> str:
    return dns_name(ref.name) if role == "primary" else dns_name(ref.name, role)


def grpc_address(ref: ObjectRef) -> str:
    """Where callers in the cluster reach the service's KServe v2 gRPC (its
    router's, or the primary Service's split of Triton Pods)."""
    return f"{service_name(ref)}.{ref.namespace}.svc.cluster.local:{GRPC_PORT}"


def split_replicas(total: int, canary_percent: int) -> tuple[int, int]:
    """Primary and canary replicas whose ratio approximates the canary share:
    at least one canary replica for any non-zero share, never all of them."""
    if canary_percent <= 0 or total <= 0:
        return total, 0
    total = max(total, 2)
    canary = min(total - 1, max(1, round(total * canary_percent / 100)))
    return total - canary, canary


def build_deployment(ref: ObjectRef, spec: InferenceServiceSpec, role: str, model: ModelVersion,
                     replicas: int | None, placement: PlacementDecision, images: ServingImages) -> dict:
    """A version's Triton Deployment; replicas None leaves the count to
    whoever scales it (the HPA)."""
    labels = {LABEL_SERVING: ref.name, LABEL_ROLE: role, LABEL_MODEL_VERSION: model.version,
              "app.kubernetes.io/name": "triton", "app.kubernetes.io/instance": ref.name}
    selector = {LABEL_SERVING: ref.name, LABEL_ROLE: role}
    resources = {"cpu": str(spec.resources.cpu), "memory": str(spec.resources.memory)}
    claim = claim_template_name(ref, role, placement, images)
    limits = {**resources, **({} if claim else {k: str(v) for k, v in placement.resources.items()})}
    pod_spec: dict = {
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "initContainers": [_puller(model, images, placement)],
        "containers": [_triton(spec, model, images, resources, limits, placement)],
        "volumes": [{"name": "models", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}},
                    {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}],
    }
    if placement.node_selector:
        pod_spec["nodeSelector"] = dict(placement.node_selector)
    if placement.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in placement.tolerations]
    if claim:
        pod_spec["resourceClaims"] = [{"name": CLAIM, "resourceClaimTemplateName": claim}]
        pod_spec["containers"][0]["resources"]["claims"] = [{"name": CLAIM}]
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": child_metadata(ref, deployment_name(ref, role), labels),
        "spec": {
            **({"replicas": replicas} if replicas is not None else {}),
            "selector": {"matchLabels": selector},
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            # A rollout that makes no progress for this long is reported as
            # failed by the Deployment controller; a failed canary is rolled back.
            "progressDeadlineSeconds": PROGRESS_DEADLINE_SECONDS,
            "template": {
                "metadata": {"labels": labels, "annotations": {
                    "prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT)}},
                "spec": pod_spec,
            },
        },
    }
    return with_input_hash(deployment)


def claim_template_name(ref: ObjectRef, role: str, placement: PlacementDecision,
                        images: ServingImages) -> str | None:
    """With DRA, the name of the role's ResourceClaimTemplate, one per device
    request (a template's spec cannot change: a new request is a new
    template, and the Deployment rolls onto it); None otherwise."""
    request = device_request(placement) if images.gpu_allocation == "dra" else None
    return dns_name(deployment_name(ref, role), "gpu", content_hash(request, 8)) if request else None


def build_claim_template(ref: ObjectRef, role: str, placement: PlacementDecision, images: ServingImages) -> dict | None:
    """The role's ResourceClaimTemplate (DRA), or None."""
    name = claim_template_name(ref, role, placement, images)
    if name is None:
        return None
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": child_metadata(ref, name, {LABEL_SERVING: ref.name, LABEL_ROLE: role}),
            "spec": {"spec": {"devices": {"requests": [device_request(placement)]}}}}


def _puller(model: ModelVersion, images: ServingImages, placement: PlacementDecision) -> dict:
    command = ["kubeloop", "serving", "fetch", f"models:/{model.name}/{model.version}",
               "--repository", MODEL_REPOSITORY, "--backend", images.triton_backend]
    if placement.mode != "cpu":
        # The registered config was profiled on whatever device optimised it;
        # a version placed on a GPU slice needs GPU instances to use it.
        command += ["--device", "gpu"]
    container = {
        "name": "model-puller",
        "image": images.puller,
        "command": command,
        "env": [{"name": "MLFLOW_TRACKING_URI", "value": images.tracking_uri}],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "volumeMounts": [{"name": "models", "mountPath": MODEL_REPOSITORY},
                         {"name": "tmp", "mountPath": "/tmp"}],
    }
    if images.registry_secret:
        container["envFrom"] = [{"secretRef": {"name": images.registry_secret}}]
    return restricted(container)


def _triton(spec: InferenceServiceSpec, model: ModelVersion, images: ServingImages,
            requests: dict, limits: dict, placement: PlacementDecision) -> dict:
    container = {
        "name": "triton",
        "image": spec.runtime.image or images.triton,
        "args": [
            "tritonserver", f"--model-repository={MODEL_REPOSITORY}", "--model-control-mode=explicit",
            f"--load-model={triton_name(model.name)}", "--strict-readiness=true", "--exit-on-error=false",
            f"--http-port={HTTP_PORT}", f"--grpc-port={GRPC_PORT}", f"--metrics-port={METRICS_PORT}",
        ],
        "ports": [{"name": "http", "containerPort": HTTP_PORT},
                  {"name": "grpc", "containerPort": GRPC_PORT},
                  {"name": "metrics", "containerPort": METRICS_PORT}],
        "readinessProbe": {"httpGet": {"path": f"/v2/models/{triton_name(model.name)}/ready", "port": "http"},
                           "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": "/v2/health/live", "port": "http"},
                          "periodSeconds": 10, "failureThreshold": 6, "initialDelaySeconds": 30},
        "resources": {"requests": requests, "limits": limits},
        "volumeMounts": [{"name": "models", "mountPath": MODEL_REPOSITORY, "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"}, {"name": "shm", "mountPath": "/dev/shm"}],
    }
    if placement.env:
        container["env"] = [{"name": k, "value": v} for k, v in sorted(placement.env.items())]
    return restricted(container)


def build_service(ref: ObjectRef, role: str = "primary", exact: bool = False) -> dict:
    """The primary Service selects primary and canary Pods (replica-ratio
    split), or the router in front of them (role "router"); other roles, and
    the primary with exact=True, select only their own."""
    selector = {LABEL_SERVING: ref.name}
    if role != "primary" or exact:
        selector[LABEL_ROLE] = role
    if role == "router":
        return _router_service(ref, selector)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(ref, service_name(ref, role) if not exact else dns_name(ref.name, role),
                                   {LABEL_SERVING: ref.name}),
        "spec": {
            "selector": selector,
            "ports": [{"name": "http", "port": 80, "targetPort": "http"},
                      {"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc"},
                      {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"}],
        },
    }


def build_autoscaler(ref: ObjectRef, spec: InferenceServiceSpec, target: str | None = None) -> dict | None:
    """An HPA on a Triton metric served through the custom metrics API (for
    example by prometheus-adapter): queue time or inference rate per Pod, of
    the primary's Deployment (or the one named target)."""
    if spec.autoscaling is None:
        return None
    metric = {"queue-time": "nv_inference_queue_duration_us_per_request",
              "inference-rate": "nv_inference_request_success_per_second"}[spec.autoscaling.metric]
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": child_metadata(ref, deployment_name(ref, "primary")),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                               "name": target or deployment_name(ref, "primary")},
            "minReplicas": max(1, spec.autoscaling.min_replicas),
            "maxReplicas": spec.autoscaling.max_replicas,
            "metrics": [{"type": "Pods", "pods": {
                "metric": {"name": metric},
                "target": {"type": "AverageValue", "averageValue": str(spec.autoscaling.target)},
            }}],
        },
    }


def build_children(ref: ObjectRef, spec: InferenceServiceSpec, versions: dict[str, tuple[ModelVersion, int]],
                   placement: PlacementDecision, images: ServingImages, router_config: dict | None = None) -> list[dict]:
    """Every object an InferenceService needs, for the roles present in
    versions (role -> (model version, traffic percent)); with a router
    configuration (kubeloop.serving.routes), the router in front."""
    front = router_config is not None
    replicas = planned_replicas(spec, versions.get("canary", (None, 0))[1], exact=bool(images.gateway) or front)
    children: list[dict] = []
    for role, (model, _percent) in versions.items():
        children.append(build_deployment(ref, spec, role, model, replicas[role], placement, images))
        template = build_claim_template(ref, role, placement, images)
        if template:
            children.append(template)
    if front:
        children += build_router(ref, spec, router_config, images)
        children += [build_service(ref, "router")] + [build_service(ref, role, exact=True)
                                                      for role in versions if role != "shadow"]
    else:
        children.append(build_service(ref))
    if images.gateway and not front:
        for role in ("primary", "canary"):
            if role in versions:
                children.append(build_service(ref, role, exact=True))
        children.append(build_http_route(ref, {role: pct for role, (_m, pct) in versions.items() if role != "shadow"},
                                         images))
    if "shadow" in versions:
        children.append(build_service(ref, "shadow"))
    autoscaler = build_autoscaler(ref, spec)
    if autoscaler:
        children.append(autoscaler)
    return children


def planned_replicas(spec: InferenceServiceSpec, canary_percent: int, exact: bool) -> dict[str, int | None]:
    """Replicas per role. The autoscaled primary gets None (the HPA owns its
    count); the canary's count comes from the smallest scale, so the replica
    ratio gives at least the canary's share. With an exact split (an
    HTTPRoute), each version keeps the replicas it needs."""
    total = spec.autoscaling.min_replicas if spec.autoscaling else spec.replicas
    primary, canary = split_replicas(total, canary_percent)
    if exact:
        primary, canary = total, max(1, total // 2) if canary_percent else 0
    return {"primary": None if spec.autoscaling else primary, "canary": canary,
            "shadow": max(1, min(total, 1)) if total else 0}


def effective_split(requested: dict[str, int], available: dict[str, int], wanted: dict[str, int],
                    exact: bool) -> dict[str, int]:
    """The percent of requests primary and canary really get. An HTTPRoute
    splits by weight exactly; behind one Service the replicas that pass
    readiness share the requests (before any does, the split the wanted
    replicas will give)."""
    if exact or "canary" not in requested:
        return dict(requested)
    counts = available if available.get("primary", 0) + available.get("canary", 0) else wanted
    primary, canary = counts.get("primary", 0), counts.get("canary", 0)
    if primary + canary == 0:
        return dict(requested)
    share = round(100 * canary / (primary + canary))
    return {"primary": 100 - share, "canary": share}


def version_urls(ref: ObjectRef, versions: dict[str, tuple[ModelVersion, int]]) -> dict[str, str]:
    """Version -> the Service of the Triton that serves it, as the router calls it."""
    return {model.version: f"http://{dns_name(ref.name, role)}.{ref.namespace}.svc.cluster.local"
            for role, (model, _percent) in versions.items()}


def router_name(ref: ObjectRef) -> str:
    return dns_name(ref.name, "router")


def build_router(ref: ObjectRef, spec: InferenceServiceSpec, config: dict, images: ServingImages) -> list[dict]:
    """The router's ConfigMap and Deployment. A route change rolls the
    router (its template carries the config's hash): new routes apply as
    soon as a new Pod is ready, not when the kubelet next syncs the volume."""
    text = json.dumps(config, indent=2, sort_keys=True)
    labels = {LABEL_SERVING: ref.name, LABEL_ROLE: "router", "app.kubernetes.io/name": "kubeloop-router",
              "app.kubernetes.io/instance": ref.name}
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": child_metadata(ref, router_name(ref)),
                  "data": {"router.json": text}}
    container = restricted({
        "name": "router",
        "image": images.router,
        "command": ["python", "-m", "kubeloop.front.router", "--config", f"{ROUTER_CONFIG_DIR}/router.json",
                    "--port", str(ROUTER_PORT), "--grpc-port", str(ROUTER_GRPC_PORT), "--host", "0.0.0.0"],
        "ports": [{"name": "http", "containerPort": ROUTER_PORT}, {"name": "grpc", "containerPort": ROUTER_GRPC_PORT}],
        "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": "http"}, "periodSeconds": 2},
        "livenessProbe": {"httpGet": {"path": "/v2/health/live", "port": "http"}, "periodSeconds": 10,
                          "failureThreshold": 6},
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        # Feast's S3 registry reads its endpoint from a variable of its own.
        "env": ([{"name": name, "value": images.object_store_endpoint}
                 for name in ("AWS_ENDPOINT_URL_S3", "FEAST_S3_ENDPOINT_URL")]
                if images.object_store_endpoint else []),
        "volumeMounts": [{"name": "routes", "mountPath": ROUTER_CONFIG_DIR, "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"}],
    })
    if images.object_store_secret:
        container["envFrom"] = [{"secretRef": {"name": images.object_store_secret}}]
    total = spec.autoscaling.min_replicas if spec.autoscaling else spec.replicas
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": child_metadata(ref, router_name(ref), labels),
        "spec": {
            "replicas": 1 if total <= 1 else 2,
            "selector": {"matchLabels": {LABEL_SERVING: ref.name, LABEL_ROLE: "router"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {"labels": labels, "annotations": {
                    "prometheus.io/scrape": "true", "prometheus.io/port": str(ROUTER_PORT),
                    "kubeloop.dev/routes-hash": content_hash(config)}},
                "spec": {
                    "automountServiceAccountToken": False,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [container],
                    "volumes": [{"name": "routes", "configMap": {"name": router_name(ref)}},
                                {"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }
    return [config_map, with_input_hash(deployment)]


def _router_service(ref: ObjectRef, selector: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": child_metadata(ref, service_name(ref), {LABEL_SERVING: ref.name}),
        # gRPC on Triton's port, as a Service without the router offers it.
        "spec": {"selector": selector, "ports": [{"name": "http", "port": 80, "targetPort": "http"},
                                                 {"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc"}]},
    }


def build_http_route(ref: ObjectRef, weights: dict[str, int], images: ServingImages) -> dict:
    """Gateway API HTTPRoute splitting requests between versions by weight."""
    namespace, name = images.gateway.split("/", 1)
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": child_metadata(ref, dns_name(ref.name)),
        "spec": {
            "parentRefs": [{"name": name, "namespace": namespace}],
            "hostnames": [f"{ref.name}.{ref.namespace}.{images.gateway_domain}"],
            "rules": [{
                "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                "backendRefs": [{"name": dns_name(ref.name, role), "port": 80, "weight": weight}
                                for role, weight in sorted(weights.items(), key=lambda kv: kv[0] != "primary")],
            }],
        },
    }


def rollout_failed(deployment: dict) -> str | None:
    """The Deployment controller's verdict that a rollout is stuck (its
    progress deadline passed), or None."""
    for condition in deployment.get("status", {}).get("conditions", []):
        if (condition.get("type") == "Progressing" and condition.get("status") == "False"
                and condition.get("reason") == "ProgressDeadlineExceeded"):
            return condition.get("message") or "progress deadline exceeded"
    return None


# Waiting reasons of a container that cannot run (as opposed to one starting).
STUCK = ("CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "CreateContainerConfigError",
         "CreateContainerError", "RunContainerError")


def container_troubles(pods: list[dict]) -> list[str]:
    """What went wrong inside a version's Pods, as the kubelet reports it:
    containers that died and were restarted (with the last exit's reason,
    OOMKilled for one the kernel killed at its memory limit) and containers
    that cannot start. A Deployment only counts unavailable replicas; this
    says why, during the outage and after the recovery."""
    troubles = []
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        status = pod.get("status", {})
        for container in status.get("initContainerStatuses", []) + status.get("containerStatuses", []):
            restarts = container.get("restartCount", 0)
            last = container.get("lastState", {}).get("terminated") or {}
            waiting = container.get("state", {}).get("waiting", {}).get("reason")
            if not restarts and waiting not in STUCK:
                continue
            words = [f"{pod['metadata']['name']}/{container['name']}"]
            if restarts:
                words.append(f"restarted {restarts}x")
            if last:
                words.append(f"(last: {last.get('reason') or 'exit ' + str(last.get('exitCode'))}"
                             f" at {last.get('finishedAt', '?')})")
            if waiting in STUCK:
                words.append(f"now {waiting}")
            troubles.append(" ".join(words))
    return troubles
