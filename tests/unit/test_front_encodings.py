"""The front speaks the KServe v2 encodings as Triton does: requests built
by tritonclient's own encoder and answers read by its own decoder, the codec
alone (pure) and the router in this process in front of a fake Triton (the
real tritonserver is in tests/e2e)."""

from __future__ import annotations

import asyncio
import gzip
import itertools
import json

import numpy as np
import orjson
import pytest
from tritonclient.http import InferenceServerClient, InferInput, InferRequestedOutput, InferResult

from kubeloop.front.batching import joinable
from kubeloop.front.encoding import BinaryOutputs, decode_request, encode_answer, not_json, plain_request
from kubeloop.front.features import RequestError
from tests.unit.test_router import _router_config, client_of, keyed_config, sent

ARRAYS = {
    "FP32": lambda rows: (np.arange(rows * 2, dtype=np.float32).reshape(rows, 2) - 1) / 3,
    "INT64": lambda rows: (np.arange(rows * 2, dtype=np.int64).reshape(rows, 2) - 3) * 2**40,
    # An empty element, and text that is not ASCII.
    "BYTES": lambda rows: np.array([[f"row {i}".encode(), "é".encode() * i] for i in range(rows)], dtype=object),
}
CASES = [(datatype, rows) for datatype in ARRAYS for rows in (1, 4)]


def tensor(array: np.ndarray, binary: bool, datatype: str, name: str = "features") -> InferInput:
    return InferInput(name, list(array.shape), datatype).set_data_from_numpy(array, binary_data=binary)


def request(array: np.ndarray, datatype: str, binary: bool, outputs: list | None = None,
            request_id: str = "") -> tuple[bytes, int | None]:
    """tritonclient's body for one input tensor, and the length of its JSON when binary."""
    return InferenceServerClient.generate_request_body([tensor(array, binary, datatype)], outputs=outputs,
                                                       request_id=request_id)


def header(json_size: int | None) -> bytes:
    return str(json_size).encode()


def as_read(array: np.ndarray, binary: bool) -> np.ndarray:
    """What tritonclient reads from Triton's answer of the array: BYTES come
    back bytes from binary data, text from JSON."""
    if array.dtype != object or binary:
        return array
    return np.array([[value.decode() for value in row] for row in array], dtype=object)


def same(found: np.ndarray, expected: np.ndarray) -> bool:
    return found.dtype == expected.dtype and found.shape == expected.shape and np.array_equal(found, expected)


# -- the codec ------------------------------------------------------------------


@pytest.mark.parametrize("datatype, rows", CASES)
def test_a_binary_request_decodes_to_its_json_twin(datatype, rows):
    array = ARRAYS[datatype](rows)
    outputs = [InferRequestedOutput("echo", binary_data=True)]
    binary, json_size = request(array, datatype, True, outputs, request_id="r1")
    as_json, no_size = request(array, datatype, False, outputs, request_id="r1")
    assert json_size is not None and no_size is None
    assert decode_request(binary, header(json_size)) == orjson.loads(as_json)


def test_json_and_binary_inputs_mix_in_one_body_in_order():
    first, second, third = np.array([[1.5]], np.float32), np.array([[7, 8]], np.int64), np.array([b"x"], object)
    body, json_size = InferenceServerClient.generate_request_body(
        [tensor(first, True, "FP32", "a"), tensor(second, False, "INT64", "b"), tensor(third, True, "BYTES", "c")])
    decoded = decode_request(body, header(json_size))
    assert [(t["name"], t["data"]) for t in decoded["inputs"]] == [("a", [1.5]), ("b", [7, 8]), ("c", ["x"])]
    assert all("parameters" not in t for t in decoded["inputs"])


def test_naming_no_outputs_asks_all_binary_and_the_plain_request_can_join_others():
    """tritonclient naming no outputs sends binary_data_output: Triton then
    answers every output binary; without it, the request is one Triton
    answers in JSON and the router may join."""
    array = ARRAYS["FP32"](4)
    body, json_size = request(array, "FP32", True)
    plain, binary = plain_request(decode_request(body, header(json_size)))
    assert binary == BinaryOutputs(every=True) and "anything" in binary
    assert plain == {"inputs": [{"name": "features", "shape": [4, 2], "datatype": "FP32",
                                 "data": array.ravel().tolist()}]}
    assert joinable(plain) is not None


def test_named_outputs_are_binary_by_their_own_binary_data_as_in_triton():
    """Triton's HTTP server reads binary_data_output only when no output is named."""
    payload = {"inputs": [], "parameters": {"binary_data_output": True, "priority": 1},
               "outputs": [{"name": "p", "parameters": {"binary_data": True, "classification": 2}},
                           {"name": "q", "parameters": {"binary_data": False}}, {"name": "r"}]}
    plain, binary = plain_request(payload)
    assert binary == BinaryOutputs(named=frozenset({"p"})) and "p" in binary and "q" not in binary
    assert plain == {"inputs": [], "parameters": {"priority": 1},
                     "outputs": [{"name": "p", "parameters": {"classification": 2}}, {"name": "q"}, {"name": "r"}]}
    assert plain_request({"inputs": [], "outputs": [{"name": "p"}]})[1] is None
    assert plain_request({"inputs": [], "parameters": {"binary_data_output": False}}) == ({"inputs": []}, None)


@pytest.mark.parametrize("payload", [
    {"inputs": [], "parameters": {"binary_data_output": "yes"}},
    {"inputs": [], "outputs": [{"name": "p", "parameters": {"binary_data": 1}}]},
    {"inputs": [], "outputs": "p"},
], ids=["request flag", "output flag", "outputs not a list"])
def test_encoding_choices_triton_would_refuse_are_400(payload):
    with pytest.raises(RequestError) as refused:
        plain_request(payload)
    assert refused.value.status == 400


def triton_answer(outputs: dict[str, tuple[str, np.ndarray]]) -> bytes:
    """A JSON answer as Triton writes it (flat data), with an id."""
    return orjson.dumps({"id": "r1", "model_name": "m", "model_version": "2", "outputs": [
        {"name": name, "datatype": datatype, "shape": list(array.shape),
         "data": [v.decode() if isinstance(v, bytes) else v for v in array.ravel().tolist()]}
        for name, (datatype, array) in outputs.items()]})


@pytest.mark.parametrize("datatype, rows", CASES)
def test_an_encoded_answer_reads_as_the_arrays_triton_answered(datatype, rows):
    array = ARRAYS[datatype](rows)
    probability = np.linspace(0, 1, rows, dtype=np.float32).reshape(rows, 1)
    answer = triton_answer({"echo": (datatype, array), "probability": ("FP32", probability)})
    body, length = encode_answer(answer, BinaryOutputs(named=frozenset({"echo"})))
    result = InferResult.from_response_body(body, header_length=length)
    assert same(result.as_numpy("echo"), array) and same(result.as_numpy("probability"), probability)
    assert result.get_output("echo")["parameters"]["binary_data_size"] > 0
    assert "data" in result.get_output("probability") and "parameters" not in result.get_output("probability")
    assert {k: v for k, v in result.get_response().items() if k != "outputs"} == \
        {"id": "r1", "model_name": "m", "model_version": "2"}


def test_an_answer_with_no_binary_bytes_is_plain_json_as_triton_sends_it():
    empty = np.zeros((0, 2), np.float32)
    body, length = encode_answer(triton_answer({"echo": ("FP32", empty)}), BinaryOutputs(every=True))
    assert length is None
    assert json.loads(body)["outputs"][0]["parameters"] == {"binary_data_size": 0}
    assert same(InferResult.from_response_body(body).as_numpy("echo"), empty)


def test_an_answer_that_cannot_be_encoded_is_a_502():
    with pytest.raises(RequestError) as failed:
        encode_answer(b'{"outputs": [{"name": "p", "datatype": "FP32"}]}', BinaryOutputs(every=True))
    assert failed.value.status == 502


def tritonclient_variant(change: str) -> tuple[bytes, bytes]:
    """A body and Inference-Header-Content-Length tritonclient built for a
    [2, 2] FP32 tensor, then broken as `change` says."""
    array = np.arange(4, dtype=np.float32).reshape(2, 2)
    if change == "not utf-8":
        body, json_size = request(np.array([b"\xff"], dtype=object), "BYTES", True)
        return body, header(json_size)
    if change in ("shape", "elements"):
        datatype, data = ("FP32", array) if change == "shape" else ("BYTES", np.array([b"a", b"b"], dtype=object))
        broken = tensor(data, True, datatype).set_shape([2, 3])
        body, json_size = InferenceServerClient.generate_request_body([broken])
        return body, header(json_size)
    body, json_size = request(array, "FP32", True)
    return {"extra bytes": (body + b"\0", header(json_size)),
            "short": (body[:-1], header(json_size)),
            "header not a number": (body, b"12a"),
            "header past the body": (body, header(len(body) + 1)),
            "header inside the JSON": (body, header(json_size - 3))}[change]


@pytest.mark.parametrize("change, said", [
    ("extra bytes", ["add up to 16 bytes but 17 follow the JSON header", "in the order of inputs"]),
    ("short", ["input features: binary_data_size 16 runs past the body's end (15 bytes left)"]),
    ("shape", ["input features: binary_data_size 16 does not fit shape [2, 3] of FP32", "24"]),
    ("elements", ["input features", "do not hold the 6 BYTES elements", "4-byte little-endian length"]),
    ("not utf-8", ["input features", "not UTF-8"]),
    ("header not a number", ["Inference-Header-Content-Length header is '12a'", "length of the JSON"]),
    ("header past the body", ["Inference-Header-Content-Length header", "1 to"]),
    ("header inside the JSON", ["are not a JSON object", "length of the JSON inference request"]),
])
def test_a_binary_body_that_does_not_add_up_is_a_400_naming_the_fix(change, said):
    body, length = tritonclient_variant(change)
    with pytest.raises(RequestError) as refused:
        decode_request(body, length)
    assert refused.value.status == 400
    assert all(part in str(refused.value) for part in said), str(refused.value)


@pytest.mark.parametrize("array, datatype, said", [
    (np.ones((1, 2), np.float16), "FP16", "send it as FP32"),
    (np.array([[1.0, np.nan]], np.float32), "FP32", "NaN or infinity"),
    (np.array([[np.inf]], np.float64), "FP64", "NaN or infinity"),
], ids=["FP16", "NaN", "infinity"])
def test_what_json_cannot_carry_to_triton_is_refused_by_name(array, datatype, said):
    body, json_size = request(array, datatype, True)
    with pytest.raises(RequestError) as refused:
        decode_request(body, header(json_size))
    assert refused.value.status == 400 and "input features" in str(refused.value) and said in str(refused.value)


def test_a_binary_body_without_its_header_is_told_which_header_and_value():
    body, json_size = request(ARRAYS["FP32"](4), "FP32", True)
    said = not_json(body)
    assert "input features" in said and f"Inference-Header-Content-Length header: set it to {json_size}," in said
    assert not_json(b"{nope") == not_json(b'{"inputs": []} trailing') == "the body is not JSON"


# -- through the router ---------------------------------------------------------


def echo_triton(received: list[dict]):  # noqa: ANN201 - an aiohttp application
    """A Triton stand-in that takes JSON only (the front's Triton leg) and
    answers as Triton does: the request's id, the outputs it names (all when
    none), here "probability" (0.25 a row) and "echo" (its first input)."""
    from aiohttp import web

    async def infer(request: web.Request) -> web.Response:
        assert "Inference-Header-Content-Length" not in request.headers
        assert "Content-Encoding" not in request.headers and request.headers["Accept-Encoding"] == "identity"
        payload = json.loads(await request.read())
        received.append(payload)
        first = payload["inputs"][0]
        rows = first["shape"][0]
        outputs = [{"name": "probability", "datatype": "FP32", "shape": [rows, 1], "data": [0.25] * rows},
                   {"name": "echo", **{k: first[k] for k in ("datatype", "shape", "data")}}]
        named = {output["name"] for output in payload.get("outputs", [])}
        return web.json_response({**({"id": payload["id"]} if "id" in payload else {}), "model_name": "fraud",
                                  "model_version": request.match_info["version"],
                                  "outputs": [o for o in outputs if not named or o["name"] in named]})

    app = web.Application()
    app.router.add_post("/v2/models/{model}/versions/{version}/infer", infer)
    return app


async def post_all(config, bodies: list[tuple[bytes, int | None]], keys: list[str] | None = None,  # noqa: ANN001
                   ) -> tuple[list[tuple[int, dict, bytes]], list[dict]]:
    """Each body (as sent() sends it) through a router of config(triton_url)
    in front of echo_triton, one at a time: each answer's status, headers
    and body, and what Triton received."""
    from aiohttp.test_utils import TestServer

    from kubeloop.front import router as module

    received: list[dict] = []
    async with TestServer(echo_triton(received)) as triton:
        path = config(str(triton.make_url("")).rstrip("/"))
        async with module.running(path) as (url, _, _), client_of(url) as client:
            answers = []
            for i, body in enumerate(bodies):
                data, headers = sent(body)
                key = {"X-Request-Key": keys[i]} if keys else {}
                async with client.post("/v2/models/fraud/infer", data=data, headers={**headers, **key}) as answer:
                    answers.append((answer.status, dict(answer.headers), await answer.read()))
    return answers, received


@pytest.fixture
def front_env(monkeypatch):
    """As the router runs: processes.start leaves out what an earlier test's feast import set."""
    from kubeloop import processes

    for name in processes.INHERITED_NOT:
        monkeypatch.delenv(name, raising=False)


def read(status: int, headers: dict, body: bytes) -> InferResult:
    assert status == 200, body
    length = headers.get("Inference-Header-Content-Length")
    assert (headers["Content-Type"] == "application/octet-stream") == (length is not None)
    return InferResult.from_response_body(body, header_length=int(length) if length else None)


# (name, inputs binary, outputs asked: None names none, else output -> binary)
MODES = [("json in, json out", False, {"echo": False, "probability": False}),
         ("binary in, json out", True, {"echo": False, "probability": False}),
         ("json in, binary out", False, {"echo": True, "probability": True}),
         ("binary both ways", True, {"echo": True, "probability": False}),
         ("json in, no outputs named", False, None),
         ("binary in, no outputs named", True, None)]


@pytest.mark.parametrize("datatype, rows", CASES)
def test_tritonclient_callers_read_the_arrays_triton_would_answer(datatype, rows, tmp_path, front_env):
    array = ARRAYS[datatype](rows)
    bodies = [request(array, datatype, binary_in, outputs and [InferRequestedOutput(name, binary_data=binary)
                                                               for name, binary in outputs.items()],
                      request_id=f"r{i}")
              for i, (_, binary_in, outputs) in enumerate(MODES)]
    answers, received = asyncio.run(post_all(lambda url: keyed_config(tmp_path, url), bodies))
    for i, ((mode, _, outputs), answer) in enumerate(zip(MODES, answers, strict=True)):
        result = read(*answer)
        binary = outputs or {"echo": True, "probability": True}
        assert same(result.as_numpy("echo"), as_read(array, binary["echo"])), mode
        assert result.as_numpy("probability").ravel().tolist() == [0.25] * rows, mode
        assert {o["name"]: "parameters" in o for o in result.get_response()["outputs"]} == binary, mode
        assert result.get_response()["id"] == f"r{i}", mode
    # Triton's leg is JSON: no binary data, nor any binary choice, reaches it.
    assert len(received) == len(MODES) and "binary_data" not in json.dumps(received)
    assert all(r["inputs"][0]["data"] == received[0]["inputs"][0]["data"] for r in received)


def test_a_binary_request_is_logged_and_counted_as_its_json_twin(tmp_path, front_env):
    from kubeloop.requestlog import request_records

    array = ARRAYS["FP32"](4)
    bodies = [request(array, "FP32", False, [InferRequestedOutput("probability", binary_data=False)]),
              request(array, "FP32", True)]
    answers, _ = asyncio.run(post_all(lambda url: keyed_config(tmp_path, url), bodies, keys=["as-json", "binary"]))
    assert [status for status, _, _ in answers] == [200, 200]
    logged = {row["key"]: row for row in request_records(tmp_path / "requests")}
    assert logged["binary"]["features"] == logged["as-json"]["features"] == array.tolist()
    assert logged["binary"]["outputs"] == logged["as-json"]["outputs"] == [0.25] * 4


def test_a_binary_entity_request_reads_the_online_store_and_answers_binary(tmp_path, front_env, monkeypatch):
    from kubeloop.front import router as module
    from kubeloop.front.features import FeatureSpec, Retrieved, ViewInfo
    from kubeloop.requestlog import request_records

    class Store:
        views = [ViewInfo("card_activity", ("avg_amount_7d",), ("card_id",))]

        def __init__(self, spec):  # noqa: ANN001 - FeatureSpec
            self.spec = spec

        def read(self, rows):  # noqa: ANN001, ANN202 - OnlineStore's signature
            cards = rows["card_id"]
            return Retrieved({"avg_amount_7d": [card / 2 for card in cards]}, {"card_activity": [True] * len(cards)},
                             {"card_activity": [None] * len(cards)})

    monkeypatch.setattr(module, "OnlineStore", Store)
    spec = FeatureSpec(store="{}", views=("card_activity",), entities=("card_id",), request_columns=(),
                       columns=("avg_amount_7d",))
    cards = np.array([7, 8], np.int64)
    body = InferenceServerClient.generate_request_body([tensor(cards, True, "INT64", "card_id")], request_id="e1")
    answers, received = asyncio.run(post_all(lambda url: _router_config(tmp_path, url, features=spec), [body]))
    result = read(*answers[0])
    assert same(result.as_numpy("echo"), np.array([[3.5], [4.0]], np.float32))
    assert result.get_response()["id"] == "e1"
    assert received[0]["inputs"][0]["data"] == [[3.5], [4.0]]
    [row] = request_records(tmp_path / "requests")
    assert row["request"] == {"card_id": [7, 8]} and row["features"] == [[3.5], [4.0]]


def test_a_binary_body_the_front_cannot_read_is_a_400_and_never_reaches_triton(tmp_path, front_env):
    body, json_size = request(ARRAYS["FP32"](4), "FP32", True)
    bodies = [(body, None), (body + b"\0\0\0\0", json_size), (body, json_size - 1)]
    answers, received = asyncio.run(post_all(lambda url: keyed_config(tmp_path, url), bodies))
    errors = [(status, json.loads(text)["error"]) for status, _, text in answers]
    assert [status for status, _ in errors] == [400, 400, 400] and received == []
    assert f"input features has a binary_data_size but the request has no Inference-Header-Content-Length " \
           f"header: set it to {json_size}" in errors[0][1]
    assert "add up to 32 bytes but 36 follow" in errors[1][1] and "not a JSON object" in errors[2][1]


def tritonclient_compressing(url: str, array: np.ndarray) -> dict[str, np.ndarray]:
    """tritonclient's answers to the array sent in every pair of request and
    answer compressions (None: none), binary and JSON in turn, by request id."""
    client = InferenceServerClient(url.removeprefix("http://"), network_timeout=10)
    answers = {}
    for i, (request_coding, answer_coding) in enumerate(itertools.product(("gzip", "deflate", None), repeat=2)):
        result = client.infer("fraud", [tensor(array, i % 2 == 0, "FP32")], request_id=f"c{i}",
                              outputs=[InferRequestedOutput("echo", binary_data=i % 3 == 0),
                                       InferRequestedOutput("probability")],  # what the request log reads
                              request_compression_algorithm=request_coding, response_compression_algorithm=answer_coding)
        answers[result.get_response()["id"]] = result.as_numpy("echo")
    return answers


async def gzipped_binary_answer(url: str, array: np.ndarray) -> tuple[dict, bytes]:
    """The headers and raw body of a gzipped binary request asking for a gzipped binary answer."""
    import aiohttp

    body, json_size = request(array, "FP32", True, [InferRequestedOutput("echo", binary_data=True)])
    headers = {"Content-Encoding": "gzip", "Accept-Encoding": "gzip", "Inference-Header-Content-Length": str(json_size)}
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        async with session.post(f"{url}/v2/models/fraud/infer", data=gzip.compress(body), headers=headers) as answer:
            return dict(answer.headers), await answer.read()


def test_compressed_requests_and_answers_work_as_tritonclient_asks_for_them(tmp_path, front_env):
    """tritonclient's request_compression_algorithm and
    response_compression_algorithm: the body is decoded before routing and
    logging (Inference-Header-Content-Length counting the plain body's
    bytes), Triton is called plain, and the answer comes back in the coding
    asked, its binary header counting the plain answer's JSON, as Triton's."""
    from aiohttp.test_utils import TestServer

    from kubeloop.front import router as module
    from kubeloop.requestlog import request_records

    array = ARRAYS["FP32"](64)  # an answer long enough to be worth compressing

    async def go() -> tuple[dict, tuple[dict, bytes], list[dict]]:
        received: list[dict] = []
        async with TestServer(echo_triton(received)) as triton:
            path = keyed_config(tmp_path, str(triton.make_url("")).rstrip("/"))
            async with module.running(path) as (url, _, _):
                return (await asyncio.to_thread(tritonclient_compressing, url, array),
                        await gzipped_binary_answer(url, array), received)

    answers, (headers, body), received = asyncio.run(go())
    assert len(answers) == 9 and all(same(found, array) for found in answers.values())
    assert headers["Content-Encoding"] == "gzip" and headers["Content-Type"] == "application/octet-stream"
    assert same(read(200, headers, gzip.decompress(body)).as_numpy("echo"), array)
    assert len(received) == 10 and all(r["inputs"][0]["data"] == array.ravel().tolist() for r in received)
    logged = {row["key"]: row["features"] for row in request_records(tmp_path / "requests")}
    assert logged.keys() >= set(answers) and all(logged[key] == array.tolist() for key in answers)
