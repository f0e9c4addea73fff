"""HTTP content codings at the front's edge (pure): a request body sent
with `Content-Encoding: gzip|deflate` (tritonclient's
request_compression_algorithm) decoded, and an answer compressed in the
coding a caller's `Accept-Encoding` prefers (its
response_compression_algorithm), as Triton's HTTP server does both.

The front decodes a body before anything reads it, so routing, the binary
extension (whose Inference-Header-Content-Length counts the plain body's
bytes, as Triton reads it), the request log and entity requests see plain
bytes; its calls to Triton stay uncompressed (kubeloop.front.router's
NO_COMPRESSION), so compression costs CPU only for the callers who ask.
"""

from __future__ import annotations

import zlib

WINDOWS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
"""Content coding -> zlib's wbits for it: gzip's framing, or "deflate",
which HTTP defines as the zlib format (RFC 9110 8.4.1.2; tritonclient sends
zlib.compress's)."""
ANSWERED = ("gzip", "deflate")
"""What the front answers in, preferred in this order when a caller weighs them alike."""
MIN_COMPRESSED = 512
"""Answers shorter than this go uncompressed, as HTTP lets a server do:
framing eats what a few hundred bytes save, and general clients (aiohttp,
requests) accept gzip on every call, so a batch-1 answer would pay zlib's
CPU for nothing."""

OFF_LOOP = 32 * 2**10
"""Answers of at least this many bytes are compressed on one of the
server's coding threads, not on its event loop: zlib lets go of the GIL
for them, and on the loop every other caller waited out each one (gzip
took 5 ms for a 40 KB answer and 110 ms for 630 KB on the 2-core machine,
measured while tests ran on it)."""
INFLATE_OFF_LOOP = 2**10
"""Compressed request bodies of at least this many bytes are decoded on a
coding thread: deflate expands up to about a thousandfold, so a 1 KB body
may be a megabyte to inflate."""
CODERS = 2
"""Coding threads per server: as many as the front's cores, beside the loop."""


class CodingError(Exception):
    """A body the front cannot decode: status (400, 413 or 415) and why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def decoded(body: bytes, content_encoding: bytes | None, limit: int) -> bytes:
    """The plain body, its codings undone in the reverse of the order they
    were applied; at most limit bytes, or CodingError 413 (a small body may
    expand a thousandfold)."""
    if content_encoding is None or not body:
        return body
    codings = [c.strip().lower() for c in content_encoding.decode("latin-1").split(",")]
    for coding in reversed(codings):
        if coding != "identity":
            body = _inflate(body, coding, limit)
    return body


def _inflate(body: bytes, coding: str, limit: int) -> bytes:
    wbits = WINDOWS.get(coding)
    if wbits is None:
        raise CodingError(415, f"Content-Encoding {coding!r} is not supported: send the body as gzip, deflate "
                               "or identity")
    inflater = zlib.decompressobj(wbits)
    try:
        plain = inflater.decompress(body, limit + 1)  # one byte past the limit tells it was passed
    except zlib.error as exc:
        raise CodingError(400, f"the body is not valid {coding} data, as its Content-Encoding says: {exc}") from exc
    if len(plain) > limit:
        raise CodingError(413, f"the body decompresses to more than {limit} bytes ({len(body)} sent as {coding}), "
                               "the front's limit for a request")
    if not inflater.eof or inflater.unused_data:
        raise CodingError(400, f"the body is not valid {coding} data, as its Content-Encoding says: "
                               f"{'it ends before its stream does' if not inflater.eof else 'bytes follow its end'}")
    return plain


def chosen(accept_encoding: bytes | None) -> str | None:
    """The coding to answer in: the one of ANSWERED the caller weighs
    highest (q > 0, and not below identity's weight when it names
    identity), None for an uncompressed answer. `*` stands for the codings
    it does not name."""
    if not accept_encoding:
        return None
    weights = _weights(accept_encoding.decode("latin-1"))
    other = weights.get("*", 0.0)
    best = max(ANSWERED, key=lambda coding: weights.get(coding, other))
    weight = weights.get(best, other)
    return best if weight > 0 and weight >= weights.get("identity", 0.0) else None


def _weights(accept_encoding: str) -> dict[str, float]:
    """Coding -> its q value (1 when unsaid); an unreadable q counts as 0 (not acceptable)."""
    weights = {}
    for entry in accept_encoding.split(","):
        coding, *parameters = entry.split(";")
        if coding.strip():
            weights[coding.strip().lower()] = next(
                (_q(value) for name, _, value in (p.partition("=") for p in parameters)
                 if name.strip().lower() == "q"), 1.0)
    return weights


def _q(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        return 0.0


def compressed(body: bytes, coding: str) -> bytes:
    """body in coding (one of ANSWERED), at zlib's default level as Triton's;
    the same bytes every time (a gzip header's time is 0)."""
    compressor = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, WINDOWS[coding])
    return compressor.compress(body) + compressor.flush()
