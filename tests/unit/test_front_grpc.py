"""The front's KServe v2 gRPC service (kubeloop.front.grpcserver): the
translation between gRPC messages and the router's HTTP requests (plain
data), and NVIDIA's tritonclient.grpc through a running front to a Triton
stand-in, where gRPC requests are routed, logged and counted as HTTP ones
are. Backend: none (the front's own process; the conformance suite with a
real Triton is tests/e2e/test_front_conformance.py)."""

from __future__ import annotations

import asyncio
from collections import Counter

import grpc
import numpy as np
import orjson
import pytest
import tritonclient.grpc.aio as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from kubeloop.front.features import RequestError
from kubeloop.front.grpcserver import http_infer, infer_response, refusal, typed_bytes
from kubeloop.front.httpserver import Response
from kubeloop.requestlog import request_records
from tests.unit.test_front_encodings import echo_triton
from tests.unit.test_router import keyed_config

ROWS = np.array([[0.5, -1.0], [2.0, 0.25]], dtype=np.float32)


def _input(datatype: str, shape: list[int], field: str, values: list) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="fraud")
    tensor = request.inputs.add(name="x", datatype=datatype, shape=shape)
    getattr(tensor.contents, field).extend(values)
    return request


@pytest.mark.parametrize(("datatype", "field", "values", "array"), [
    ("FP32", "fp32_contents", [0.5, -1.0, 2.0, 0.25], ROWS),
    ("INT64", "int64_contents", [1, -2, 3, 2**40], np.array([[1, -2], [3, 2**40]], dtype=np.int64)),
    ("INT16", "int_contents", [1, -2, 3, 4], np.array([[1, -2], [3, 4]], dtype=np.int16)),
    ("BOOL", "bool_contents", [True, False, False, True], np.array([[True, False], [False, True]])),
    ("BYTES", "bytes_contents", [b"a", b"", b"xyz", b"\xff"],
     np.array([[b"a", b""], [b"xyz", b"\xff"]], dtype=np.object_)),
])
def test_typed_contents_are_packed_as_the_raw_bytes_triton_reads(datatype, field, values, array):
    tensor = _input(datatype, [2, 2], field, values).inputs[0]
    expected = serialize_byte_tensor(array).item() if datatype == "BYTES" else array.astype(array.dtype).tobytes()
    assert typed_bytes(tensor) == expected


def test_typed_contents_that_do_not_fit_are_refused_naming_the_input_and_field():
    with pytest.raises(RequestError, match=r"input x: contents.fp32_contents holds 3 values for shape \[2, 2\]"):
        typed_bytes(_input("FP32", [2, 2], "fp32_contents", [1.0, 2.0, 3.0]).inputs[0])
    with pytest.raises(RequestError, match="FP16 has no typed contents; send it in raw_input_contents"):
        typed_bytes(_input("FP16", [1], "fp32_contents", [1.0]).inputs[0])
    request = _input("FP32", [1], "fp32_contents", [1.0])
    request.inputs.add(name="y", datatype="FP32", shape=[1])
    request.raw_input_contents.append(b"\0\0\0\0")
    with pytest.raises(RequestError, match="raw_input_contents holds 1 tensors for 2 inputs") as refused:
        http_infer(request)
    assert refused.value.status == 400


def _header(request) -> tuple[dict, bytes]:  # noqa: ANN001 - kubeloop.front.httpserver.Request
    length = int(request.headers[b"inference-header-content-length"])
    return orjson.loads(request.body[:length]), request.body[length:]


def test_a_grpc_request_becomes_the_binary_http_request_that_asks_the_same():
    request = service_pb2.ModelInferRequest(model_name="fraud", model_version="3", id="r1")
    tensor = request.inputs.add(name="features", datatype="FP32", shape=[2, 2])
    tensor.parameters["note"].string_param = "kept"
    request.raw_input_contents.append(ROWS.tobytes())
    request.parameters["priority"].int64_param = 2
    request.parameters["flag"].bool_param = True
    request.outputs.add(name="probability").parameters["classification"].int64_param = 1

    http = http_infer(request)
    header, data = _header(http)
    assert (http.method, http.path, data) == ("POST", "/v2/models/fraud/versions/3/infer", ROWS.tobytes())
    assert header == {"id": "r1", "parameters": {"priority": 2, "flag": True},
                      "inputs": [{"name": "features", "datatype": "FP32", "shape": [2, 2],
                                  "parameters": {"note": "kept", "binary_data_size": 16}}],
                      "outputs": [{"name": "probability", "parameters": {"classification": 1, "binary_data": True}}]}

    del request.outputs[:]
    header, _ = _header(http_infer(request))
    assert "outputs" not in header and header["parameters"]["binary_data_output"] is True
    assert http_infer(service_pb2.ModelInferRequest(model_name="fraud")).path == "/v2/models/fraud/infer"


def test_the_routers_answer_becomes_triton_grpc_answer_binary_or_json():
    probability = np.array([[0.25], [0.75]], dtype=np.float32)
    head = orjson.dumps({"model_name": "fraud", "model_version": "3", "id": "r1", "parameters": {"sequence_id": 4},
                         "outputs": [{"name": "probability", "datatype": "FP32", "shape": [2, 1],
                                      "parameters": {"binary_data_size": 8}},
                                     {"name": "label", "datatype": "BYTES", "shape": [2], "data": ["no", "yes"]},
                                     {"name": "count", "datatype": "INT32", "shape": [2], "data": [7, 8]}]})
    binary = Response(200, head + probability.tobytes(), "application/octet-stream",
                      f"Inference-Header-Content-Length: {len(head)}\r\n".encode())
    response = infer_response(binary)
    assert (response.model_name, response.model_version, response.id) == ("fraud", "3", "r1")
    assert response.parameters["sequence_id"].int64_param == 4
    assert [(o.name, o.datatype, list(o.shape), dict(o.parameters)) for o in response.outputs] == [
        ("probability", "FP32", [2, 1], {}), ("label", "BYTES", [2], {}), ("count", "INT32", [2], {})]
    assert list(response.raw_output_contents) == [
        probability.tobytes(), serialize_byte_tensor(np.array([b"no", b"yes"], dtype=np.object_)).item(),
        np.array([7, 8], dtype=np.int32).tobytes()]


def test_the_routers_refusals_are_the_grpc_codes_triton_answers():
    assert refusal(Response(400, b'{"error": "bad shape"}')) == (grpc.StatusCode.INVALID_ARGUMENT, "bad shape")
    assert refusal(Response(503, b'{"error": "model server unavailable"}'))[0] == grpc.StatusCode.UNAVAILABLE
    assert refusal(Response(404, b'{"error": "no version 9"}'))[0] == grpc.StatusCode.NOT_FOUND
    assert refusal(Response(500, b"boom")) == (grpc.StatusCode.INTERNAL, "boom")


def test_tritonclient_grpc_through_the_front_is_routed_logged_and_counted_as_http_is(tmp_path):
    """tritonclient.grpc's requests (raw tensors, outputs named or not, keyed
    by metadata) reach the version the key picks, get Triton's answer as
    raw outputs with their id, and land in the request log with their
    decoded rows; a wrong model is NOT_FOUND; a stream answers each request
    in turn, a refused one with its error; the repository calls say where
    to go."""
    from aiohttp.test_utils import TestServer

    from kubeloop.front import router as module

    async def scenario() -> tuple[list, list, tuple, str]:
        received: list[dict] = []
        async with TestServer(echo_triton(received)) as triton:
            path = keyed_config(tmp_path, str(triton.make_url("")).rstrip("/"),
                                routes=[{"role": "primary", "version": "1", "percent": 50},
                                        {"role": "canary", "version": "2", "percent": 50}])
            async with module.running(path, grpc_port=0) as front:
                client = grpcclient.InferenceServerClient(front.grpc)
                answers = []
                for key, named in (("alice", True), ("alice", False), ("bob", True)):
                    tensor = grpcclient.InferInput("features", list(ROWS.shape), "FP32")
                    tensor.set_data_from_numpy(ROWS)
                    outputs = [grpcclient.InferRequestedOutput("probability")] if named else None
                    answers.append(await client.infer("fraud", [tensor], outputs=outputs, request_id=f"{key}-1",
                                                      headers={"x-request-key": key}))
                with pytest.raises(InferenceServerException) as unknown:
                    await client.infer("other", [tensor])
                with pytest.raises(InferenceServerException) as repository:
                    await client.get_model_repository_index()

                async def stream():  # noqa: ANN202 - one refused request between two answered ones
                    for model, request_id in (("fraud", "s1"), ("other", "s2"), ("fraud", "s3")):
                        yield {"model_name": model, "inputs": [tensor], "request_id": request_id}

                streamed = [(result.get_response().id if result else None, str(error) if error else None)
                            async for result, error in client.stream_infer(stream())]
                await client.close()
                metrics = (await module.asyncio.to_thread(_get, f"{front.url}/metrics"))
        return answers, received, (unknown.value.status(), repository.value.message(), streamed), metrics

    answers, received, (unknown, repository, streamed), metrics = asyncio.run(scenario())
    versions = [a.get_response().model_version for a in answers]
    assert versions[0] == versions[1] and set(versions) == {"1", "2"}
    assert [a.get_response().id for a in answers] == ["alice-1", "alice-1", "bob-1"]
    for answer in answers:
        np.testing.assert_array_equal(answer.as_numpy("probability"), np.full((2, 1), 0.25, dtype=np.float32))
    assert answers[1].as_numpy("echo") is not None and answers[0].as_numpy("echo") is None
    assert [r["inputs"][0]["data"] for r in received] == [ROWS.ravel().tolist()] * 5
    assert unknown == "StatusCode.NOT_FOUND"
    assert "does not serve RepositoryIndex" in repository
    assert streamed == [("s1", None), (None, "unknown model other"), ("s3", None)], streamed
    logged = list(request_records(tmp_path / "requests"))
    assert [(r["key"], r["version"], r["features"], r["outputs"]) for r in logged[:3]] == [
        (key, version, ROWS.tolist(), [0.25, 0.25]) for key, version in zip(("alice", "alice", "bob"), versions,
                                                                            strict=True)]
    assert [r["key"] for r in logged[3:]] == ["s1", "s3"]  # keyed by their ids
    counted = {line.split('role="')[1].split('"')[0]: float(line.split()[-1]) for line in metrics.splitlines()
               if line.startswith("kubeloop_inference_requests_total{")}
    assert counted == dict(Counter(r["role"] for r in logged))


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.read().decode()
