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
from kubeloop.api.children import owner_selector
from kubeloop.serving.builders.workloads import (
    ServingImages, build_router, build_service, grpc_address, router_name, service_name,
)
from kubeloop.kube import Kube, KubeError
from kubeloop.serving.base import PoolSize, ServingBackend, ServingRequest, ServingState, ServingUnavailable
from kubeloop.serving.clusterpools import ClusterPools
from kubeloop.serving.kubernetes import (
    CLAIM_TEMPLATES, OWNED, Troubles, cluster_router_config, front_request_log, role_troubles, roll_back_stuck_canary,
)
from kubeloop.serving.steady import Applied, CleanedUp

KSERVE_OWNED = OWNED + ((KSERVE_API, "InferenceService"),)


class KServeServing(ServingBackend):
    name = "kserve"
    published_stores_only = True

    def __init__(self, kube: Kube, images: ServingImages, materialized: bool = False,
                 pools: dict[str, PoolSize] | None = None, pool_namespace: str | None = None,
                 cleaned: CleanedUp | None = None, troubles: Troubles | None = None):
        """materialized: the operator keeps the stores the router Pods read
        fresh (materialisation Jobs); only with a router image. pools: as
        the kubernetes backend's, served by the same pool Pods (KServe's
        Standard mode serves one model per predictor). cleaned, troubles: as
        the kubernetes backend's."""
        self.kube = kube
        self.images = images
        self.reads_online_features = materialized and images.router is not None
        self._storage_container_applied = False
        self.pools = ClusterPools(kube, images, pools or {}, pool_namespace)
        self.cleaned = cleaned or CleanedUp()
        self.applied = Applied(kube)
        self.troubles = troubles or (lambda ref, role: role_troubles(kube, ref, role))

    def pool_problem(self, pool: str) -> str | None:
        return self.pools.problem(pool)

    def ensure(self, request: ServingRequest) -> ServingState:
        try:
            return self.pools.serve(request, self.request_log(request.ref, request.spec), self._ensure_own,
                                    lambda ref: self._delete_unwanted(ref, []))
        except KubeError as exc:
            if exc.transient:
                raise ServingUnavailable(str(exc)) from exc
            raise

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

    def request_log(self, ref: ObjectRef, spec) -> str | None:  # noqa: ANN001 - InferenceServiceSpec
        return front_request_log(self.images, ref, spec)

    def delete(self, ref: ObjectRef) -> None:
        # ownerReferences make the garbage collector remove every child; a
        # pool belongs to no service, and a service leaves it here.
        self.cleaned.forget(ref)
        if self.pools.serving:
            self.pools.leave(ref)

    def _delete_unwanted(self, ref: ObjectRef, desired: list[dict]) -> None:
        """Delete what the InferenceService owns and no longer wants. KServe
        copies an InferenceService's labels onto the Deployment, Service and
        HPA it makes, so the owner labels alone would match KServe's
        children too: only objects owned by kubeloop's InferenceService go."""
        wanted = frozenset((o["kind"], o["apiVersion"], o["metadata"]["name"]) for o in desired)
        if not self.cleaned.due(ref, (self.name, wanted)):
            return
        claims = (CLAIM_TEMPLATES,) if self.images.gpu_allocation == "dra" else ()
        for api_version, kind in KSERVE_OWNED + claims:
            for live in self.kube.list(api_version, kind, ref.namespace, owner_selector(ref)):
                owners = {o.get("uid") for o in live["metadata"].get("ownerReferences", [])}
                if ref.uid in owners and (kind, api_version, live["metadata"]["name"]) not in wanted:
                    self.kube.delete(api_version, kind, live["metadata"]["name"], ref.namespace)
        self.cleaned.done(ref, (self.name, wanted))

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
