"""Callers' requests to one Triton version joined into one request, and its
answer split back (pure; the router makes the call).

Only a request that is one tensor of rows and nothing else Triton must see
joins others: one input (shape [rows, width], numbers only, a numeric
datatype), no request or tensor parameters, and outputs chosen by name only
(no parameters); it joins requests that chose the same outputs, or none.
tritonclient names the outputs its caller reads in every request, so
without that its callers' requests never joined. Anything else goes to
Triton on its own, as sent, so a request Triton would refuse is refused
alone and never fails the requests it would have joined.

The joined request and its answer carry their tensors in Triton's binary
extension (tritonclient builds and reads them): writing the joined rows as
JSON numbers cost the router about 10 us a request, and Triton as much to
read them. Callers still send and receive JSON.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import orjson
from tritonclient.http import InferenceServerClient, InferInput, InferRequestedOutput
from tritonclient.utils import triton_to_np_dtype

from kubeloop.front.features import flat_values

_TENSOR_KEYS = frozenset({"name", "shape", "datatype", "data"})
_NUMBER = frozenset({float, int})
NUMERIC = frozenset({"FP16", "FP32", "FP64", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32",
                     "UINT64"})
HEADER_LENGTH = "Inference-Header-Content-Length"
"""The length of the JSON header before a binary request's or answer's tensors."""


@dataclass(frozen=True)
class Rows:
    """One request's input tensor, as joinable rows."""

    name: str
    datatype: str
    width: int
    data: list
    """Flat: rows * width numbers."""
    request_id: str | None = None
    outputs: tuple[str, ...] | None = None
    """The outputs asked for by name, in order; None: every output."""

    @property
    def count(self) -> int:
        return len(self.data) // self.width

    @property
    def kind(self) -> tuple[str, str, int, tuple[str, ...] | None]:
        """Requests join only with requests of the same kind."""
        return self.name, self.datatype, self.width, self.outputs


def joinable(payload: dict) -> Rows | None:
    """The request's rows, or None when it must go to Triton as sent."""
    if not payload.keys() <= {"id", "inputs", "outputs"}:
        return None
    outputs = _named_outputs(payload.get("outputs"))
    if outputs == ():
        return None
    inputs = payload.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        return None
    tensor = inputs[0]
    shape, data = tensor.get("shape"), tensor.get("data")
    if (tensor.keys() != _TENSOR_KEYS or tensor["datatype"] not in NUMERIC or not isinstance(shape, list)
            or len(shape) != 2
            or not all(type(n) is int and n > 0 for n in shape) or not isinstance(data, list)):
        return None
    flat = flat_values(data)
    if len(flat) != shape[0] * shape[1] or not set(map(type, flat)) <= _NUMBER:
        return None
    request_id = payload.get("id")
    return Rows(str(tensor["name"]), str(tensor["datatype"]), shape[1], flat,
                request_id if isinstance(request_id, str) else None, outputs)


def _named_outputs(outputs: object) -> tuple[str, ...] | None:
    """The names of outputs chosen by name alone, None when none are
    chosen, () when the choice is anything else (Triton judges it alone)."""
    if outputs is None:
        return None
    if not isinstance(outputs, list) or not outputs or not all(
            isinstance(o, dict) and o.keys() == {"name"} and isinstance(o["name"], str) for o in outputs):
        return ()
    names = tuple(o["name"] for o in outputs)
    return names if len(set(names)) == len(names) else ()


def join(batch: list[Rows]) -> tuple[bytes, dict[str, str]]:
    """One request carrying every request's rows, in order, and its headers;
    its answer's tensors come back binary."""
    first = batch[0]
    data = [v for rows in batch for v in rows.data]
    tensor = InferInput(first.name, [len(data) // first.width, first.width], first.datatype)
    tensor.set_data_from_numpy(np.asarray(data, dtype=triton_to_np_dtype(first.datatype))
                               .reshape(-1, first.width), binary_data=True)
    asked = None if first.outputs is None else [InferRequestedOutput(n, binary_data=True) for n in first.outputs]
    body, header_length = InferenceServerClient.generate_request_body([tensor], outputs=asked)
    return body, {HEADER_LENGTH: str(header_length), "Content-Type": "application/octet-stream"}


def split(answer: bytes, header_length: str | None, batch: list[Rows]) -> list[bytes] | None:
    """Each request's own JSON answer from the joined request's, with its id;
    None when the answer does not hold one row per row sent."""
    rows_sent = sum(rows.count for rows in batch)
    try:
        whole, outputs = _tensors(answer, header_length)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError):
        return None
    if not outputs or any(values.ndim == 0 or len(values) != rows_sent for _, values in outputs):
        return None
    head = {k: v for k, v in whole.items() if k not in ("outputs", "id")}
    answers, start = [], 0
    for rows in batch:
        parts = [{"name": tensor["name"], "datatype": tensor["datatype"], "shape": [rows.count, *values.shape[1:]],
                  "data": values[start:start + rows.count].ravel().tolist()} for tensor, values in outputs]
        answers.append(orjson.dumps({**head, **({"id": rows.request_id} if rows.request_id else {}), "outputs": parts}))
        start += rows.count
    return answers


def _tensors(answer: bytes, header_length: str | None) -> tuple[dict, list[tuple[dict, np.ndarray]]]:
    """A v2 answer's JSON header and each output tensor's values, read from
    the binary part where Triton put them there (binary_data_size), else from
    the JSON. Reading the binary extension here, rather than through
    tritonclient's InferResult, costs the router a fifth of the time per
    joined call (its generic parsing was 16 us of a four-request call's
    every request)."""
    length = int(header_length) if header_length else len(answer)
    whole = orjson.loads(answer[:length])
    outputs, offset = [], length
    for tensor in whole["outputs"]:
        size = (tensor.get("parameters") or {}).get("binary_data_size")
        dtype = np.dtype(triton_to_np_dtype(tensor["datatype"]))
        if size is None:
            values = np.asarray(tensor["data"], dtype)
        else:
            if tensor["datatype"] == "BYTES" or offset + size > len(answer):
                raise ValueError(f"cannot read binary output {tensor['name']}")
            values = np.frombuffer(answer, dtype, count=size // dtype.itemsize, offset=offset)
            offset += size
        outputs.append((tensor, values.reshape(tensor["shape"])))
    return whole, outputs
