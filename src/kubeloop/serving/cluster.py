"""What the cluster backends (kubernetes, kserve) share: the pools their
services may join, the children they own and delete when no longer wanted,
their Pods' troubles, the front's request log and routes, and a canary that
never became ready."""

from __future__ import annotations

import abc
from typing import Callable

from kubeloop.api.children import owner_selector
from kubeloop.api.constants import LABEL_ROLE
from kubeloop.api.refs import ObjectRef
from kubeloop.kube import Kube, KubeError
from kubeloop.serving.base import (
    PoolSize, ServingBackend, ServingRequest, ServingState, ServingUnavailable, triton_name,
)
from kubeloop.serving.builders.workloads import LABEL_SERVING, ServingImages, container_troubles, rollout_failed
from kubeloop.serving.clusterpools import ClusterPools
from kubeloop.serving.routes import build_router_config
from kubeloop.serving.steady import Applied, CleanedUp

Troubles = Callable[[ObjectRef, str], list[str]]
"""A service's role -> what went wrong in its Pods' containers (role_troubles)."""

OWNED = (("apps/v1", "Deployment"), ("v1", "Service"), ("v1", "ConfigMap"),
         ("autoscaling/v2", "HorizontalPodAutoscaler"))
"""Kinds an InferenceService may own on either backend; children of these
kinds that the current spec no longer wants are deleted."""
CLAIM_TEMPLATES = ("resource.k8s.io/v1", "ResourceClaimTemplate")


class ClusterServing(ServingBackend):
    published_stores_only = True

    def __init__(self, kube: Kube, images: ServingImages, materialized: bool = False,
                 pools: dict[str, PoolSize] | None = None, pool_namespace: str | None = None,
                 cleaned: CleanedUp | None = None, troubles: Troubles | None = None):
        """materialized: the operator keeps the stores the router Pods read
        fresh (materialisation Jobs); only with a router image. pools: the
        operator's sizes; their Pods run in pool_namespace (kubeloop.serving.clusterpools),
        for either backend (KServe's Standard mode serves one model per predictor).
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

    @abc.abstractmethod
    def _ensure_own(self, request: ServingRequest) -> ServingState:
        """The service served by children of its own (not a pool)."""

    @abc.abstractmethod
    def _owned_kinds(self) -> tuple[tuple[str, str], ...]:
        """(api version, kind) of every child the service may own here."""

    def _owns(self, ref: ObjectRef, live: dict) -> bool:
        """Whether a child the owner labels select is the service's to delete."""
        return True

    def _claims(self) -> tuple[tuple[str, str], ...]:
        return (CLAIM_TEMPLATES,) if self.images.gpu_allocation == "dra" else ()

    def request_log(self, ref: ObjectRef, spec) -> str | None:  # noqa: ANN001 - InferenceServiceSpec
        return front_request_log(self.images, ref, spec)

    def delete(self, ref: ObjectRef) -> None:
        # ownerReferences make the garbage collector remove every child; a
        # pool belongs to no service, and a service leaves it here.
        self.cleaned.forget(ref)
        if self.pools.serving:
            self.pools.leave(ref)

    def _delete_unwanted(self, ref: ObjectRef, desired: list[dict]) -> None:
        """Delete the children the service owns and no longer wants; listed
        only when what it wants changed since this process last looked."""
        wanted = frozenset((o["apiVersion"], o["kind"], o["metadata"]["name"]) for o in desired)
        if not self.cleaned.due(ref, (self.name, wanted)):
            return
        for api_version, kind in self._owned_kinds():
            for live in self.kube.list(api_version, kind, ref.namespace, owner_selector(ref)):
                name = live["metadata"]["name"]
                if (api_version, kind, name) not in wanted and self._owns(ref, live):
                    self.kube.delete(api_version, kind, name, ref.namespace)
        self.cleaned.done(ref, (self.name, wanted))


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
