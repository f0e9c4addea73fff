"""The front's content codings (kubeloop.front.compression), with plain
bytes: bodies as tritonclient compresses them, and the codings callers ask for."""

from __future__ import annotations

import gzip
import zlib

import pytest

from kubeloop.front.compression import ANSWERED, MIN_COMPRESSED, CodingError, chosen, compressed, decoded

PLAIN = b'{"inputs": [{"name": "features", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}' * 20
# As tritonclient's request_compression_algorithm sends them (gzip.compress, zlib.compress).
SENT = {b"gzip": gzip.compress(PLAIN), b"deflate": zlib.compress(PLAIN), b"x-gzip": gzip.compress(PLAIN)}


@pytest.mark.parametrize("coding", SENT)
def test_a_compressed_body_decodes_to_its_plain_bytes(coding):
    assert decoded(SENT[coding], coding, len(PLAIN)) == PLAIN
    assert decoded(SENT[coding], coding.upper() + b" ", len(PLAIN)) == PLAIN  # codings are case-insensitive


def test_no_coding_identity_and_stacked_codings():
    assert decoded(PLAIN, None, 1) is PLAIN  # no limit to check: the server's own framing bounded it
    assert decoded(PLAIN, b"identity", len(PLAIN)) == PLAIN
    assert decoded(b"", b"gzip", 10) == b""  # a GET with a stray header has nothing to decode
    # Applied gzip then deflate: undone deflate first.
    assert decoded(zlib.compress(gzip.compress(PLAIN)), b"gzip, deflate", len(PLAIN)) == PLAIN


def test_a_body_that_decompresses_past_the_limit_is_413_however_small_it_was_sent():
    bomb = gzip.compress(b"\0" * 10 * 2**20)
    with pytest.raises(CodingError) as refused:
        decoded(bomb, b"gzip", 2**20)
    assert refused.value.status == 413 and len(bomb) < 20_000
    assert f"decompresses to more than {2**20} bytes ({len(bomb)} sent as gzip)" in str(refused.value)


@pytest.mark.parametrize("body, coding, said", [
    (PLAIN, b"gzip", "not valid gzip data"),
    (SENT[b"gzip"], b"deflate", "not valid deflate data"),
    (SENT[b"deflate"][:-6], b"deflate", "ends before its stream does"),
    (SENT[b"gzip"] + b"junk", b"gzip", "bytes follow its end"),
])
def test_a_corrupt_body_is_400_naming_content_encoding(body, coding, said):
    with pytest.raises(CodingError) as refused:
        decoded(body, coding, 10 * len(PLAIN))
    assert refused.value.status == 400 and said in str(refused.value) and "Content-Encoding" in str(refused.value)


def test_an_unknown_coding_is_415_naming_it():
    with pytest.raises(CodingError) as refused:
        decoded(PLAIN, b"br", len(PLAIN))
    assert refused.value.status == 415 and "Content-Encoding 'br' is not supported" in str(refused.value)


@pytest.mark.parametrize("accept, answer", [
    (None, None), (b"", None), (b"identity", None),
    (b"gzip", "gzip"), (b"deflate", "deflate"),  # tritonclient's response_compression_algorithm
    (b"gzip, deflate", "gzip"), (b"deflate, gzip", "gzip"), (b"gzip;q=0.5, deflate", "deflate"),
    (b"GZIP ; Q=1.0", "gzip"), (b"gzip;level=1;q=0.2, deflate;q=0.1", "gzip"),
    (b"gzip;q=0, deflate;q=0", None), (b"gzip;q=nope", None),
    (b"identity;q=1, gzip;q=0.5", None), (b"identity;q=0.5, deflate", "deflate"),
    (b"*", "gzip"), (b"*;q=0.3, gzip;q=0", "deflate"), (b"br", None),
])
def test_the_answer_coding_is_the_callers_highest_weighted_one(accept, answer):
    assert chosen(accept) == answer


@pytest.mark.parametrize("coding", ANSWERED)
def test_an_answer_compresses_the_same_every_time_and_decodes_as_its_caller_decodes_it(coding):
    body = compressed(PLAIN, coding)
    assert body == compressed(PLAIN, coding) and len(body) < len(PLAIN) and len(PLAIN) >= MIN_COMPRESSED
    # As tritonclient's InferResult reads it.
    assert (gzip.decompress(body) if coding == "gzip" else zlib.decompress(body)) == PLAIN
