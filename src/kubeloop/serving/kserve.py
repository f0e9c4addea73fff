"""Serving through KServe: each served version is a KServe InferenceService
(Standard mode, kubeloop's Triton ServingRuntime, storage from the registry),
owned by kubeloop's InferenceService so that Kubernetes garbage-collects
them with it; with a router image configured, kubeloop's serving front
stands in front of the versions' predictors (exact canary split, shadow
mirroring, request log), as with the kubernetes backend. See
kubeloop.serving.builders.kserve for what each object holds."""

from __future__ import annotations

from kubeloop.api.refs import ObjectRef
from kubeloop.serving.builders.kserve import (
    KSERVE_API, build_inference_services, build_serving_runtime, build_storage_container, kserve_message,
    kserve_name, kserve_ready, predictor_name, predictor_urls,
)
from kubeloop.serving.base import ServingRequest, ServingState
from kubeloop.serving.builders.workloads import build_router, build_service, grpc_address, router_name, service_name
from kubeloop.serving.cluster import OWNED, ClusterServing, cluster_router_config, roll_back_stuck_canary

KSERVE_OWNED = OWNED + ((KSERVE_API, "InferenceService"),)


class KServeServing(ClusterServing):
    """A KServe InferenceService per version, or a pool's Pod
    (kubeloop.serving.clusterpools, as on the kubernetes backend)."""

    name = "kserve"
    _storage_container_applied = False
    """Whether this operator process applied the storage container yet."""

    def _ensure_own(self, request: ServingRequest) -> ServingState:
        """A KServe InferenceService per version (and the front before them)."""
        ref = request.ref
        versions = {v.role: (v.model, v.percent) for v in request.versions}
        # KServe makes the canary's predictor Deployment; kubeloop owns its KServe InferenceService.
        rolled_back = roll_back_stuck_canary(self.kube, request, predictor_name(ref, "canary"),
                                             (KSERVE_API, "InferenceService", kserve_name(ref, "canary")))
        if rolled_back:
            versions.pop("canary")
        self._ensure_runtime(ref.namespace)
        desired = build_inference_services(ref, request.spec, versions, request.placement, self.images)
        if self.images.router is not None:
            config = cluster_router_config(request, versions, self.request_log(ref, request.spec),
                                           predictor_urls(ref, versions))
            desired += build_router(ref, request.spec, config, self.images) + [build_service(ref, "router")]
        held = {(obj["kind"], obj["metadata"]["name"]): self.applied.apply(obj) for obj in desired}
        self._delete_unwanted(ref, desired)
        ready, available, messages, failing = self._observe(ref, list(versions), held)
        if rolled_back:
            messages.insert(0, f"canary rolled back: {rolled_back}")
        grpc = grpc_address(ref) if self.images.router is not None else None
        return ServingState(url=self._url(ref), grpc_address=grpc, ready=ready,
                            ready_replicas=sum(available.values()), message="; ".join(messages),
                            rolled_back=("canary",) if rolled_back else (), failing=failing,
                            traffic=self._traffic(versions))

    def _url(self, ref: ObjectRef) -> str:
        name = service_name(ref) if self.images.router is not None else predictor_name(ref, "primary")
        return f"http://{name}.{ref.namespace}.svc.cluster.local"

    def _traffic(self, versions: dict) -> dict[str, int]:
        """Through the front, as asked. Without it callers reach the primary's
        predictor alone: KServe v0.20 neither weights a canary nor mirrors."""
        if self.images.router is not None:
            return {role: percent for role, (_model, percent) in versions.items()}
        return {role: 100 if role == "primary" else 0 for role in versions}

    def _ensure_runtime(self, namespace: str) -> None:
        """kubeloop's Triton runtime in the namespace, and (once per
        operator process) the storage container for registry URIs."""
        self.applied.apply(build_serving_runtime(namespace, self.images))
        if not self._storage_container_applied:
            self.kube.apply(build_storage_container(self.images))
            self._storage_container_applied = True

    def _owned_kinds(self) -> tuple[tuple[str, str], ...]:
        return KSERVE_OWNED + self._claims()

    def _owns(self, ref: ObjectRef, live: dict) -> bool:
        """KServe copies an InferenceService's labels onto the Deployment,
        Service and HPA it makes, so the owner labels alone would match
        KServe's children too: only objects owned by kubeloop's InferenceService go."""
        return ref.uid in {o.get("uid") for o in live["metadata"].get("ownerReferences", [])}

    def _observe(self, ref: ObjectRef, roles: list[str], held: dict[tuple[str, str], dict]
                 ) -> tuple[dict[str, bool], dict[str, int], list[str], bool]:
        """Per role: KServe's readiness (from what the API server answered
        the apply, held by kind and name) and the predictor's available
        replicas (KServe's Deployment, read); what to say; and whether a
        role's containers die or cannot start."""
        ready: dict[str, bool] = {}
        available: dict[str, int] = {}
        messages: list[str] = []
        failing = False
        for role in roles:
            live = held.get(("InferenceService", kserve_name(ref, role))) or {}
            deployment = self.kube.get("apps/v1", "Deployment", predictor_name(ref, role), ref.namespace) or {}
            ready[role] = kserve_ready(live)
            available[role] = deployment.get("status", {}).get("availableReplicas", 0)
            troubles = self.troubles(ref, role)
            failing = failing or (not ready[role] and bool(troubles))
            if not ready[role]:
                messages.append(f"{role}: {kserve_message(live) or 'KServe has not reported Ready'}")
            messages += [f"{role}: {trouble}" for trouble in troubles]
        if self.images.router is not None:
            router = held.get(("Deployment", router_name(ref))) or {}
            router_up = router.get("status", {}).get("availableReplicas", 0) >= 1
            ready["primary"] = ready.get("primary", False) and router_up
            if not router_up:
                messages.append("router: no replica available")
        return ready, available, messages, failing
