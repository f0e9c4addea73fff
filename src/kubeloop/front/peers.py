"""A pool's Pods as one pool: each model's requests go to the Pod that owns it.

Each pool Pod on a cluster is a whole pool (its front and its members), and
its Service spreads callers over the Pods. Left at that, every Pod would
load every model its share of the callers asks for: two Pods would hold two
copies of each model and make two cold loads where one would do. So a
front that receives a request for a model none of its members holds
loaded (inference, or the model's metadata, config, statistics or
readiness) sends it on to the model's owner among the pool's ready Pods,
and the owner serves it as any request (its canary split, request log and
metrics): the model is loaded once, on one Pod.

The owner is chosen by rendezvous hashing over the Pods' addresses, which
every front computes alike from the same list, and which moves only the
models of a Pod that comes or goes. The list is the pool's headless
Service, resolved every few seconds, plus the front itself: two fronts may
see the list differently for a while (cluster DNS caches its answers), and
then a model may be loaded on two Pods, as it was before there were
owners. A request sent on is marked, and a marked request is
served where it arrives, so none goes round. A model a front holds loaded
is served there (after a roll, until it is unloaded as any idle model).

A hot model is spread over Pods as over a Pod's members: an owner whose
every member holding the model has the pool's spreadAt of its requests
under way marks its answer to a request sent on (HOT), and the front that
sent it loads a copy in the background; its requests for the model go to
the owner until the copy is loaded, and are served where it is after. An
owner that cannot be reached (a Pod gone, its address not yet out of the
list) is left out until the next resolution and the request served where
it arrived; an owner reached that fails to answer is a 502 naming it (the
request may have run there, so it is not run twice).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
from dataclasses import replace
from typing import Awaitable, Callable, Iterable, NamedTuple

from kubeloop.front.httpserver import Request, Response, header_lines, json_response
from kubeloop.front.upstream import Unreachable, UpstreamError, Upstreams

log = logging.getLogger("kubeloop.peers")
FORWARDED = b"x-kubeloop-pool-peer"
"""Marks a request a peer sent on: it is served where it arrives."""
HOT = b"x-kubeloop-pool-hot"
"""Marks an owner's answer when the model is busy on every member holding it there."""
RESOLVE_SECONDS = 5.0
CONNECT_SECONDS = 1.0
"""A peer on the cluster's network answers a connection at once; a gone Pod's address may never."""
FORWARD_SECONDS = 300.0
"""An owner's answer may wait for a cold load, and for the unloads before it."""
_NOT_SENT_ON = {b"host", b"content-length", b"content-encoding", b"accept-encoding", b"connection",
                b"transfer-encoding", b"expect", b"keep-alive", b"te", b"upgrade"}
"""The request's body arrives decoded, and the answer goes back uncompressed
(the front that received the request compresses it as its caller asks)."""
_NOT_SENT_BACK = {"content-length", "content-type", "content-encoding", "connection", "keep-alive",
                  "transfer-encoding", "date", "server", HOT.decode()}

Resolver = Callable[[str, int], Awaitable[Iterable[str]]]


class Forwarded(NamedTuple):
    response: Response
    hot: bool
    """The owner found the model busy: a copy here would take some of its requests."""


def owner(model: str, peers: Iterable[str]) -> str:
    """The peer that owns a model: the highest hash of peer and model (pure;
    a peer's leaving moves only the models it owned)."""
    return max(peers, key=lambda peer: hashlib.blake2b(f"{peer}/{model}".encode(), digest_size=8).digest())


def address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def resolve(host: str, port: int) -> list[str]:
    """The addresses a name resolves to (a headless Service's ready Pods)."""
    found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({address(info[4][0], port) for info in found})


class Peers:
    """host: the pool's headless Service; me: this front's own address (its Pod's IP)."""

    def __init__(self, host: str, port: int, me: str, resolver: Resolver = resolve):
        self.host, self.port, self.me = host, port, address(me, port)
        self.resolver = resolver
        self.peers: frozenset[str] = frozenset({self.me})
        self.upstream = Upstreams(timeout=FORWARD_SECONDS, connect_timeout=CONNECT_SECONDS)
        self.forwarded = 0
        """Requests sent on to their model's owner."""
        self.unreachable = 0
        """Requests served here because their owner could not be reached."""
        self._resolving: asyncio.Task | None = None

    async def start(self) -> None:
        await self.refresh()
        self._resolving = asyncio.create_task(self._resolve_forever())

    def close(self) -> None:
        if self._resolving:
            self._resolving.cancel()
        self.upstream.close()

    async def refresh(self) -> None:
        try:
            found = set(await self.resolver(self.host, self.port))
        except OSError as exc:  # the Service has no ready Pod yet (NXDOMAIN), or DNS is down
            log.debug("cannot resolve the pool's peers at %s: %s", self.host, exc)
            found = set()
        self.peers = frozenset(found | {self.me})

    async def _resolve_forever(self) -> None:
        while True:
            await asyncio.sleep(RESOLVE_SECONDS)
            try:
                await self.refresh()
            except Exception:  # one bad answer must not end the look-ups for good
                log.exception("cannot take up the pool's peers; trying again")

    def owner_elsewhere(self, model: str) -> str | None:
        """The peer that owns the model; None: this front does."""
        if len(self.peers) == 1:
            return None
        chosen = owner(model, self.peers)
        return None if chosen == self.me else chosen

    async def forward(self, peer: str, request: Request) -> Forwarded | None:
        """The owner's answer; None when it could not be reached (serve it here)."""
        lines = b"".join(b"%s: %s\r\n" % (k, v) for k, v in request.headers.items() if k not in _NOT_SENT_ON)
        # A HEAD is sent on as its GET: this front answers its caller without the body.
        method = b"GET" if request.method == "HEAD" else request.method.encode()
        try:
            answer = await self.upstream.call(method, f"http://{peer}{request.path}", request.body,
                                              lines + FORWARDED + b": 1\r\n")
        except Unreachable as exc:
            log.warning("pool peer %s cannot be reached (%s): serving here until it resolves again", peer, exc)
            self.peers = self.peers - {peer}
            self.unreachable += 1
            return None
        except UpstreamError as exc:
            return Forwarded(json_response(
                {"error": f"the pool Pod that serves this model ({peer}) did not answer: {exc}"}, 502), False)
        self.forwarded += 1
        back = {k: v for k, v in answer.headers.items() if k not in _NOT_SENT_BACK}
        return Forwarded(Response(answer.status, answer.body, answer.headers.get("content-type", "application/json"),
                                  header_lines(back)), HOT.decode() in answer.headers)


def marked_hot(response: Response) -> Response:
    """An owner's answer to a request sent on, telling its sender the model is busy here."""
    return replace(response, headers=response.headers + HOT + b": 1\r\n")
