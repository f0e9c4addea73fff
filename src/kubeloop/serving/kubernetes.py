"""Serving on the cluster: Triton Deployments, Services and an HPA, owned by
the InferenceService so that Kubernetes garbage-collects them with it; with
a router image configured, the serving front in front of them (exact
canary split, shadow mirroring, request log). Without the front nothing
mirrors requests: a shadow's Deployment runs but gets no copies (its
traffic is reported as 0%)."""

from __future__ import annotations

from typing import Callable

from kubeloop.api.constants import LABEL_ROLE
from kubeloop.api.refs import ObjectRef
from kubeloop.api.children import owner_selector
from kubeloop.serving.builders.workloads import (
    LABEL_SERVING, ServingImages, build_children, container_troubles, deployment_name, effective_split, grpc_address,
    rollout_failed, service_name, version_urls,
)
from kubeloop.kube import FIELD_MANAGER, Kube, KubeError
from kubeloop.serving.base import (
    PoolSize, ServingBackend, ServingRequest, ServingState, ServingUnavailable, triton_name,
)
from kubeloop.serving.clusterpools import ClusterPools
from kubeloop.serving.routes import build_router_config
from kubeloop.serving.steady import Applied, CleanedUp

Troubles = Callable[[ObjectRef, str], list[str]]
"""A service's role -> what went wrong in its Pods' containers (role_troubles)."""

# Kinds an InferenceService may own; children of these kinds that the
# current spec no longer wants are deleted.
OWNED = (("apps/v1", "Deployment"), ("v1", "Service"), ("v1", "ConfigMap"),
         ("autoscaling/v2", "HorizontalPodAutoscaler"))
ROUTES = ("gateway.networking.k8s.io/v1", "HTTPRoute")
CLAIM_TEMPLATES = ("resource.k8s.io/v1", "ResourceClaimTemplate")
# Holds a Deployment's replica count while kubeloop lets go of it, until the
# HPA's first scale takes it over.
HANDOVER_MANAGER = "kubeloop-handover-to-hpa"


class KubernetesServing(ServingBackend):
    name = "kubernetes"
    published_stores_only = True

    def __init__(self, kube: Kube, images: ServingImages, materialized: bool = False,
                 pools: dict[str, PoolSize] | None = None, pool_namespace: str | None = None,
                 cleaned: CleanedUp | None = None, troubles: Troubles | None = None):
        """materialized: the operator keeps the stores the router Pods read
        fresh (materialisation Jobs); only with a router image. pools: the
        operator's sizes; their Pods run in pool_namespace (kubeloop.serving.clusterpools).
        cleaned: which services' unwanted children are gone (shared by the
        backends). troubles: a role's container troubles as the operator's
        Pod watch keeps them; without it, a LIST of the role's Pods."""
        self.kube = kube
        self.images = images
        self.reads_online_features = materialized and images.router is not None
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
        """Deployments of the service's own."""
        versions = {v.role: (v.model, v.percent) for v in request.versions}
        ref = request.ref
        rolled_back = roll_back_stuck_canary(self.kube, request, deployment_name(ref, "canary"),
                                             ("apps/v1", "Deployment", deployment_name(ref, "canary")))
        if rolled_back:
            versions.pop("canary")
        desired = build_children(request.ref, request.spec, versions, request.placement, self.images,
                                 self._router_config(request, versions))
        held = []
        for obj in desired:
            held.append(self.applied.apply(obj, before=self._hand_over_replicas(obj)))
        self._delete_unwanted(request.ref, desired)
        ready, available, wanted, messages, failing = self._observe(request.ref, desired, held)
        if rolled_back:
            messages.insert(0, f"canary rolled back: {rolled_back}")
        url = (f"http://{request.ref.name}.{request.ref.namespace}.{self.images.gateway_domain}" if self.images.gateway
               else f"http://{service_name(request.ref)}.{request.ref.namespace}.svc.cluster.local")
        if self.images.router is not None:  # the service answers once its router does
            ready["primary"] = ready.get("primary", False) and ready.pop("router", False)
        models = sum(n for role, n in available.items() if role != "router")
        return ServingState(url=url, grpc_address=grpc_address(request.ref), ready=ready, ready_replicas=models,
                            message="; ".join(messages), rolled_back=("canary",) if rolled_back else (), failing=failing,
                            traffic=self._traffic(versions, available, wanted))

    def _traffic(self, versions: dict, available: dict[str, int], wanted: dict[str, int]) -> dict[str, int]:
        """The share each role really gets: as asked through the router or a
        Gateway, else by replica ratio; the shadow's copies only through the router."""
        front = self.images.router is not None
        requested = {role: percent for role, (_model, percent) in versions.items() if role != "shadow"}
        traffic = effective_split(requested, available, wanted, exact=bool(self.images.gateway) or front)
        if "shadow" in versions:
            traffic["shadow"] = versions["shadow"][1] if front else 0
        return traffic

    def _router_config(self, request: ServingRequest, versions: dict) -> dict | None:
        """The front's routes for the versions still served (none without a router image)."""
        if self.images.router is None:
            return None
        return cluster_router_config(request, versions, self.request_log(request.ref, request.spec),
                                     version_urls(request.ref, versions))

    def request_log(self, ref: ObjectRef, spec) -> str | None:  # noqa: ANN001 - InferenceServiceSpec
        return front_request_log(self.images, ref, spec)

    def _hand_over_replicas(self, desired: dict) -> Callable[[dict | None], None] | None:
        """For a Deployment applied without its replica count (the HPA owns
        it now), what runs before the apply, with the Deployment as it is:
        if kubeloop still owns the count, another field manager takes it as it
        is, since server-side apply would otherwise remove the field and the
        Deployment would drop to one replica until the HPA scales it up again."""
        if desired["kind"] != "Deployment" or "replicas" in desired["spec"]:
            return None
        meta = desired["metadata"]

        def hand_over(live: dict | None) -> None:
            if live and owns_replicas(live, FIELD_MANAGER):
                self.kube.apply({"apiVersion": "apps/v1", "kind": "Deployment",
                                 "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                                 "spec": {"replicas": live["spec"]["replicas"]}}, field_manager=HANDOVER_MANAGER)
        return hand_over

    def delete(self, ref: ObjectRef) -> None:
        # ownerReferences make the garbage collector remove every child; a
        # pool belongs to no service, and a service leaves it here.
        self.cleaned.forget(ref)
        if self.pools.serving:
            self.pools.leave(ref)

    def _delete_unwanted(self, ref: ObjectRef, desired: list[dict]) -> None:
        wanted = frozenset((o["kind"], o["metadata"]["name"]) for o in desired)
        if not self.cleaned.due(ref, (self.name, wanted)):
            return
        extra = ((ROUTES,) if self.images.gateway else ()) + ((CLAIM_TEMPLATES,) if self.images.gpu_allocation == "dra" else ())
        for api_version, kind in OWNED + extra:
            for live in self.kube.list(api_version, kind, ref.namespace, owner_selector(ref)):
                if (kind, live["metadata"]["name"]) not in wanted:
                    self.kube.delete(api_version, kind, live["metadata"]["name"], ref.namespace)
        self.cleaned.done(ref, (self.name, wanted))

    def _observe(self, ref: ObjectRef, desired: list[dict], held: list[dict]
                 ) -> tuple[dict[str, bool], dict[str, int], dict[str, int], list[str], bool]:
        """Per role: readiness, available and wanted replicas; what to say;
        and whether a role is short of replicas because its containers die
        or cannot start. held: each of desired as the API server holds it
        now, status included (what its apply answered)."""
        ready: dict[str, bool] = {}
        available: dict[str, int] = {}
        wanted: dict[str, int] = {}
        messages = []
        failing = False
        for obj, live in zip(desired, held, strict=True):
            if obj["kind"] != "Deployment":
                continue
            role = obj["metadata"]["labels"][LABEL_ROLE]
            # An autoscaled Deployment wants what the HPA last chose.
            want = wanted[role] = obj["spec"].get("replicas", live.get("spec", {}).get("replicas", 1))
            status = live.get("status", {})
            current = (live.get("metadata", {}).get("generation") == status.get("observedGeneration"))
            have = available[role] = status.get("availableReplicas", 0) if current else 0
            updated = status.get("updatedReplicas", 0) if current else 0
            ready[role] = have >= want and updated >= want
            troubles = self.troubles(ref, role)
            failing = failing or (not ready[role] and bool(troubles))
            if not ready[role]:
                messages.append(f"{role}: {have}/{want} replicas available")
            messages += [f"{role}: {trouble}" for trouble in troubles]
        return ready, available, wanted, messages, failing


def owns_replicas(deployment: dict, manager: str) -> bool:
    """Whether the field manager's apply set holds spec.replicas."""
    return any(entry.get("manager") == manager and entry.get("operation") == "Apply"
               and "f:replicas" in entry.get("fieldsV1", {}).get("f:spec", {})
               for entry in deployment.get("metadata", {}).get("managedFields", []))


def front_request_log(images: ServingImages, ref: ObjectRef, spec) -> str | None:  # noqa: ANN001 - InferenceServiceSpec
    """With the front, where its routers log: the service's own destination,
    else a prefix of its own below the operator's."""
    if images.router is None or not spec.request_logging.enabled:
        return None
    if spec.request_logging.destination:
        return spec.request_logging.destination
    root = images.request_log
    # A folder in a router's Pod would vanish with it: only object storage outlives the Pods.
    return f"{root.rstrip('/')}/{ref.namespace}-{ref.name}" if root and root.startswith("s3://") else None


def role_troubles(kube: Kube, ref: ObjectRef, role: str) -> list[str]:
    """What went wrong in the containers of a role's Pods (see container_troubles)."""
    return container_troubles(kube.list("v1", "Pod", ref.namespace, f"{LABEL_SERVING}={ref.name},{LABEL_ROLE}={role}"))


def roll_back_stuck_canary(kube: Kube, request: ServingRequest, deployment: str,
                           owned: tuple[str, str, str]) -> str | None:
    """A canary whose Deployment passed its progress deadline (the Deployment
    controller's verdict): what kubeloop owns for it (api version, kind,
    name) goes, the primary keeps all traffic, and the reason comes back."""
    if request.version("canary") is None:
        return None
    namespace = request.ref.namespace
    live = kube.get("apps/v1", "Deployment", deployment, namespace)
    reason = rollout_failed(live) if live else None
    if reason:
        kube.delete(*owned, namespace)
    return reason


def cluster_router_config(request: ServingRequest, versions: dict, request_log: str | None,
                          urls: dict[str, str]) -> dict:
    """The routes of a router Pod in front of the versions' Services; entity
    requests only for versions whose feature store was recorded as a
    published feature_store.yaml (see build_router_config)."""
    return build_router_config(request, triton_name(versions["primary"][0].name), "", request_log,
                               roles=set(versions), version_urls=urls, published_stores_only=True)
