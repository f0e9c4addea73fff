"""NVIDIA's tritonclient (HTTP and gRPC) against a serving front and the
Triton behind it: what each encoding a client can ask for must give the
same either way."""

from __future__ import annotations

import queue
from collections.abc import Callable

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
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


# gRPC: tritonclient always sends raw tensors; typed contents are what other gRPC clients send.
GRPC_ENCODINGS = {
    "raw in, outputs named": (True, True, None),
    "raw in, the client's default out": (True, False, None),
    "raw in, gzip both ways": (True, True, "gzip"),
    "typed contents in, outputs named": (False, True, None),
}
"""Case -> (raw input, outputs named, tritonclient's compression_algorithm)."""


def ask_grpc(address: str, model: str, version: str, rows: np.ndarray, output: str, raw: bool, named: bool,
             compression: str | None = None) -> grpcclient.InferResult:
    client = grpcclient.InferenceServerClient(address)
    outputs = [grpcclient.InferRequestedOutput(output)] if named else None
    if raw:
        tensor = grpcclient.InferInput("features", list(rows.shape), "FP32")
        tensor.set_data_from_numpy(rows)
        return client.infer(model, [tensor], model_version=version, outputs=outputs, request_id=REQUEST_ID,
                            compression_algorithm=compression, client_timeout=10)
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version, id=REQUEST_ID)
    tensor = request.inputs.add(name="features", datatype="FP32", shape=list(rows.shape))
    tensor.contents.fp32_contents.extend(rows.ravel().tolist())
    if named:
        request.outputs.add(name=output)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(address))
    return grpcclient.InferResult(stub.ModelInfer(request, timeout=10))


def assert_grpc_conforms(front: str, model: str, triton: Callable[[str], tuple[str, str]], rows: np.ndarray,
                         output: str) -> list[str]:
    """KServe v2 gRPC through the front (front: its host:port) and straight
    to the Triton of the version that answered (triton: version -> its gRPC
    host:port and Triton's model name): every case of GRPC_ENCODINGS, and a
    stream, gives the same tensors, datatypes and request id, so does the
    front asked for the version by name; a tensor of the wrong shape is
    INVALID_ARGUMENT from both; health, the version's metadata and config
    agree, and its statistics have the same form. The versions that answered."""
    answered = []
    for case, (raw, named, compression) in GRPC_ENCODINGS.items():
        through = ask_grpc(front, model, "", rows, output, raw, named, compression)
        version = through.get_response().model_version
        url, name = triton(version)
        direct = ask_grpc(url, name, version, rows, output, raw, named, compression)
        by_version = ask_grpc(front, model, version, rows, output, raw, named, compression)
        for answer in (through, by_version):
            np.testing.assert_array_equal(answer.as_numpy(output), direct.as_numpy(output), err_msg=case)
            ours, theirs = answer.get_output(output), direct.get_output(output)
            assert (ours.datatype, list(ours.shape)) == (theirs.datatype, list(theirs.shape)), case
            assert answer.get_response().id == direct.get_response().id == REQUEST_ID, case
        answered.append(version)
    version = answered[0]
    url, name = triton(version)
    np.testing.assert_array_equal(_streamed(front, model, version, rows, output),
                                  _streamed(url, name, version, rows, output))

    wrong = np.zeros((2, 3), dtype=np.float32)
    codes = []
    for address, asked, named_version in ((front, model, ""), (url, name, version)):
        with pytest.raises(InferenceServerException) as refused:
            ask_grpc(address, asked, named_version, wrong, output, True, True)
        codes.append(refused.value.status())
    assert codes == ["StatusCode.INVALID_ARGUMENT"] * 2, codes

    ours, theirs = grpcclient.InferenceServerClient(front), grpcclient.InferenceServerClient(url)
    assert ours.is_server_live() and ours.is_server_ready() and ours.is_model_ready(model, version)
    assert not ours.is_model_ready(model, "999")
    mine, direct = ours.get_model_metadata(model, version), theirs.get_model_metadata(name, version)
    assert (list(mine.inputs), list(mine.outputs), mine.platform) == (
        list(direct.inputs), list(direct.outputs), direct.platform)
    mine, direct = ours.get_model_config(model, version).config, theirs.get_model_config(name, version).config
    assert (list(mine.input), list(mine.output), mine.max_batch_size) == (
        list(direct.input), list(direct.output), direct.max_batch_size)
    _same_statistics_form(ours.get_inference_statistics(model, version, as_json=True),
                          theirs.get_inference_statistics(name, version, as_json=True), version)
    return answered


def _streamed(address: str, model: str, version: str, rows: np.ndarray, output: str) -> np.ndarray:
    """Three requests' answers over one ModelStreamInfer stream, stacked."""
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(address)
    client.start_stream(lambda result, error: answers.put((result, error)))
    try:
        for _ in range(3):
            tensor = grpcclient.InferInput("features", list(rows.shape), "FP32")
            tensor.set_data_from_numpy(rows)
            client.async_stream_infer(model, [tensor], model_version=version, request_id=REQUEST_ID,
                                      outputs=[grpcclient.InferRequestedOutput(output)])
        got = [answers.get(timeout=10) for _ in range(3)]
    finally:
        client.stop_stream()
    assert [error for _, error in got] == [None] * 3, got
    return np.stack([result.as_numpy(output) for result, _ in got])


def _same_statistics_form(ours: dict, theirs: dict, version: str) -> None:
    """gRPC statistics (as JSON) of one version, through the front and from Triton: the same form."""
    mine, direct = _form(ours), _form(theirs)
    assert mine == direct and mine[1][0][0] == version, (mine, direct)
