"""Requests joined into one Triton request and its answer split back (pure;
the router in front of a real tritonserver is in
tests/components/test_serving_tasks.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kubeloop.front.batching import HEADER_LENGTH, Rows, join, joinable, split


def _request(rows: list[list[float]], **extra) -> dict:
    return {"inputs": [{"name": "features", "shape": [len(rows), len(rows[0])], "datatype": "FP32",
                        "data": rows}], **extra}


def test_a_tensor_of_rows_is_joinable_flat_or_nested_with_its_id():
    nested = joinable(_request([[1.0, 2.0], [3.0, 4.0]], id="a"))
    flat = joinable({"inputs": [{"name": "features", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3, 4.0]}]})
    assert nested == Rows("features", "FP32", 2, [1.0, 2.0, 3.0, 4.0], "a") and nested.count == 2
    assert flat.data == [1, 2, 3, 4.0] and flat.request_id is None and flat.kind == nested.kind


@pytest.mark.parametrize("payload", [
    _request([[1.0, 2.0]], parameters={"binary_data_output": True}),
    _request([[1.0, 2.0]], outputs=[{"name": "probability", "parameters": {"classification": 2}}]),
    _request([[1.0, 2.0]], outputs=[{"name": "probability"}, {"name": "probability"}]),
    _request([[1.0, 2.0]], outputs=[]),
    {"inputs": [{"name": "features", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 2.0],
                 "parameters": {"binary_data_size": 8}}]},
    {"inputs": [{"name": "features", "shape": [2, 2], "datatype": "FP32", "data": [1.0, 2.0, 3.0]}]},
    {"inputs": [{"name": "features", "shape": [1, 2], "datatype": "FP32", "data": ["1.0", 2.0]}]},
    {"inputs": [{"name": "features", "shape": [2], "datatype": "FP32", "data": [1.0, 2.0]}]},
    {"inputs": [{"name": "features", "shape": [0, 2], "datatype": "FP32", "data": []}]},
    {"inputs": [{"name": "features", "shape": [1, 1], "datatype": "FP32", "data": [True]}]},
    {"inputs": [_request([[1.0]])["inputs"][0], _request([[2.0]])["inputs"][0]]},
    {"inputs": "features"},
    {"inputs": [{"name": "features", "shape": [1, 1], "datatype": "BYTES", "data": [1]}]},
], ids=["request parameters", "an output's parameters", "an output twice", "no output", "binary input", "short data", "a string", "no row dimension",
        "no rows", "a boolean", "two inputs", "not a list", "not numeric"])
def test_a_request_triton_must_judge_alone_is_not_joinable(payload):
    assert joinable(payload) is None


def test_requests_naming_their_outputs_join_those_that_name_the_same():
    """tritonclient names the outputs its caller reads in every request."""
    named = joinable(_request([[1.0, 2.0]], outputs=[{"name": "probability"}, {"name": "label"}]))
    assert named.outputs == ("probability", "label")
    assert named.kind == joinable(_request([[3.0, 4.0]], outputs=[{"name": "probability"}, {"name": "label"}])).kind
    assert named.kind != joinable(_request([[3.0, 4.0]], outputs=[{"name": "label"}, {"name": "probability"}])).kind
    assert named.kind != joinable(_request([[3.0, 4.0]])).kind
    body, headers = join([named, named])
    header = json.loads(body[:int(headers[HEADER_LENGTH])])
    assert header["outputs"] == [{"name": "probability", "parameters": {"binary_data": True}},
                                 {"name": "label", "parameters": {"binary_data": True}}]


def _binary(header: dict, tensors: list[np.ndarray]) -> tuple[bytes, str]:
    """A body in Triton's binary extension: its JSON header, then the tensors' bytes."""
    text = json.dumps(header).encode()
    return text + b"".join(t.tobytes() for t in tensors), str(len(text))


def test_joined_rows_keep_their_order_and_go_binary():
    batch = [joinable(_request([[1.0, 2.0]])), joinable(_request([[3.0, 4.0], [5.0, 6.0]]))]
    body, headers = join(batch)
    length = int(headers[HEADER_LENGTH])
    header = json.loads(body[:length])
    assert header["inputs"] == [{"name": "features", "shape": [3, 2], "datatype": "FP32",
                                 "parameters": {"binary_data_size": 24}}]
    assert np.frombuffer(body[length:], np.float32).tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def test_each_request_gets_its_rows_of_every_output_and_its_own_id():
    batch = [joinable(_request([[1.0]], id="first")), joinable(_request([[2.0], [3.0]]))]
    probabilities = np.array([[0.25, 0.75], [0.5, 0.5], [0.125, 0.875]], np.float32)
    labels = np.array([1, 0, 1], np.int64)
    answer, length = _binary({"model_name": "m", "model_version": "2", "outputs": [
        {"name": "probabilities", "datatype": "FP32", "shape": [3, 2], "parameters": {"binary_data_size": 24}},
        {"name": "label", "datatype": "INT64", "shape": [3], "parameters": {"binary_data_size": 24}}]},
        [probabilities, labels])
    first, second = (json.loads(part) for part in split(answer, length, batch))
    assert first == {"model_name": "m", "model_version": "2", "id": "first", "outputs": [
        {"name": "probabilities", "datatype": "FP32", "shape": [1, 2], "data": [0.25, 0.75]},
        {"name": "label", "datatype": "INT64", "shape": [1], "data": [1]}]}
    assert "id" not in second and second["outputs"][0]["shape"] == [2, 2]
    assert second["outputs"][0]["data"] == [0.5, 0.5, 0.125, 0.875] and second["outputs"][1]["data"] == [0, 1]


def test_a_json_answer_splits_too():
    """Triton may answer a tensor in JSON whatever was asked."""
    batch = [joinable(_request([[1.0]])), joinable(_request([[2.0]]))]
    answer = json.dumps({"outputs": [{"name": "p", "datatype": "FP32", "shape": [2, 1], "data": [0.25, 0.5]}]})
    assert [json.loads(part)["outputs"][0]["data"] for part in split(answer.encode(), None, batch)] == [[0.25], [0.5]]


@pytest.mark.parametrize("answer", [
    b"not json",
    json.dumps({"outputs": []}).encode(),
    json.dumps({"outputs": [{"name": "p", "datatype": "FP32", "shape": [2, 1], "data": [0.1, 0.2]}]}).encode(),
    json.dumps({"outputs": [{"name": "p", "datatype": "FP32", "shape": [], "data": [0.1]}]}).encode(),
], ids=["not JSON", "no outputs", "fewer rows", "no row dimension"])
def test_an_answer_without_one_row_per_row_sent_is_not_split(answer):
    batch = [joinable(_request([[1.0]])), joinable(_request([[2.0], [3.0]]))]
    assert split(answer, None, batch) is None
