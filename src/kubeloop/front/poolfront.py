"""A pool's front: one process serving every InferenceService of a pool of
Triton servers (kubeloop.front.pool), each through a router of its own
(kubeloop.front.router: its canary, shadow, request log and entity
requests as a dedicated front's).

Its routes are a folder of router files, one per service, that the serving
backend writes and removes; the front takes up a new, changed or removed
file within half a second. A request reaches the service whose model it
names: the registered model's name where one service in the pool serves
that model, the service's Triton name (namespace.name) always. A removed
service's model is unloaded wherever it is loaded. Where the pool is several
Pods (a cluster's replicas), a request for a model no member here holds
goes to the Pod that owns it (kubeloop.front.peers).

Metrics on /metrics: every router's series (each carries its service), and
the pool's, per member only: loads, unloads, hits, failed loads, cold-load
times, memory in use and models held.

    python -m kubeloop.front.poolfront --config pool.json --port 8080 [--grpc-port 8081]
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit
from typing import AsyncIterator, Awaitable, Iterator, NamedTuple

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

from kubeloop.front.memory import private_by_process, server_on_port
from kubeloop.front.httpserver import Request, Response, json_response
from kubeloop.front.peers import FORWARDED, Peers, marked_hot
from kubeloop.front.modelcontrol import Member
from kubeloop.front.pool import UNSERVED, Pool
from kubeloop.front.router import Metrics, Router, listening, main
from kubeloop.front.upstream import Upstreams, UpstreamError

log = logging.getLogger("kubeloop.poolfront")
WATCH_SECONDS = 0.5
FULL_SYNC_ROUNDS = 120
COARSE_CLOCK_NS = 50_000_000
MEMBERS_UP_SECONDS = 600.0
POD_IP = "KUBELOOP_POD_IP"
"""The front's own address among its pool's Pods (the downward API's status.podIP)."""


@dataclass(frozen=True)
class PoolMember:
    url: str
    """Triton's HTTP URL."""
    grpc: str
    """Triton's gRPC address (host:port): where the pool loads and unloads models."""
    pid: int | None
    """The tritonserver's, whose memory (with its backends' processes) is
    measured; None: found by its URL's port (kubeloop.front.memory.server_on_port)."""
    budget_mib: float


@dataclass(frozen=True)
class PoolConfig:
    name: str
    members: dict[str, PoolMember]
    routes: Path
    """The folder of router files, one per service."""
    estimate_mib: float = 0.0
    """The room a model of unknown size gets until its first load is measured."""
    spread_at: int = 0
    """Requests under way to a model on each member holding it from which it is copied to another (0: never)."""
    detailed_metrics: int | None = None
    """Services whose histograms are their own (Metrics.detailed_limit)."""
    synced: Path | None = None
    """A file written once the routes folder holds every route there is (a
    pool Pod's repository container writes it after its first round): the
    front is not ready before it has taken them up. None: ready at once."""
    peers: tuple[str, int] | None = None
    """The pool's Pods (a headless Service's name, and their fronts' port)
    among which each model has an owner (kubeloop.front.peers). None: one
    front, as on one machine."""
    repository: Path | None = None
    """The members' model repository (read only): a model some of whose
    versions cannot load is loaded with the others. None: it fails whole."""

    @classmethod
    def load(cls, path: Path) -> "PoolConfig":
        data = json.loads(path.read_text())
        members = {name: PoolMember(m["url"], m["grpc"], int(m["pid"]) if m.get("pid") else None,
                                    float(m["budget_mib"]))
                   for name, m in data["members"].items()}
        peers = data.get("peers")
        return cls(data["name"], members, Path(data["routes"]), float(data.get("estimate_mib", 0.0)),
                   int(data.get("spread_at", 0)), data.get("detailed_metrics"),
                   Path(data["synced"]) if data.get("synced") else None,
                   (peers["host"], int(peers["port"])) if peers else None,
                   Path(data["repository"]) if data.get("repository") else None)


class Serving(NamedTuple):
    url: str
    """Where HTTP callers reach the pool's services."""
    grpc: str | None
    front: "PooledFront"


class PooledFront:
    def __init__(self, config: PoolConfig, peers: Peers | None = None):
        self.config = config
        self.peers = peers
        self.metrics = Metrics(detailed_limit=config.detailed_metrics)
        self.pids = {n: m.pid for n, m in config.members.items()}
        self.pool: Pool | None = None
        """None while the pool measures its members holding nothing."""
        self.pool = Pool({n: Member(m.url, m.grpc) for n, m in config.members.items()},
                         {n: m.budget_mib for n, m in config.members.items()}, self.processes,
                         estimate_mib=config.estimate_mib, spread_at=config.spread_at, repository=config.repository)
        self.metrics.registry.register(PoolCollector(self))
        self.routers: dict[str, Router] = {}
        """Router file name -> its router."""
        self.by_model: dict[str, list[Router]] = {}
        self.upstream = Upstreams()
        self._watching: asyncio.Task | None = None
        self._synced_from: int | None = None
        """When the latest sync began (ns since the epoch, as a file's mtime)."""
        self.taking_up: dict[str, asyncio.Task] = {}
        """Router file name -> its changed routes being taken up, or its removed
        model being unloaded (one at a time per service: a file written again
        meanwhile loads behind the unload, the member's lock keeping order)."""

    def processes(self, member: str) -> dict[int, float]:
        """The member's memory by process; a member named by its port is
        looked up again once its process has gone: its container restarted,
        and the pool learns that it holds nothing now."""
        before = self.pids[member]
        found = private_by_process(before) if before else {}
        if not found and self.config.members[member].pid is None:
            self.pids[member] = server_on_port(urlsplit(self.config.members[member].url).port)
            found = private_by_process(self.pids[member]) if self.pids[member] else {}
            if found and before and self.pool is not None:
                self.pool.restarted(member, sum(found.values()))
        return found

    async def start(self) -> None:
        await self.sync()
        self._watching = asyncio.create_task(self._watch())
        if self.peers is not None:
            await self.peers.start()

    async def stop(self) -> None:
        if self._watching:
            self._watching.cancel()
        for task in list(self.taking_up.values()):
            task.cancel()
        if self.peers is not None:
            self.peers.close()
        for router in self.routers.values():
            await router.stop()
        await self.pool.close()
        self.upstream.close()

    async def _watch(self) -> None:
        seen, rounds = None, 0
        while True:
            await asyncio.sleep(WATCH_SECONDS)
            rounds += 1
            try:
                # Router files are written by renaming them into the folder
                # (kubeloop.files.write_atomic), which moves the folder's
                # mtime: an unchanged folder spares a stat of every router's
                # file, which with a thousand services held up requests. A
                # full round now and then still catches a change a coarse
                # clock hid.
                folder = self.config.routes.stat().st_mtime_ns
                if folder == seen and rounds % FULL_SYNC_ROUNDS and self.ready():
                    continue
                await self.sync()
                seen = folder
            except Exception:  # one bad round must not end route reloads for good
                log.exception("the pool's front could not take up its routes; trying again")

    def ready(self) -> bool:
        """Whether the front has taken up every route (the synced file was
        there before its latest sync began)."""
        if self.config.synced is None:
            return True
        try:
            written = self.config.synced.stat().st_mtime_ns
        except FileNotFoundError:
            return False
        # A file's mtime comes from the kernel's coarse clock, up to a tick behind.
        return self._synced_from is not None and written + COARSE_CLOCK_NS <= self._synced_from

    async def sync(self) -> None:
        """Take up new router files, and start taking up changed and removed
        ones (each beside the others: one model's slow load or unload holds
        up no other service's change)."""
        began = time.time_ns()
        found = {p.name: p for p in self.config.routes.glob("*.json")}
        changed = set(self.routers) != set(found)
        for name in sorted(set(self.routers) - set(found)):
            router = self.routers.pop(name)
            if name in self.taking_up:
                self.taking_up[name].cancel()
            await router.stop()
            self.metrics.drop(router.config.service)
            self._start_taking_up(name, self._forget(router.config.triton_model))
            log.info("%s is served no more", router.config.service)
        for name, path in sorted(found.items()):
            router = self.routers.get(name)
            if router is None:
                try:
                    router = Router(path, self.metrics, self.pool)
                except (OSError, ValueError, KeyError) as exc:
                    log.warning("cannot read the routes in %s: %s", name, exc)
                    continue
                await router.start(self.upstream, watch=False)
                self.routers[name] = router
                log.info("serving %s (%s)", router.config.service, router.config.triton_model)
            elif router.routes_changed() and name not in self.taking_up:
                self._start_taking_up(name, self._take_up(router))
        if changed:
            self.by_model = index(self.routers.values())
        self._synced_from = began

    def _start_taking_up(self, name: str, change: Awaitable[None]) -> None:
        task = self.taking_up[name] = asyncio.create_task(change)

        def over(_: asyncio.Task) -> None:
            if self.taking_up.get(name) is task:
                del self.taking_up[name]
        task.add_done_callback(over)

    async def _take_up(self, router: Router) -> None:
        """The service's changed routes, once the members holding its model
        have loaded it again: until then its callers keep the routes they
        had, whose versions Triton serves while it loads the new ones (a
        version still loading answers 503). The routes taken up are those
        read before the reload began (the repository is written before
        them); a file written again meanwhile is reloaded for in turn.
        Routes that leave the repository as it was (a canary's next weight,
        a sample rate) are taken up at once: a reload would find nothing to
        load."""
        while router.routes_changed() and (found := router.read_routes()) is not None:
            if found[0].held() != router.config.held():
                await self._settle(self.pool.reload(router.config.triton_model))
            router.take_up(found)
            self.by_model = index(self.routers.values())

    async def _forget(self, model: str) -> None:
        # A coroutine of its own: the pool's unload is begun only once the
        # task runs, so a task cancelled before then leaves none unawaited.
        await self._settle(self.pool.forget(model))

    @staticmethod
    async def _settle(change: Awaitable[None]) -> None:
        """A reload or an unload of a changed or removed service's model;
        one that fails is left to the model's next request (a load) or
        its member's next need for room (an unload)."""
        try:
            await change
        except (*UNSERVED, UpstreamError) as exc:
            log.warning("the pool could not take up a change of model: %s", exc)

    def describe(self) -> dict:
        """What `kubeloop placement plan` reads: each model's measured size
        (MiB; models never loaded are absent) and what each member holds."""
        members = self.pool.residency.members
        return {"name": self.config.name, "sizesMiB": {m: round(v, 1) for m, v in self.pool.measured().items()},
                "members": {name: {"budgetMiB": round(m.budget_mib, 1), "usedMiB": round(m.used_mib, 1),
                                   "models": list(m.loaded)} for name, m in members.items()},
                **({"peers": sorted(self.peers.peers), "me": self.peers.me} if self.peers else {})}

    async def handle(self, request: Request) -> Response:
        parts = request.path.strip("/").split("/")
        if request.path == "/metrics":
            return Response(200, generate_latest(self.metrics.registry), CONTENT_TYPE_LATEST)
        if request.path == "/pool":
            return json_response(self.describe())
        if parts[:2] == ["v2", "health"] and len(parts) == 3 and parts[2] in ("ready", "live"):
            return Response(200 if parts[2] == "live" or self.ready() else 503)
        if parts == ["v2"]:
            return json_response({"name": f"kubeloop pool {self.config.name}", "extensions": []})
        if parts[:2] != ["v2", "models"] or len(parts) < 3:
            return json_response({"error": f"no route {request.path}"}, 404)
        routers = self.by_model.get(parts[2], [])
        if len(routers) > 1:
            names = ", ".join(sorted(r.config.triton_model for r in routers))
            return json_response({"error": f"several services in pool {self.config.name} serve {parts[2]}: "
                                           f"name one of {names}"}, 409)
        if not routers:
            return json_response({"error": f"pool {self.config.name} serves no model {parts[2]}"}, 404)
        if self.peers is not None:
            return await self._among_peers(routers[0], request)
        return await routers[0].handle(request)

    async def _among_peers(self, router: Router, request: Request) -> Response:
        """A request served here, or by its model's owner among the pool's
        Pods: inference, and the model's metadata, config, statistics and
        readiness, which a Pod not holding the model could only answer by
        loading a copy of it (or, for readiness, without knowing the owner's
        failed load)."""
        model = router.config.triton_model
        if FORWARDED in request.headers:
            hot = request.method == "POST" and self.pool.residency.busy(model)  # before this request counts
            response = await router.handle(request)
            return marked_hot(response) if hot and response.status == 200 else response
        peer = None if self.pool.has_loaded(model) else self.peers.owner_elsewhere(model)
        forwarded = await self.peers.forward(peer, request) if peer else None
        if forwarded is None:
            return await router.handle(request)
        if forwarded.hot:
            self.pool.warm(model)
        return forwarded.response


def index(routers) -> dict[str, list[Router]]:  # noqa: ANN001 - routers: an iterable of Router
    """Model name -> the routers serving it: each by its Triton name, and
    by its registered model's name (pure)."""
    found: dict[str, list[Router]] = {}
    for router in routers:
        for name in {router.config.model, router.config.triton_model}:
            found.setdefault(name, []).append(router)
    return found


class PoolCollector:
    """The pool's metrics, per member (never per model: a pool serves thousands)."""

    def __init__(self, front: PooledFront):
        self.front = front

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator:
        pool, name = self.front.pool, self.front.config.name
        yield from _counters(name, "kubeloop_pool_", pool.residency.counters, (
            ("loads", "Models loaded on a member (cold loads)."),
            ("unloads", "Models unloaded to make room or no longer served."),
            ("hits", "Requests to a model already loaded (or loading) on a member."),
            ("spreads", "Loads of a hot model's copy on a further member (in loads too)."),
            ("failed", "Loads that failed.")))
        if self.front.peers is not None:
            yield from _counters(name, "kubeloop_pool_peer_", self.front.peers, (
                ("forwarded", "Requests sent on to the pool Pod that owns their model."),
                ("unreachable", "Requests served here because their model's owner could not be reached.")))
        cold = list(pool.cold_seconds)
        summary = SummaryMetricFamily("kubeloop_pool_cold_load_seconds",
                                      "Time from a request's arrival to its model loaded, over the latest "
                                      f"{pool.cold_seconds.maxlen} cold loads.", labels=["pool"])
        summary.add_metric([name], len(cold), sum(cold))
        yield summary
        used = GaugeMetricFamily("kubeloop_pool_member_memory_mib",
                                 "A member's measured memory over its empty self (MiB).", labels=["pool", "member"])
        budget = GaugeMetricFamily("kubeloop_pool_member_budget_mib",
                                   "A member's budget, less the headroom kept free (MiB).", labels=["pool", "member"])
        held = GaugeMetricFamily("kubeloop_pool_member_models", "Models a member holds loaded.",
                                 labels=["pool", "member"])
        for member, state in pool.residency.members.items():
            used.add_metric([name, member], state.observed_mib)
            budget.add_metric([name, member], state.budget_mib)
            held.add_metric([name, member], len(state.loaded))
        yield from (used, budget, held)


def _counters(pool: str, prefix: str, source: object, fields: tuple[tuple[str, str], ...]) -> Iterator:
    """A counter family per field of source, labelled with the pool."""
    for field, text in fields:
        family = CounterMetricFamily(f"{prefix}{field}", text, labels=["pool"])
        family.add_metric([pool], getattr(source, field))
        yield family


async def members_up(config: PoolConfig) -> None:
    """Wait until every member answers live and its process is found: a
    member's memory holding no model is measured when the front starts
    (a pool Pod starts its front and its members together)."""
    upstream = Upstreams(timeout=5)
    deadline = time.monotonic() + MEMBERS_UP_SECONDS
    try:
        for name, member in config.members.items():
            while True:
                try:
                    live = (await upstream.call(b"GET", f"{member.url}/v2/health/live")).status == 200
                except UpstreamError:
                    live = False
                if live and (member.pid or server_on_port(urlsplit(member.url).port)):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"pool member {name} ({member.url}) did not come up "
                                       f"in {MEMBERS_UP_SECONDS:.0f} s")
                await asyncio.sleep(0.5)
    finally:
        upstream.close()


@asynccontextmanager
async def running(config_path: Path, host: str = "127.0.0.1", port: int = 0,
                  grpc_port: int | None = None) -> AsyncIterator[Serving]:
    config = PoolConfig.load(config_path)
    await members_up(config)
    me = os.environ.get(POD_IP)
    if config.peers and not me:
        log.warning("the pool's config names its peers but %s is not set: this front serves every request itself",
                    POD_IP)
    front = PooledFront(config, Peers(*config.peers, me) if config.peers and me else None)
    await front.start()
    try:
        async with listening(front.handle, host, port, grpc_port) as (url, grpc_address):
            yield Serving(url, grpc_address, front)
    finally:
        await front.stop()


if __name__ == "__main__":
    main("python -m kubeloop.front.poolfront", running)
