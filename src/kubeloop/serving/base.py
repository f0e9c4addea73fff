"""The serving backend port: make a set of model versions answer requests."""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass, field, replace
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from kubeloop.api.refs import ObjectRef
from kubeloop.api.serving import InferenceServiceSpec
from kubeloop.gpu.placement import PlacementDecision
from kubeloop.registry.base import ModelVersion

Role = Literal["primary", "canary", "shadow"]


def triton_name(model: str) -> str:
    """The Triton model name of a registered model (Triton's names allow
    fewer characters than MLflow's)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", model)


def pooled_name(ref: ObjectRef) -> str:
    """A pooled service's Triton model: namespace.name (unique in any pool)."""
    return triton_name(f"{ref.namespace}.{ref.name}")


class PoolSize(BaseModel):
    """A pool as the operator's KUBELOOP_SERVING_POOLS sizes it."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="forbid")

    members: int = Field(ge=1, le=64)
    """Triton servers in the pool."""
    memory_mib: float = Field(gt=0, alias="memoryMiB")
    """Each member's memory budget (MiB) for the models it holds: what they
    add to the empty server, its backends' processes included, measured as
    memory no other process shares; a tenth is kept free."""
    estimate_mib: float = Field(default=0.0, ge=0, alias="estimateMiB")
    """The room a model gets until its first load is measured (0: the median
    of the sizes measured so far)."""
    spread_at: int = Field(default=4, ge=0, alias="spreadAt")
    """Requests under way to one model on every member holding it from which
    the model is loaded on another member with room too (0: never)."""
    replicas: int = Field(default=1, ge=1, le=16)
    """Copies of the pool on the kubernetes backend (Pods, each with its own
    front and members, each loading the models its own traffic asks for):
    more than one keeps the pool's services answered while a Pod or its
    node is lost. The local backend runs one."""
    detailed_metrics: int = Field(default=100, ge=0, alias="detailedMetrics")
    """Services whose latency and prediction histograms are their own; the
    rest share series labelled _other (services in a rollout keep their own:
    its analysis reads them). Request counters stay per service."""


def unknown_pool(pool: str, sizes: dict[str, PoolSize]) -> str | None:
    """Why a service cannot join the pool its spec names (None: the operator sizes it)."""
    if pool in sizes:
        return None
    named = ", ".join(sorted(sizes)) or "none"
    return (f"the operator has no pool '{pool}' (its KUBELOOP_SERVING_POOLS names {named}): set spec.pool to "
            "one of them, or leave it out for a Triton of the service's own")


class ServingUnavailable(Exception):
    """The serving backend cannot act right now (retry with backoff)."""


@dataclass(frozen=True)
class ServedVersion:
    """One model version and the share of traffic it gets."""

    role: Role
    model: ModelVersion
    percent: int


@dataclass(frozen=True)
class ServingRequest:
    """Everything a backend needs to serve an InferenceService."""

    ref: ObjectRef
    spec: InferenceServiceSpec
    versions: tuple[ServedVersion, ...]
    placement: PlacementDecision

    def version(self, role: Role) -> ServedVersion | None:
        return next((v for v in self.versions if v.role == role), None)

    def by_role(self) -> dict[str, str]:
        """Role -> the registered version it serves."""
        return {v.role: v.model.version for v in self.versions}


@dataclass(frozen=True)
class ServingState:
    """What the backend observed after converging."""

    url: str | None
    ready: dict[str, bool] = field(default_factory=dict)
    """Readiness per role."""
    grpc_address: str | None = None
    """host:port of the KServe v2 gRPC endpoint, where one is served."""
    ready_replicas: int = 0
    message: str = ""
    rolled_back: tuple[str, ...] = ()
    """Roles the backend took out of service because they failed readiness."""
    failing: bool = False
    """A role is short of replicas because its containers died (an OOM kill,
    a crash) or cannot start: an outage, not a rollout in progress."""
    answering: str | None = None
    """While a new set of versions loads in place, the primary version that
    keeps answering meanwhile (None when nothing does)."""
    traffic: dict[str, int] | None = None
    """The percent of requests each role really gets (the shadow: of requests
    copied to it), where the backend cannot split as asked; None: as asked."""

    @property
    def primary_ready(self) -> bool:
        return self.ready.get("primary", False)


def pooled_readiness(answers: dict[str, tuple[bool, str]]) -> tuple[dict[str, bool], tuple[str, ...], str]:
    """A pooled service's readiness per role, from the pool front's answer
    to each role's version (ready, and why not where it says): the roles
    ready, those rolled back (a canary or shadow whose version failed to
    load while the primary's answers ready: Triton loads a model's versions
    all or none, so it must leave for the primary to load again), and what
    to say (pure)."""
    primary = answers["primary"][0]
    rolled_back = tuple(role for role, (ready, why) in answers.items()
                        if role != "primary" and primary and not ready and why)
    ready = {role: answer[0] for role, answer in answers.items() if role not in rolled_back}
    message = "; ".join(f"{role} {answers[role][1]}; rolled back" for role in rolled_back) or next(
        (why for ready, why in answers.values() if not ready and why), "")
    return ready, rolled_back, message


def pooled_answering(primary: str, fronts: list[str | None]) -> str | None:
    """While a pooled service's new primary version, not ready yet, is being
    taken up (its version fetched, its route read), the old version the
    pool's fronts still answer with: each front asked names the version its
    routes answer with (None: none, or not ready). None while a front
    answers nothing, or where none answers an older version (pure)."""
    older = {version for version in fronts if version != primary}
    if not fronts or None in older or len(older) != 1:
        return None
    return older.pop()


def taken_out(ensure: Callable[[ServingRequest], ServingState], request: ServingRequest) -> ServingState:
    """A pooled service's ensure(request); where it rolls roles back, their
    versions leave the pool's routes and repository at once (ensured again
    without them): a pool loads a model's versions all or none, so its
    primary serves again only once they have gone."""
    state = ensure(request)
    if state.rolled_back:
        ensure(replace(request, versions=tuple(v for v in request.versions if v.role not in state.rolled_back)))
    return state


class ServingBackend(abc.ABC):
    """Runs Triton for InferenceServices."""

    name: str
    reads_online_features: bool = False
    """Whether the operator keeps the online stores this backend's serving
    path reads (entity requests) materialised."""
    published_stores_only: bool = False
    """Whether the serving path runs in Pods, which read only stores recorded
    as a published feature_store.yaml, never a repository folder on the
    operator's machine."""

    @abc.abstractmethod
    def ensure(self, request: ServingRequest) -> ServingState:
        """Converge the served versions onto the request (idempotent)."""

    @abc.abstractmethod
    def delete(self, ref: ObjectRef) -> None:
        """Stop serving the object; a no-op if nothing runs."""

    def pool_problem(self, pool: str) -> str | None:
        """Why an InferenceService cannot join the pool here (None: it can)."""
        return (f"the {self.name} backend serves no pools (spec.pool {pool}): pools run on the local, "
                "kubernetes and kserve backends; set spec.backend to one of them, or leave spec.pool out for Tritons of the "
                "service's own")

    def request_log(self, ref: ObjectRef, spec: InferenceServiceSpec) -> str | None:
        """Where the object's logged requests are (what the drift job reads)."""
        return spec.request_logging.destination if spec.request_logging.enabled else None
