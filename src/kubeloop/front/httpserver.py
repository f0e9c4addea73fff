"""The front's HTTP/1.1 server: an asyncio protocol over httptools' parser.

A general framework's server (aiohttp's) spent more CPU per request than the
front's whole routing, logging and metrics work, and its wake-ups at
concurrency 1 added more latency than the extra hop itself; the front serves
a handful of routes of one protocol, so it parses with httptools (llhttp)
and answers with one write per response.

What a caller may rely on: keep-alive, pipelined requests answered in order,
chunked bodies, `Expect: 100-continue`, a body limit (413), a malformed
request answered 400 and its connection closed, idle connections closed
after IDLE_SECONDS, a request not read whole within READ_SECONDS answered 408
and its connection closed (a caller trickling bytes holds no connection for
long), a handler's exception answered 500 (logged) without ending the
connection's other requests, an answer that cannot be written closing its
connection (logged), a HEAD request answered as its GET without the body, and
HTTP's content codings (kubeloop.front.compression): a gzip or deflate body
decoded before the handler reads it (its plain size within the body limit,
413 beyond), and an answer compressed when the caller's Accept-Encoding asks,
large ones on a coding thread so that other callers do not wait on zlib.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from http import HTTPStatus
from typing import Awaitable, Callable

import httptools
import orjson

from kubeloop.front.compression import (
    CODERS, INFLATE_OFF_LOOP, MIN_COMPRESSED, OFF_LOOP, CodingError, chosen, compressed, decoded,
)

log = logging.getLogger("kubeloop.http")
MAX_BODY = 16 * 2**20
IDLE_SECONDS = 75.0
"""A connection that sent nothing for this long is closed (as aiohttp's keep-alive timeout)."""
READ_SECONDS = 60.0
"""A request's headers and body arrive within this long of its first byte."""
MAX_PIPELINED = 16
"""Requests of one connection waiting for their turn; reading pauses beyond it."""


@dataclass(slots=True)
class Request:
    method: str
    path: str
    """The path without its query."""
    headers: dict[bytes, bytes]
    """As sent, names lower-cased; repeated headers joined with ", " (decoding
    every header of every request cost more than reading the one the router needs)."""
    body: bytes
    keep_alive: bool = True


@dataclass(slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: bytes = b""
    """Further header lines, each ending in CRLF (a router sends the same few again and again: encoded once)."""
    after: Callable[[], None] | None = None
    """Work for once the response is written (bookkeeping the caller need not wait for)."""


def json_response(payload: object, status: int = 200) -> Response:
    return Response(status, orjson.dumps(payload))


Handler = Callable[[Request], Awaitable[Response]]
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


def header_lines(headers: dict[str, str]) -> bytes:
    """Header lines for Response.headers (pure)."""
    return b"".join(b"%s: %s\r\n" % (k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items())


def encode(response: Response, keep_alive: bool, head: bool = False) -> bytes:
    """The response as bytes on the wire (pure). head: the answer to a HEAD
    request, whose headers are its GET's (the length included) and which
    has no body."""
    return b"HTTP/1.1 %d %s\r\nContent-Length: %d\r\n%s%s%s\r\n%s" % (
        response.status, _REASONS.get(response.status, b""), len(response.body),
        b"Content-Type: %s\r\n" % response.content_type.encode() if response.body else b"", response.headers,
        b"" if keep_alive else b"Connection: close\r\n", b"" if head else response.body)


def decode_body(request: Request, limit: int) -> Response | None:
    """Put the request's plain body in place of a compressed one (and drop
    its Content-Encoding, so nothing reads it twice); None, or the answer
    refusing a body that cannot be decoded within limit bytes."""
    coding = request.headers.pop(b"content-encoding", None)
    try:
        request.body = decoded(request.body, coding, limit)
    except CodingError as exc:
        return json_response({"error": str(exc)}, exc.status)
    return None


def compress_for(response: Response, accept_encoding: bytes | None) -> Response:
    """The answer in the coding the caller prefers, when it asks for one
    and the body is worth compressing (pure)."""
    coding = chosen(accept_encoding) if accept_encoding and len(response.body) >= MIN_COMPRESSED else None
    if coding is None:
        return response
    return replace(response, body=compressed(response.body, coding),
                   headers=response.headers + b"Content-Encoding: %s\r\n" % coding.encode())


class _Connection(asyncio.Protocol):
    """One caller's connection: parses its requests and answers them in order."""

    def __init__(self, server: "Server"):
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.waiting: deque[Request] = deque()
        self.busy = False
        self.paused = False
        self.last_active = 0.0
        self.reading_since: float | None = None
        self._reset()

    def _reset(self) -> None:
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []
        self.size = 0

    # -- asyncio -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.last_active = self.server.loop.time()
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.transport = None
        self.waiting.clear()

    def data_received(self, data: bytes) -> None:
        self.last_active = self.server.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(400, "protocol upgrades are not served")
        except httptools.HttpParserError as exc:
            self._refuse(400, f"malformed HTTP request: {exc}")

    # -- httptools ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.reading_since = self.last_active  # set by data_received just before
        self._reset()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.lower()
        self.headers[key] = self.headers[key] + b", " + value if key in self.headers else value

    def on_headers_complete(self) -> None:
        length = self.headers.get(b"content-length", b"0")
        if length.isdigit() and int(length) > self.server.max_body:
            self._refuse(413, f"the body is larger than {self.server.max_body} bytes")
        elif self.headers.get(b"expect", b"").lower() == b"100-continue" and self.transport:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > self.server.max_body:
            self._refuse(413, f"the body is larger than {self.server.max_body} bytes")
            return
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.reading_since = None
        if self.transport is None or self.transport.is_closing():
            return
        path = self.url.split(b"?", 1)[0].decode("latin-1")
        request = Request(self.parser.get_method().decode("latin-1"), path, self.headers, b"".join(self.body),
                          self.parser.should_keep_alive())
        if self.busy:
            self.waiting.append(request)
            if len(self.waiting) >= MAX_PIPELINED and not self.paused:
                self.paused = True
                self.transport.pause_reading()
        else:
            self._start(request)

    # -- answering ---------------------------------------------------------------

    def _start(self, request: Request) -> None:
        self.busy = True
        self.server.spawn(self._answer(request))

    async def _answer(self, request: Request) -> None:
        try:
            response = await self.server.decode(request) or await self.server.handler(request)
        except Exception:  # one request's failure is its own 500; the connection goes on
            log.exception("%s %s failed", request.method, request.path)
            response = json_response({"error": "internal error (see the front's log)"}, 500)
        finally:
            self.server.done()
        transport = self.transport
        if transport is not None and not await self._write(transport, request, response):
            return  # the caller has no answer: none to count or log as given
        if response.after is not None:  # a caller that left was still served: counted and logged
            try:
                response.after()
            except Exception:  # the caller has its answer; what failed after it is logged
                log.exception("%s %s: the work after answering failed", request.method, request.path)
        if transport is None:
            return
        if not request.keep_alive:
            transport.close()
            return
        self.busy = False
        if self.reading_since is not None:  # a pipelined request's wait was the server's, not the caller's
            self.reading_since = self.server.loop.time()
        if self.waiting:
            self._start(self.waiting.popleft())
        if self.paused and len(self.waiting) < MAX_PIPELINED:
            self.paused = False
            transport.resume_reading()

    async def _write(self, transport: asyncio.Transport, request: Request, response: Response) -> bool:
        """Write the answer, compressed as the caller asks; one that cannot be
        written (not compressible or encodable, or refused by the transport)
        closes the connection, the one way left to tell the caller, and False."""
        try:
            coded = await self.server.compress(response, request.headers.get(b"accept-encoding"))
            transport.write(encode(coded, request.keep_alive, head=request.method == "HEAD"))
        except Exception:  # the server goes on; this connection cannot (its caller waits for this answer)
            log.exception("%s %s: the answer could not be written; closing the connection",
                          request.method, request.path)
            transport.close()
            return False
        self.last_active = self.server.loop.time()
        return True

    def _refuse(self, status: int, why: str) -> None:
        """Answer an unreadable request and close: what follows it on the connection cannot be framed."""
        if self.transport and not self.transport.is_closing():
            self.transport.write(encode(json_response({"error": why}, status), keep_alive=False))
            self.transport.close()

    def close_if_overdue(self, now: float) -> None:
        """Close a connection too slow sending its request (408), or idle too long."""
        if self.busy:  # what else it sends waits for the answer
            return
        if self.reading_since is not None and now - self.reading_since > self.server.read:
            self._refuse(408, f"the request did not arrive whole within {self.server.read:g} s")
        elif now - self.last_active > self.server.idle and self.transport:
            self.transport.close()


class Server:
    """Serves handler on host:port; `close()` stops taking connections and
    waits for the requests under way."""

    def __init__(self, handler: Handler, max_body: int = MAX_BODY, idle: float = IDLE_SECONDS,
                 read: float = READ_SECONDS):
        self.handler = handler
        self.max_body = max_body
        self.idle = idle
        self.read = read
        self.loop = asyncio.get_running_loop()
        self.connections: set[_Connection] = set()
        self.tasks: set[asyncio.Task] = set()
        self.server: asyncio.base_events.Server | None = None
        self._sweeper: asyncio.Task | None = None
        self.coders = ThreadPoolExecutor(CODERS, thread_name_prefix="kubeloop-coding")
        self.coded_off_loop = 0
        """Bodies coded on a coding thread (large answers, large compressed requests)."""

    async def start(self, host: str, port: int) -> int:
        """Listen; the port bound (port 0 picks a free one)."""
        self.server = await self.loop.create_server(lambda: _Connection(self), host, port, reuse_address=True)
        self._sweeper = asyncio.create_task(self._sweep())
        return self.server.sockets[0].getsockname()[1]

    def spawn(self, coro: Awaitable[None]) -> None:
        self.tasks.add(self.loop.create_task(coro))

    def done(self) -> None:
        """The calling task's request is answered. (Not a done callback: each
        cost a turn of the event loop, an epoll_wait per request.)"""
        self.tasks.discard(asyncio.current_task())

    async def decode(self, request: Request) -> Response | None:
        """decode_body, on a coding thread for a large compressed body."""
        if b"content-encoding" not in request.headers or len(request.body) < INFLATE_OFF_LOOP:
            return decode_body(request, self.max_body)
        return await self._off_loop(decode_body, request, self.max_body)

    async def compress(self, response: Response, accept_encoding: bytes | None) -> Response:
        """compress_for, on a coding thread for a large answer."""
        if not accept_encoding or len(response.body) < OFF_LOOP:
            return compress_for(response, accept_encoding)
        return await self._off_loop(compress_for, response, accept_encoding)

    async def _off_loop(self, work, *args):  # noqa: ANN001, ANN202 - decode_body or compress_for
        self.coded_off_loop += 1
        return await self.loop.run_in_executor(self.coders, work, *args)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(min(self.idle, self.read) / 5)
            now = self.loop.time()
            for connection in list(self.connections):
                connection.close_if_overdue(now)

    async def close(self, grace: float = 10.0) -> None:
        if self.server:
            self.server.close()
        if self._sweeper:
            self._sweeper.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=grace)
        for connection in list(self.connections):
            if connection.transport:
                connection.transport.close()
        self.coders.shutdown(wait=False, cancel_futures=True)
