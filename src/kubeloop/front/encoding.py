"""The encodings of the KServe v2 HTTP protocol as Triton speaks them (pure):
a tensor's values in the JSON (`data`), or Triton's binary tensor data
extension, where the body is a JSON header `Inference-Header-Content-Length`
bytes long followed by each binary tensor's bytes (its `binary_data_size`),
in the order the header lists them: little-endian, row-major; BYTES
elements each a 4-byte little-endian length, then that many bytes.

The router reads one form whatever a caller sent: tensors as JSON lists.
Its routing, joining, request log, mirrors and entity requests all read
that form, so a binary request is decoded into it on arrival, and an answer
the caller wants binary is encoded from Triton's JSON answer on the way out.

Triton is sent JSON (and asked for JSON answers) rather than the caller's
binary body: carrying a request in two forms, and an answer's header length
down every path (joined calls, mirrors, entity requests), would cost more
code than the decoding does, and joined calls are binary anyway
(kubeloop.front.batching). Taking the encoding choices out of a request
also lets tritonclient's requests, which always name outputs or
binary_data_output, join others. The price, refused here by name: what
JSON cannot carry to Triton (FP16, BF16, NaN and infinities, BYTES that are
not UTF-8 text).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass

import numpy as np
import orjson
from tritonclient.utils import triton_to_np_dtype

from kubeloop.front.batching import HEADER_LENGTH
from kubeloop.front.features import RequestError

REQUEST_HEADER = HEADER_LENGTH.lower().encode()
"""How kubeloop.front.httpserver names the header in a request."""
_NOT_JSON_TYPES = ("FP16", "BF16")
"""Datatypes Triton takes and answers in binary only."""
_LENGTH = struct.Struct("<I")


@dataclass(frozen=True)
class BinaryOutputs:
    """The outputs a caller wants as binary data, as Triton's HTTP server
    decides: a named output when its binary_data is true, every output when
    the request names none and says binary_data_output (which, there, does
    not reach a named output)."""

    every: bool = False
    named: frozenset[str] = frozenset()

    def __contains__(self, name: str) -> bool:
        return self.every or name in self.named


def plain_request(payload: dict) -> tuple[dict, BinaryOutputs | None]:
    """The request without its encoding choices, so that Triton answers it
    in JSON, and the outputs the caller wants binary (None: none)."""
    outputs = payload.get("outputs", [])
    if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
        raise RequestError(400, "outputs must be a list of objects, each naming an output")
    every = _flag(payload, "binary_data_output") and not outputs
    named = frozenset(str(o.get("name")) for o in outputs if _flag(o, "binary_data"))
    plain = _without(payload, "binary_data_output")
    if outputs:
        plain["outputs"] = [_without(o, "binary_data") for o in outputs]
    return plain, (BinaryOutputs(every, named) if every or named else None)


def decode_request(body: bytes, header_length: bytes) -> dict:
    """A binary request in the router's form: each binary input's bytes,
    read in order after the JSON header, as a flat `data` list."""
    start = _header_length(header_length, len(body))
    payload = _json_header(body[:start])
    inputs = payload.get("inputs")
    if not isinstance(inputs, list) or not all(isinstance(t, dict) for t in inputs):
        raise RequestError(400, "the request's inputs must be a list of tensors (objects with a name, shape and "
                                "datatype)")
    offset, decoded = start, []
    for tensor in inputs:
        tensor, offset = _read_input(tensor, body, offset)
        decoded.append(tensor)
    if offset != len(body):
        raise RequestError(400, f"the inputs' binary_data_size add up to {offset - start} bytes but "
                                f"{len(body) - start} follow the JSON header: give each binary input the "
                                "size of its own bytes, in the order of inputs")
    return {**payload, "inputs": decoded}


def not_json(body: bytes) -> str:
    """Why a body sent without Inference-Header-Content-Length cannot be
    read; for a binary body, the inputs it carries and the header's value."""
    try:
        # latin-1 keeps one character per byte, so the end found is the JSON part's length.
        header, end = json.JSONDecoder().raw_decode(body.decode("latin-1"))
    except ValueError:
        return "the body is not JSON"
    names = _binary_inputs(header)
    if not names:
        return "the body is not JSON"
    return (f"input {', '.join(names)} has a binary_data_size but the request has no {HEADER_LENGTH} header: "
            f"set it to {end}, the length of the JSON before the tensor data")


def encode_answer(answer: bytes, binary: BinaryOutputs) -> tuple[bytes, int | None]:
    """Triton's JSON answer with the outputs the caller wants binary moved
    after the JSON, and the JSON's length: None when no bytes follow it (as
    Triton, which then answers plain JSON)."""
    try:
        whole = orjson.loads(answer)
        tensors = [_binary_output(t) if t["name"] in binary else (t, b"") for t in whole["outputs"]]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RequestError(502, f"Triton's answer cannot be encoded as binary data: {exc}") from exc
    header = orjson.dumps({**whole, "outputs": [tensor for tensor, _ in tensors]})
    data = b"".join(raw for _, raw in tensors)
    return header + data, (len(header) if data else None)


def _binary_output(tensor: dict) -> tuple[dict, bytes]:
    raw = tensor_bytes(tensor["datatype"], tensor["data"])
    parameters = {**tensor.get("parameters", {}), "binary_data_size": len(raw)}
    return {**{k: v for k, v in tensor.items() if k != "data"}, "parameters": parameters}, raw


def tensor_bytes(datatype: str, data: list) -> bytes:
    """A tensor's values (flat or nested by row; BYTES as text or bytes) in
    the binary form: what binary_data_size counts, and gRPC's raw contents."""
    if datatype == "BYTES":
        encoded = [v if isinstance(v, bytes) else str(v).encode() for v in np.asarray(data, dtype=object).ravel()]
        return b"".join(_LENGTH.pack(len(value)) + value for value in encoded)
    dtype = _numpy_type(datatype)
    if dtype is None:
        raise TypeError(f"no binary form for datatype {datatype!r}")
    return np.asarray(data, dtype=dtype).tobytes()


def _read_input(tensor: dict, body: bytes, offset: int) -> tuple[dict, int]:
    """The tensor with its values in `data` (one without a binary_data_size
    as sent), and where the next input's bytes start."""
    size = _parameters(tensor).get("binary_data_size")
    if size is None:
        return tensor, offset
    name = tensor.get("name")
    if type(size) is not int or size < 0:
        raise RequestError(400, f"input {name}: binary_data_size must be a count of bytes, not {size!r}")
    if offset + size > len(body):
        raise RequestError(400, f"input {name}: binary_data_size {size} runs past the body's end "
                                f"({len(body) - offset} bytes left): give each binary input the size of its own "
                                "bytes, in the order of inputs")
    values = _values(name, tensor.get("datatype"), tensor.get("shape"), memoryview(body)[offset:offset + size])
    return {**_without(tensor, "binary_data_size"), "data": values}, offset + size


def _values(name: str, datatype: str, shape: list, raw: memoryview) -> list:
    """A binary tensor's values, flat, checked against its shape and datatype."""
    count = _element_count(name, shape)
    if datatype == "BYTES":
        return _texts(name, shape, count, raw)
    if datatype in _NOT_JSON_TYPES:
        raise RequestError(400, f"input {name}: the front hands Triton its tensors as JSON, which carries no "
                                f"{datatype} (Triton refuses it there): send it as FP32")
    dtype = _numpy_type(datatype)
    if dtype is None:
        raise RequestError(400, f"input {name}: unknown datatype {datatype!r}")
    if len(raw) != count * dtype.itemsize:
        raise RequestError(400, f"input {name}: binary_data_size {len(raw)} does not fit shape {shape} of "
                                f"{datatype} ({count} elements of {dtype.itemsize} bytes: "
                                f"{count * dtype.itemsize}); send the tensor's raw little-endian values")
    values = np.frombuffer(raw, dtype)
    if dtype.kind == "f" and not np.isfinite(values).all():
        raise RequestError(400, f"input {name}: holds NaN or infinity, which JSON, the front's way to Triton, "
                                "cannot carry: send finite values")
    return values.tolist()


def _texts(name: str, shape: list, count: int, raw: memoryview) -> list[str]:
    """BYTES elements, each a 4-byte little-endian length and its bytes, as text."""
    values, offset = [], 0
    while len(values) < count and offset + _LENGTH.size <= len(raw):
        (size,) = _LENGTH.unpack_from(raw, offset)
        values.append(bytes(raw[offset + _LENGTH.size:offset + _LENGTH.size + size]))
        offset += _LENGTH.size + size
    if len(values) != count or offset != len(raw):
        raise RequestError(400, f"input {name}: its {len(raw)} bytes do not hold the {count} BYTES elements of "
                                f"shape {shape}, each a 4-byte little-endian length followed by that many bytes")
    try:
        return [value.decode() for value in values]
    except UnicodeDecodeError as exc:
        raise RequestError(400, f"input {name}: an element is not UTF-8 text, and the front hands Triton its "
                                "tensors as JSON, which carries text only") from exc


def _element_count(name: str, shape: list) -> int:
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        raise RequestError(400, f"input {name}: shape must be a list of dimension sizes, not {shape!r}")
    return math.prod(shape)


def _numpy_type(datatype: str) -> np.dtype | None:
    found = triton_to_np_dtype(datatype) if isinstance(datatype, str) else None
    return None if found is None else np.dtype(found).newbyteorder("<")


def _header_length(value: bytes, body_length: int) -> int:
    if not value.isdigit() or not 0 < int(value) <= body_length:
        raise RequestError(400, f"the {HEADER_LENGTH} header is {value.decode('latin-1')!r}: it gives the length "
                                f"of the JSON that starts the body, 1 to {body_length} bytes")
    return int(value)


def _json_header(text: bytes) -> dict:
    try:
        payload = orjson.loads(text)
    except orjson.JSONDecodeError:
        payload = None
    if not isinstance(payload, dict):
        raise RequestError(400, f"the body's first {len(text)} bytes ({HEADER_LENGTH}) are not a JSON object: "
                                "the header gives the length of the JSON inference request before the tensor data")
    return payload


def _binary_inputs(header: object) -> list[str]:
    """The names of the inputs a request's JSON says are binary."""
    inputs = header.get("inputs") if isinstance(header, dict) else None
    if not isinstance(inputs, list):
        return []
    return [str(t.get("name")) for t in inputs if isinstance(t, dict) and "binary_data_size" in _parameters(t)]


def _flag(holder: dict, key: str) -> bool:
    value = _parameters(holder).get(key, False)
    if not isinstance(value, bool):
        raise RequestError(400, f"parameters.{key} must be true or false, not {value!r}")
    return value


def _parameters(holder: dict) -> dict:
    parameters = holder.get("parameters")
    return parameters if isinstance(parameters, dict) else {}


def _without(holder: dict, key: str) -> dict:
    """A copy of holder without parameters[key], and without parameters when none is left."""
    parameters = holder.get("parameters")
    if not isinstance(parameters, dict) or key not in parameters:
        return dict(holder)
    copy = {k: v for k, v in holder.items() if k != "parameters"}
    rest = {k: v for k, v in parameters.items() if k != key}
    if rest:
        copy["parameters"] = rest
    return copy
