"""NVIDIA's tritonclient against a serving front and the Triton behind it:
what each encoding a client can ask for must give the same either way."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

# (input in binary, outputs named, output in binary): what a tritonclient user can ask for.
ENCODINGS = {
    "json in, json out": (False, True, False),
    "json in, the client's default out": (False, False, None),
    "binary in, binary out": (True, True, True),
    "binary in, json out": (True, True, False),
    "json in, binary out": (False, True, True),
}
COMPRESSED = {
    "gzip both ways, binary": ("binary in, binary out", "gzip", "gzip"),
    "deflate both ways, json": ("json in, json out", "deflate", "deflate"),
    "gzip in, deflate out, the client's default out": ("json in, the client's default out", "gzip", "deflate"),
}
"""Case -> (its encoding, tritonclient's request_compression_algorithm and response_compression_algorithm)."""
COMPRESSED_ROWS = 32
"""Compressed cases send the rows this many times over: an answer of a few
rows is too short for the front to compress (kubeloop.front.compression's
MIN_COMPRESSED), and must be long enough to take that path."""
REQUEST_ID = "conformance-1"


def ask(url: str, model: str, version: str, rows: np.ndarray, output: str, binary_in: bool, named: bool,
        binary_out: bool | None, compression: tuple[str | None, str | None] = (None, None)) -> httpclient.InferResult:
    tensor = httpclient.InferInput("features", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows, binary_data=binary_in)
    outputs = [httpclient.InferRequestedOutput(output, binary_data=binary_out)] if named else None
    return _client(url).infer(model, [tensor], model_version=version, outputs=outputs, request_id=REQUEST_ID,
                              request_compression_algorithm=compression[0],
                              response_compression_algorithm=compression[1])


def _client(url: str) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(url.removeprefix("http://"), connection_timeout=10, network_timeout=10)


def assert_conforms(front: str, model: str, triton: Callable[[str], tuple[str, str]], rows: np.ndarray,
                    output: str) -> list[str]:
    """Every encoding through the front (model: the InferenceService's) and
    straight to the Triton of the version that answered (triton: version ->
    its url and Triton's model name) gives the same tensors, datatypes,
    binary-or-JSON form and request id, and so does the front asked for
    that version by name (/versions/V/infer); so do bodies and answers
    compressed (gzip, deflate); a tensor of the wrong shape is the same 400
    from both; the version's statistics have the same form. The versions
    that answered."""
    answered = [_same_answers(front, model, triton, rows, output, encoding) for encoding in ENCODINGS]
    many = np.tile(rows, (COMPRESSED_ROWS, 1))
    answered += [_same_answers(front, model, triton, many, output, encoding, (sent, asked))
                 for encoding, sent, asked in COMPRESSED.values()]

    wrong = np.zeros((2, 3), dtype=np.float32)
    errors = []
    for url, name, asked in ((front, model, ""), (*triton(answered[0]), answered[0])):
        with pytest.raises(InferenceServerException) as refused:
            ask(url, name, asked, wrong, output, True, True, True)
        errors.append(refused.value)
    assert [e.status() for e in errors] == ["400", "400"], [str(e) for e in errors]
    _same_statistics(front, model, triton, answered[0])
    return answered


def _same_answers(front: str, model: str, triton: Callable[[str], tuple[str, str]], rows: np.ndarray, output: str,
                  encoding: str, compression: tuple[str | None, str | None] = (None, None)) -> str:
    """One encoding's answers through the front and from the Triton of the version that answered; that version."""
    binary_in, named, binary_out = ENCODINGS[encoding]
    case = encoding if compression == (None, None) else f"{encoding}, compressed {compression}"
    through = ask(front, model, "", rows, output, binary_in, named, binary_out, compression)
    version = through.get_response()["model_version"]
    url, name = triton(version)
    direct = ask(url, name, version, rows, output, binary_in, named, binary_out, compression)
    assert through.as_numpy(output).shape[0] == len(rows), case
    np.testing.assert_array_equal(through.as_numpy(output), direct.as_numpy(output), err_msg=case)
    assert through.as_numpy(output).dtype == direct.as_numpy(output).dtype, case
    ours, theirs = through.get_output(output), direct.get_output(output)
    assert (ours["datatype"], ours["shape"]) == (theirs["datatype"], theirs["shape"]), case
    binary = ["binary_data_size" in o.get("parameters", {}) for o in (ours, theirs)]
    assert binary[0] == binary[1], (case, ours, theirs)
    assert through.get_response()["id"] == direct.get_response()["id"] == REQUEST_ID, case
    by_version = ask(front, model, version, rows, output, binary_in, named, binary_out, compression)
    np.testing.assert_array_equal(by_version.as_numpy(output), direct.as_numpy(output), err_msg=case)
    return version


def _same_statistics(front: str, model: str, triton: Callable[[str], tuple[str, str]], version: str) -> None:
    """tritonclient's get_inference_statistics of the version, through the
    front and from its Triton: the same form and versions (the counts move
    with every call, and the two are called apart)."""
    url, name = triton(version)
    ours, theirs = (_form(_client(front).get_inference_statistics(model, version)),
                    _form(_client(url).get_inference_statistics(name, version)))
    assert ours == theirs and ours[1][0][0] == version, (ours, theirs)


def _form(statistics: dict) -> tuple:
    """Triton's statistics without their counts: the keys, and per model
    entry its version, keys and inference_stats' keys."""
    return (sorted(statistics), [(entry.get("version"), sorted(entry), sorted(entry.get("inference_stats", {})))
                                 for entry in statistics["model_stats"]])
