"""The front's calls to Triton: keep-alive HTTP/1.1 connections per server,
an asyncio protocol over httptools' response parser.

Each call to Triton is a request written whole on an idle connection and an
answer read whole: a general client's per-request machinery (aiohttp's)
cost the front more CPU than Triton spent answering. A connection whose server
closed it while idle is noticed on reuse (nothing came back) and the call is
made once more on a new one; every other failure is the caller's
UpstreamError.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple
from urllib.parse import urlsplit

import httptools

MAX_CONNECTIONS = 256
"""Per server; more calls wait for a connection."""
TIMEOUT_SECONDS = 30.0


class UpstreamError(Exception):
    """The server could not be reached, closed the connection or did not answer in time."""


class Unreachable(UpstreamError):
    """No connection could be made: the request was never sent."""


class Answer(NamedTuple):
    status: int
    body: bytes
    headers: dict[str, str]
    """Lower-cased names."""


@dataclass(frozen=True, slots=True)
class Target:
    secure: bool
    host: str
    port: int
    path: bytes
    authority: bytes


@lru_cache(maxsize=1024)
def target(url: str) -> Target:
    """Where a URL's call goes (pure; http and https only)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is no http:// or https:// URL")
    secure = parts.scheme == "https"
    port = parts.port or (443 if secure else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(secure, parts.hostname, port, path.encode(), parts.netloc.encode())


def encode(method: bytes, to: Target, body: bytes, headers: bytes) -> bytes:
    """A request on the wire (pure). headers: extra header lines, each ending in CRLF."""
    return b"%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n%s\r\n%s" % (
        method, to.path, to.authority, len(body), headers, body)


class _Connection(asyncio.Protocol):
    def __init__(self, pool: "_Pool"):
        self.pool = pool
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.answer: asyncio.Future | None = None
        self.received = False
        self.used = 0
        self.deadline = 0.0
        self._reset()

    def _reset(self) -> None:
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.pool.forget(self)
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(_Closed(self.received, exc))

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self.answer is not None and not self.answer.done():
                self.answer.set_exception(UpstreamError(f"malformed answer: {exc}"))
            self.close()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        answer, result = self.answer, Answer(self.parser.get_status_code(), b"".join(self.body), self.headers)
        self.answer = None
        self._reset()
        if self.parser.should_keep_alive() and self.transport is not None:
            self.pool.release(self)
        else:
            self.close()
        if answer is not None and not answer.done():
            answer.set_result(result)

    def send(self, request: bytes, timeout: float) -> asyncio.Future:
        self.answer = self.pool.loop.create_future()
        self.deadline = self.pool.loop.time() + timeout
        self.received = False
        self.used += 1
        self.transport.write(request)
        return self.answer

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.pool.forget(self)


class _Closed(UpstreamError):
    def __init__(self, received: bool, cause: Exception | None):
        super().__init__(f"the connection closed{' mid-answer' if received else ''}"
                         f"{f': {cause}' if cause else ''}")
        self.received = received


class _Pool:
    """One server's connections: idle ones reused most recent first, at most
    `limit` open or opening; callers beyond it wait for one to be released."""

    def __init__(self, to: Target, limit: int, connect_timeout: float | None = None):
        self.to = to
        self.limit = limit
        self.connect_timeout = connect_timeout
        self.loop = asyncio.get_running_loop()
        self.idle: deque[_Connection] = deque()
        self.open: set[_Connection] = set()
        self.opening = 0
        self.queued: deque[asyncio.Future] = deque()

    async def acquire(self) -> _Connection:
        while self.idle:
            connection = self.idle.pop()
            if connection.transport is not None and not connection.transport.is_closing():
                return connection
        if len(self.open) + self.opening >= self.limit:
            turn = self.loop.create_future()
            self.queued.append(turn)
            return await turn
        return await self._connect()

    async def _connect(self) -> _Connection:
        self.opening += 1
        try:
            context = ssl.create_default_context() if self.to.secure else None
            connecting = self.loop.create_connection(lambda: _Connection(self), self.to.host, self.to.port, ssl=context)
            _, connection = await asyncio.wait_for(connecting, self.connect_timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            raise Unreachable(f"cannot connect to {self.to.host}:{self.to.port}: {exc or 'timed out'}") from exc
        finally:
            self.opening -= 1
        self.open.add(connection)
        return connection

    def release(self, connection: _Connection) -> None:
        while self.queued:
            turn = self.queued.popleft()
            if not turn.done():
                turn.set_result(connection)
                return
        self.idle.append(connection)

    def forget(self, connection: _Connection) -> None:
        if connection not in self.open:
            return
        self.open.discard(connection)
        # A caller waiting for a slot may now open a connection of its own.
        while self.queued:
            turn = self.queued.popleft()
            if not turn.done():
                self.loop.create_task(self._hand_new(turn))
                return

    async def _hand_new(self, turn: asyncio.Future) -> None:
        try:
            connection = await self._connect()
        except UpstreamError as exc:
            if not turn.done():
                turn.set_exception(exc)
            return
        if turn.done():
            self.release(connection)
        else:
            turn.set_result(connection)

    def close(self) -> None:
        for connection in list(self.open):
            connection.close()


class Upstreams:
    """Calls to HTTP servers (Triton's), on kept-alive connections per server."""

    def __init__(self, limit: int = MAX_CONNECTIONS, timeout: float = TIMEOUT_SECONDS,
                 connect_timeout: float | None = None):
        self.limit = limit
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        """None: as long as the system takes (a server on this machine refuses at once)."""
        self.pools: dict[tuple[bool, str, int], _Pool] = {}
        self._sweeper: asyncio.Task | None = None

    async def call(self, method: bytes, url: str, body: bytes = b"", headers: bytes = b"") -> Answer:
        """The server's answer; UpstreamError when there is none."""
        to = target(url)
        pool = self.pools.get((to.secure, to.host, to.port))
        if pool is None:
            pool = self.pools[(to.secure, to.host, to.port)] = _Pool(to, self.limit, self.connect_timeout)
        request = encode(method, to, body, headers)
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep())
        for _ in range(2):
            connection = await pool.acquire()
            reused = connection.used > 0
            try:
                return await self._exchange(connection, request)
            except _Closed as exc:
                # A kept-alive connection the server had closed: the request never reached it.
                if not reused or exc.received:
                    raise
        raise UpstreamError("the server closed two connections in a row")

    async def _exchange(self, connection: _Connection, request: bytes) -> Answer:
        answer = connection.send(request, self.timeout)
        try:
            return await answer
        except asyncio.CancelledError:
            connection.close()  # its answer may still come: the connection cannot be reused
            raise

    async def _sweep(self) -> None:
        """Ends the calls past their deadline, a few times per timeout (a
        timer per call cost more than the rest of the call's bookkeeping)."""
        while True:
            await asyncio.sleep(min(1.0, self.timeout / 4))
            now = asyncio.get_running_loop().time()
            for pool in list(self.pools.values()):
                for connection in list(pool.open):
                    answer = connection.answer
                    if answer is not None and not answer.done() and now > connection.deadline:
                        answer.set_exception(UpstreamError(f"no answer within {self.timeout:g} s"))
                        connection.close()

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        for pool in self.pools.values():
            pool.close()
