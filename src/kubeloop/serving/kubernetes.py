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
from kubeloop.kube import FIELD_MANAGER
from kubeloop.serving.base import ServingRequest, ServingState
from kubeloop.serving.builders.workloads import (
    build_children, deployment_name, effective_split, grpc_address, service_name, version_urls,
)
from kubeloop.serving.cluster import OWNED, ClusterServing, cluster_router_config, roll_back_stuck_canary

ROUTES = ("gateway.networking.k8s.io/v1", "HTTPRoute")
# Holds a Deployment's replica count while kubeloop lets go of it, until the
# HPA's first scale takes it over.
HANDOVER_MANAGER = "kubeloop-handover-to-hpa"


class KubernetesServing(ClusterServing):
    """Deployments and Services of the service's own (the front's Pods
    among them), or a pool's Pod (kubeloop.serving.clusterpools)."""

    name = "kubernetes"

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

    def _owned_kinds(self) -> tuple[tuple[str, str], ...]:
        return OWNED + ((ROUTES,) if self.images.gateway else ()) + self._claims()

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
