"""Pools on the cluster (the kubernetes backend): InferenceServices that name
a pool share one Pod of Triton members and a front in the operator's
namespace (kubeloop.serving.builders.pools), instead of Deployments of
their own.

The pool's objects belong to no service: the first to join creates them,
each keeps them as the pool's size says, and the last to leave deletes
them. A pooled service is Ready once the front of each pool Pod the
pool's Service sends requests to answers its model ready (asked through
the API server's proxy, which works wherever the operator runs): each has
its routes and its versions are in its repository. The model itself is loaded on its first
request, as in a local pool.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from kubeloop.api.constants import ANNOTATION_INPUT_HASH
from kubeloop.api.refs import ObjectRef
from kubeloop.kube import Kube, KubeError
from kubeloop.serving.base import (
    PoolSize, ServingRequest, ServingState, pooled_answering, pooled_name, pooled_readiness, taken_out,
    unknown_pool)
from kubeloop.serving.builders.pools import (
    LABEL_POOL, LABEL_POOL_PART, LABEL_ROUTES_SHARD, build_pool, build_routes, grpc_address, peers_name, pool_name,
    route_manager, route_shard, url,
)
from kubeloop.serving.builders.workloads import ROUTER_PORT, ServingImages, container_troubles
from kubeloop.serving.routes import build_router_config


class ClusterPools:
    def __init__(self, kube: Kube, images: ServingImages, sizes: dict[str, PoolSize], namespace: str | None):
        self.kube = kube
        self.images = images
        self.sizes = sizes
        self.namespace = namespace

    @property
    def serving(self) -> bool:
        """Whether services may be in pools here (else none is looked for:
        the operator has no rights on ConfigMaps in its namespace then)."""
        return bool(self.sizes and self.namespace)

    def problem(self, pool: str) -> str | None:
        if self.images.router is None:
            return (f"spec.pool {pool}: pools on a cluster are served by kubeloop's front: set the "
                    "operator's KUBELOOP_ROUTER_IMAGE, or leave spec.pool out")
        if not self.namespace:
            return (f"spec.pool {pool}: pools run in the operator's namespace: set its KUBELOOP_OPERATOR_NAMESPACE, "
                    "or leave spec.pool out")
        return unknown_pool(pool, self.sizes)

    def serve(self, request: ServingRequest, request_log: str | None, own: Callable[[ServingRequest], ServingState],
              drop_own: Callable[[ObjectRef], None]) -> ServingState:
        """A service that names a pool joins it (what it ran of its own goes:
        drop_own); one that does not leaves any pool it was in and runs its own (own)."""
        if request.spec.pool:
            drop_own(request.ref)
            return self.ensure(request, request_log)
        if self.serving:
            self.leave(request.ref)
        return own(request)

    def ensure(self, request: ServingRequest, request_log: str | None) -> ServingState:
        return taken_out(lambda wanted: self._ensure(wanted, request_log), request)

    def _ensure(self, request: ServingRequest, request_log: str | None) -> ServingState:
        pool, ref = request.spec.pool, request.ref
        name = pooled_name(ref)
        config = build_router_config(request, name, "", request_log, ("primary", "canary", "shadow"),
                                     published_stores_only=True)
        routes = build_routes(pool, self.namespace, f"{name}.json", config)
        held = self._routes_holding(ref)
        self.leave(ref, keep=pool, held=held)
        if held.get(pool) != routes["data"][f"{name}.json"]:
            self.kube.apply(routes, field_manager=route_manager(name))
        deployment = self._ensure_pool(pool)
        return self._observe(pool, name, deployment, request.by_role())

    def _ensure_pool(self, pool: str) -> dict:
        """The pool's objects as its size says (applied only when the live
        Deployment was built from other inputs); the live Deployment."""
        desired = build_pool(pool, self.sizes[pool], self.namespace, self.images)
        wanted = next(o for o in desired if o["kind"] == "Deployment")
        live = self.kube.get("apps/v1", "Deployment", pool_name(pool), self.namespace)
        hash_of = (lambda o: (o or {}).get("metadata", {}).get("annotations", {}).get(ANNOTATION_INPUT_HASH))
        if live is None or hash_of(live) != hash_of(wanted):
            applied = [self.kube.apply(obj) for obj in desired]
            live = next(o for o in applied if o["kind"] == "Deployment")
        return live

    def _observe(self, pool: str, name: str, deployment: dict, versions: dict[str, str]) -> ServingState:
        served = dict(url=url(pool, self.namespace), grpc_address=grpc_address(pool, self.namespace))
        status = deployment.get("status", {})
        current = deployment.get("metadata", {}).get("generation") == status.get("observedGeneration")
        pods = self.kube.list("v1", "Pod", self.namespace, f"{LABEL_POOL}={pool}")
        troubles = container_troubles(pods)
        serving = [p for p in pods if _serving(p)]
        if not (current and status.get("availableReplicas", 0) >= 1 and serving):
            return ServingState(ready=dict.fromkeys(versions, False),
                                message="; ".join([f"pool {pool}: its Pod is starting", *troubles]),
                                failing=bool(troubles), **served)
        answers = {role: [self._version_ready(pool, name, pod, version) for pod in serving]
                   for role, version in versions.items()}
        ready, rolled_back, why = pooled_readiness({role: (all(a.ready for a in found), next(
            (a.failed for a in found if a.failed), "")) for role, found in answers.items()})
        waiting = [a.waiting for found in answers.values() for a in found if a.waiting]
        message = "; ".join(([why] if why else waiting[:1]) + troubles)
        answering = None if ready["primary"] else pooled_answering(
            versions["primary"], [self._answering(name, pod) for pod in serving])
        return ServingState(ready=ready, ready_replicas=len(serving) if ready["primary"] or answering else 0,
                            message=message, rolled_back=rolled_back, answering=answering, **served)

    def _answering(self, name: str, pod: dict) -> str | None:
        """The version the pool Pod's front answers the model with now (None: none)."""
        try:
            return self.kube.headers("GET", self._front_path(pod, f"/v2/models/{name}/ready"),
                                     timeout=10).get("X-Model-Version")
        except KubeError:
            return None

    def _version_ready(self, pool: str, name: str, pod: dict, version: str) -> VersionAnswer:
        """Whether the pool Pod's front answers a version of the model ready.
        Asked of each Pod its Service sends requests to, through the API
        server's proxy (which works wherever the operator runs)."""
        pod_name = pod["metadata"]["name"]
        path = self._front_path(pod, f"/v2/models/{name}/versions/{version}/ready")
        try:
            self.kube.request("GET", path, timeout=10)
        except KubeError as exc:
            if exc.status == 404:
                return VersionAnswer(False, waiting=f"pool {pool}: its front in {pod_name} is taking up {name} "
                                                    "(its versions are being fetched)")
            if exc.status == 503 and exc.message:  # the front's reason: a failed load, or its stores opening
                return VersionAnswer(False, failed=f"pool {pool}: {exc.message} ({pod_name})")
            return VersionAnswer(False, waiting=f"pool {pool}: {name} is not ready in {pod_name}: {exc}")
        return VersionAnswer(True)

    def _front_path(self, pod: dict, path: str) -> str:
        """A path of the pool Pod's front, through the API server's proxy."""
        return f"/api/v1/namespaces/{self.namespace}/pods/{pod['metadata']['name']}:{ROUTER_PORT}/proxy{path}"

    def _routes_holding(self, ref: ObjectRef) -> dict[str, str]:
        """Pool -> the service's router file there, for each pool holding one
        (read from the service's shard of each pool only)."""
        key = f"{pooled_name(ref)}.json"
        selector = f"{LABEL_POOL_PART}=routes,{LABEL_ROUTES_SHARD}={route_shard(key)}"
        found = self.kube.list("v1", "ConfigMap", self.namespace, selector) if self.namespace else []
        return {cm["metadata"]["labels"][LABEL_POOL]: cm["data"][key] for cm in found if key in (cm.get("data") or {})}

    def leave(self, ref: ObjectRef, keep: str | None = None, held: dict[str, str] | None = None) -> None:
        """The service out of every pool but keep; a pool it was the last
        one in goes. A service joining at that moment finds the pool gone
        on its next reconcile and creates it again."""
        name = pooled_name(ref)
        for pool in sorted(set(self._routes_holding(ref) if held is None else held) - {keep}):
            left = self.kube.apply(build_routes(pool, self.namespace, f"{name}.json", None),
                                   field_manager=route_manager(name))
            if not (left or {}).get("data"):
                self._delete_if_empty(pool)

    def _delete_if_empty(self, pool: str) -> None:
        """The pool's objects gone once no shard of its routes holds a service."""
        shards = self.kube.list("v1", "ConfigMap", self.namespace, f"{LABEL_POOL}={pool},{LABEL_POOL_PART}=routes")
        if any(cm.get("data") for cm in shards):
            return
        for api_version, kind, obj in (("apps/v1", "Deployment", pool_name(pool)), ("v1", "Service", pool_name(pool)),
                                       ("v1", "Service", peers_name(pool)), ("v1", "ConfigMap", pool_name(pool)),
                                       *(("v1", "ConfigMap", cm["metadata"]["name"]) for cm in shards)):
            self.kube.delete(api_version, kind, obj, self.namespace)


class VersionAnswer(NamedTuple):
    """A pool Pod's front's answer to a version's readiness."""

    ready: bool
    failed: str = ""
    """Why the front says it is not ready (its load failed, or its feature stores are opening)."""
    waiting: str = ""
    """What it is waiting for, where the front did not say (it has not taken the version up yet)."""


def _serving(pod: dict) -> bool:
    """Whether the pool's Service sends the Pod requests: Ready, and not stopping."""
    conditions = pod.get("status", {}).get("conditions") or []
    return not pod["metadata"].get("deletionTimestamp") and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
