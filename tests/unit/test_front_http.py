"""The serving front's HTTP layer on real sockets in this process: its
server (kubeloop.front.httpserver) as callers meet it, and its calls to
Triton (kubeloop.front.upstream) against raw servers that misbehave the
ways a Triton Pod can. The same code runs in the local router process and in
router Pods, so this proves the layer for both backends; what it serves is
proven per backend in tests/e2e."""

from __future__ import annotations

import asyncio
import gzip
import zlib

from kubeloop.front.httpserver import Request, Response, Server, json_response
from kubeloop.front.upstream import UpstreamError, Upstreams


async def _serving(handler, **limits):  # noqa: ANN001, ANN202 - a started Server and its port
    server = Server(handler, **limits)
    return server, await server.start("127.0.0.1", 0)


async def _exchange(port: int, raw: bytes, until: bytes, reads: int = 1) -> bytes:
    """Send raw bytes; read until `until` was seen `reads` times or the peer closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    got = b""
    try:
        while got.count(until) < reads:
            chunk = await asyncio.wait_for(reader.read(65536), timeout=5)
            if not chunk:
                break
            got += chunk
    finally:
        writer.close()
    return got


def _post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n%s" % (path.encode(), len(body), extra, body)


def _echo_server(handler, *exchanges):  # noqa: ANN001, ANN202 - each exchange: (raw, until, reads)
    async def go():
        server, port = await _serving(handler)
        try:
            return [await _exchange(port, *exchange) for exchange in exchanges]
        finally:
            await server.close()

    return asyncio.run(go())


def test_pipelined_requests_are_answered_in_order_on_one_connection():
    async def handler(request: Request) -> Response:
        await asyncio.sleep(0.05 if request.body == b"slow" else 0)
        return Response(200, request.body, headers=b"X-Path: " + request.path.encode() + b"\r\n")

    [got] = _echo_server(handler, (_post("/a?x=1", b"slow") + _post("/b", b"fast"), b"HTTP/1.1 200", 2))
    assert got.count(b"HTTP/1.1 200") == 2
    assert got.index(b"X-Path: /a") < got.index(b"slow") < got.index(b"X-Path: /b") < got.index(b"fast")
    assert b"Connection: close" not in got


def test_a_chunked_body_arrives_whole_and_expect_100_continue_is_answered_first():
    async def handler(request: Request) -> Response:
        return Response(200, request.body)

    chunked = (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
    got = _echo_server(handler, (chunked, b"hello world"), (_post("/", b"body", b"Expect: 100-continue\r\n"), b"body"))
    assert got[0].startswith(b"HTTP/1.1 200 OK") and got[0].endswith(b"hello world")
    assert got[1].startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK")


def test_a_body_over_the_limit_gets_413_and_a_malformed_request_400_and_both_close():
    async def go():
        server, port = await _serving(lambda request: asyncio.sleep(0, Response(200)), max_body=10)
        try:
            return (await _exchange(port, _post("/", b"x" * 11), b"\r\n\r\n{"),
                    await _exchange(port, b"GARBAGE\r\n\r\n", b"\r\n\r\n{"))
        finally:
            await server.close()

    large, garbage = asyncio.run(go())
    assert large.startswith(b"HTTP/1.1 413") and b"larger than 10 bytes" in large and b"Connection: close" in large
    assert garbage.startswith(b"HTTP/1.1 400") and b"malformed HTTP request" in garbage


def test_a_failing_handler_answers_500_and_the_connection_serves_the_next_request():
    async def handler(request: Request) -> Response:
        if request.body == b"boom":
            raise RuntimeError("boom")
        return json_response({"ok": True})

    [got] = _echo_server(handler, (_post("/", b"boom") + _post("/", b"fine"), b"HTTP/1.1", 2))
    assert got.startswith(b"HTTP/1.1 500") and b"internal error" in got and got.endswith(b'{"ok":true}')


def test_work_after_the_answer_runs_once_the_answer_is_written_and_its_failure_is_not_the_callers():
    done: list[str] = []

    async def handler(request: Request) -> Response:
        def after() -> None:
            done.append("after")
            raise RuntimeError("bookkeeping failed")

        return Response(200, b"answer", after=after)

    [got] = _echo_server(handler, (_post("/", b"") + _post("/", b""), b"answer", 2))
    assert got.count(b"HTTP/1.1 200") == 2 and done == ["after", "after"]


def test_an_answer_that_cannot_be_written_closes_its_connection_and_the_server_goes_on():
    """Before, a failure writing an answer left its caller (and the requests
    pipelined behind it) waiting on an open connection."""
    done: list[str] = []

    async def handler(request: Request) -> Response:
        if request.body == b"broken":  # a str body cannot be encoded
            return Response(200, "broken", after=lambda: done.append("broken"))
        return Response(200, b"fine:" + request.body)

    # Each read runs to the connection's end: one the server never closes fails the test (5 s).
    closed, next_caller = _echo_server(handler, (_post("/", b"1") + _post("/", b"broken") + _post("/", b"2"), b"never"),
                                       (_post("/", b"3"), b"fine:3"))
    assert closed.count(b"HTTP/1.1") == 1 and closed.endswith(b"fine:1")
    assert next_caller.startswith(b"HTTP/1.1 200") and next_caller.endswith(b"fine:3") and done == []


def test_a_head_request_is_answered_as_its_get_without_the_body():
    async def handler(request: Request) -> Response:
        return Response(200, b"the body")

    [got] = _echo_server(handler, (b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n", b"the body"))
    # The GET's answer follows the HEAD's headers at once: nothing of a body between them.
    assert got == b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\nContent-Type: application/json\r\n\r\n" * 2 + b"the body"


def test_a_compressed_body_reaches_the_handler_plain_and_an_answer_is_compressed_as_the_caller_asks():
    async def handler(request: Request) -> Response:
        assert b"content-encoding" not in request.headers  # decoded once, at the edge
        return Response(200, request.body)

    plain = b"0123456789" * 60
    gzipped = b"Content-Encoding: gzip\r\n"
    asked = (_post("/", gzip.compress(plain), gzipped + b"Accept-Encoding: deflate;q=0.5, gzip;q=0.1\r\n")
             + _post("/", zlib.compress(plain), b"Content-Encoding: deflate\r\nAccept-Encoding: identity\r\n")
             + _post("/", b"short", b"Accept-Encoding: gzip\r\n"))
    [got] = _echo_server(handler, (asked, b"short"))
    deflated, as_sent, short = (b"HTTP/1.1" + answer for answer in got.split(b"HTTP/1.1")[1:])
    head, _, body = deflated.partition(b"\r\n\r\n")
    assert b"Content-Encoding: deflate" in head and zlib.decompress(body) == plain
    assert b"Content-Length: %d" % len(body) in head
    assert b"Content-Encoding" not in as_sent and as_sent.endswith(b"\r\n\r\n" + plain)
    assert b"Content-Encoding" not in short  # too short to be worth compressing


def test_a_large_answer_is_compressed_off_the_loop_while_the_next_caller_is_answered():
    """Local backend's front (and the router Pods'): zlib on a large answer
    runs on a coding thread, so a caller arriving meanwhile has its whole
    answer before the large one's first byte; a small answer is compressed
    in place, and a large compressed request is decoded on a coding thread."""
    big = b"".join(b"%d," % i for i in range(2_000_000))  # 15 MB of text: a good part of a second of gzip
    answered = asyncio.Event()

    async def handler(request: Request) -> Response:
        if request.path == "/big":
            answered.set()
            return Response(200, big)
        return Response(200, b"small:" + request.body)

    async def go():
        server, port = await _serving(handler)
        events = []

        async def large() -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /big HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n")
            await reader.read(1)
            events.append("big's first byte")
            writer.close()

        try:
            waiting = asyncio.create_task(large())
            await answered.wait()
            request = gzip.compress(b"a" * 5_000_000)
            small = await _exchange(port, _post("/small", request, b"Content-Encoding: gzip\r\nAccept-Encoding: "
                                                b"gzip\r\nConnection: close\r\n"), b"never sent")  # to the close
            events.append("small's whole answer")
            await waiting
            return events, small, server.coded_off_loop
        finally:
            await server.close()

    events, small, coded_off_loop = asyncio.run(go())
    assert events == ["small's whole answer", "big's first byte"], events
    head, _, body = small.partition(b"\r\n\r\n")
    assert b"Content-Encoding: gzip" in head and len(gzip.decompress(body)) == len(b"small:") + 5_000_000
    assert coded_off_loop == 3  # the big answer, the small call's 5 MB body, and its answer of as much


def test_a_body_that_cannot_be_decoded_is_refused_and_the_connection_serves_the_next_request():
    async def handler(request: Request) -> Response:
        return Response(200, b"served:" + request.body)

    async def go():
        server, port = await _serving(handler, max_body=1000)
        try:
            return await _exchange(port, _post("/", gzip.compress(b"\0" * 100_000), b"Content-Encoding: gzip\r\n")
                                   + _post("/", b"not gzip", b"Content-Encoding: gzip\r\n")
                                   + _post("/", b"x", b"Content-Encoding: br\r\n") + _post("/", b"fine"),
                                   b"served:fine")
        finally:
            await server.close()

    bomb, corrupt, unknown, fine = (b"HTTP/1.1" + a for a in asyncio.run(go()).split(b"HTTP/1.1")[1:])
    assert bomb.startswith(b"HTTP/1.1 413") and b"decompresses to more than 1000 bytes" in bomb
    assert corrupt.startswith(b"HTTP/1.1 400") and b"not valid gzip data, as its Content-Encoding says" in corrupt
    assert unknown.startswith(b"HTTP/1.1 415") and b"Content-Encoding 'br' is not supported" in unknown
    assert fine.startswith(b"HTTP/1.1 200") and b"Connection: close" not in bomb + corrupt + unknown


def test_closing_waits_for_the_requests_under_way():
    async def go():
        started = asyncio.Event()

        async def handler(request: Request) -> Response:
            started.set()
            await asyncio.sleep(0.2)
            return Response(200, b"finished")

        server, port = await _serving(handler)
        answer = asyncio.ensure_future(_exchange(port, _post("/", b""), b"finished"))
        await started.wait()
        await server.close()
        return await answer

    assert asyncio.run(go()).endswith(b"finished")


def test_a_request_trickling_in_gets_408_an_idle_connection_is_closed_and_a_slow_answer_is_never_cut_short():
    async def handler(request: Request) -> Response:
        await asyncio.sleep(0.8 if request.body == b"slow" else 0)
        return Response(200, request.body)

    async def go():
        server, port = await _serving(handler, idle=0.6, read=0.3)
        try:
            # Each read runs to the connection's end: one the server never closes fails the test (5 s).
            return await asyncio.gather(
                _exchange(port, b"POST / HTTP/1.1\r\nHost: x\r\n", b"never"),
                _exchange(port, b"", b"never"),
                # The half-sent request behind a slow answer waits on the server, not the caller.
                _exchange(port, _post("/", b"slow") + b"POST / HTTP/1.1\r\n", b"never"),
                _exchange(port, _post("/", b"quick"), b"quick"))
        finally:
            await server.close()

    trickled, idle, behind_slow, quick = asyncio.run(go())
    assert trickled.startswith(b"HTTP/1.1 408") and b"within 0.3 s" in trickled and b"Connection: close" in trickled
    assert idle == b""
    assert behind_slow.startswith(b"HTTP/1.1 200") and behind_slow.index(b"slow") < behind_slow.index(b"HTTP/1.1 408")
    assert quick.startswith(b"HTTP/1.1 200")


# -- calls to Triton ----------------------------------------------------------


class _Raw:
    """A raw HTTP server answering each request as `behave(n)` says: n counts
    requests; it returns bytes to send, or None to close the connection."""

    def __init__(self, behave):  # noqa: ANN001
        self.behave = behave
        self.requests = 0
        self.connections = 0

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v2/models/m/infer"

    async def __aexit__(self, *exc) -> None:  # noqa: ANN002
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                body = await reader.readexactly(length)
                self.requests += 1
                answer = await self.behave(self.requests, body)
                if answer is None:
                    break
                writer.write(answer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


def _ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nInference-Header-Content-Length: 3\r\n\r\n%s" % (len(body), body)


def test_calls_reuse_one_connection_and_read_status_body_and_headers():
    async def go():
        async def behave(n, body):  # noqa: ANN001, ANN202
            return _ok(b"echo:" + body)

        raw = _Raw(behave)
        async with raw as url:
            upstreams = Upstreams()
            answers = [await upstreams.call(b"POST", url, b"%d" % i) for i in range(3)]
            upstreams.close()
        return answers, raw.connections

    answers, connections = asyncio.run(go())
    assert [a.body for a in answers] == [b"echo:0", b"echo:1", b"echo:2"] and connections == 1
    assert answers[0].status == 200 and answers[0].headers["inference-header-content-length"] == "3"


def test_a_kept_alive_connection_the_server_closed_is_replaced_and_the_call_made_once_more():
    async def go():
        async def behave(n, body):  # noqa: ANN001, ANN202 - the kept-alive connection is dropped on its next use
            return {1: _ok(b"first"), 2: None}.get(n, _ok(b"again"))

        raw = _Raw(behave)
        async with raw as url:
            upstreams = Upstreams()
            first = await upstreams.call(b"POST", url)
            second = await upstreams.call(b"POST", url)
            upstreams.close()
        return first.body, second.body, raw.connections, raw.requests

    assert asyncio.run(go()) == (b"first", b"again", 2, 3)


def test_a_server_that_closes_mid_answer_or_never_answers_is_an_error_and_not_called_twice():
    async def go():
        async def behave(n, body):  # noqa: ANN001, ANN202
            if body == b"hang":
                await asyncio.sleep(10)
            return None  # closes without an answer

        raw = _Raw(behave)
        async with raw as url:
            upstreams = Upstreams(timeout=0.3)
            errors = []
            for body in (b"close", b"hang"):
                try:
                    await upstreams.call(b"POST", url, body)
                except UpstreamError as exc:
                    errors.append(str(exc))
            upstreams.close()
        return errors, raw.requests

    errors, requests = asyncio.run(go())
    assert errors[0].startswith("the connection closed") and errors[1] == "no answer within 0.3 s"
    assert requests == 2


def test_an_unreachable_server_is_an_error_that_names_it():
    async def go():
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        try:
            await Upstreams().call(b"GET", f"http://127.0.0.1:{port}/v2/health/ready")
        except UpstreamError as exc:
            return str(exc)

    assert "cannot connect to 127.0.0.1:" in asyncio.run(go())


def test_calls_beyond_the_connection_limit_wait_for_a_connection():
    async def go():
        in_flight, most = 0, 0

        async def behave(n, body):  # noqa: ANN001, ANN202
            nonlocal in_flight, most
            in_flight += 1
            most = max(most, in_flight)
            await asyncio.sleep(0.02)
            in_flight -= 1
            return _ok(body)

        raw = _Raw(behave)
        async with raw as url:
            upstreams = Upstreams(limit=2)
            answers = await asyncio.gather(*(upstreams.call(b"POST", url, b"%d" % i) for i in range(7)))
            upstreams.close()
        return [a.body for a in answers], raw.connections, most

    bodies, connections, most = asyncio.run(go())
    assert bodies == [b"%d" % i for i in range(7)] and connections == 2 and most == 2


def test_a_caller_that_left_before_its_answer_still_has_its_work_after_done():
    """The router counts and logs a request in `after`: a caller that hung up
    while Triton answered must not vanish from the metrics and the log."""
    async def go():
        done: list[str] = []
        started = asyncio.Event()

        async def handler(request: Request) -> Response:
            started.set()
            await asyncio.sleep(0.1)
            return Response(200, b"late", after=lambda: done.append("counted"))

        server, port = await _serving(handler)
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_post("/", b""))
        await started.wait()
        writer.close()
        await server.close()  # waits for the request under way, its work after the answer included
        return done

    assert asyncio.run(go()) == ["counted"]
