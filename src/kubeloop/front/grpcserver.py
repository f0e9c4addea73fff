"""The front's KServe v2 gRPC service (Triton's GRPCInferenceService, as
NVIDIA's tritonclient.grpc and Triton's other gRPC callers speak it).

Each call is put to the router as the HTTP request that asks the same, so
a gRPC caller gets the routing, canary and shadow, entity requests, request
log and metrics an HTTP caller gets, from one implementation: a
ModelInferRequest becomes a request in the binary tensor data extension
(its raw_input_contents, or its typed contents packed the same way), with
every output asked for in binary; the answer's binary outputs become
raw_output_contents, as Triton's own gRPC answers carry them. The
metadata, config, statistics and health calls read the routes the HTTP
front serves. The request key, which keeps a caller on one version, is the
`x-request-key` metadata (else the request's id), as the HTTP header is.

What the front does not serve over HTTP it does not serve here either:
Triton's repository, shared-memory, trace and log calls are answered
UNIMPLEMENTED, naming the Triton to call instead.
"""

from __future__ import annotations

import asyncio
import math
from typing import Awaitable, Callable

import grpc
import orjson
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from kubeloop.front.encoding import REQUEST_HEADER, tensor_bytes
from kubeloop.front.features import RequestError
from kubeloop.front.httpserver import MAX_BODY, Request, Response

MAX_CALLS = 1024
"""Calls under way at once; gRPC refuses more with RESOURCE_EXHAUSTED."""
STATUS_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
                405: grpc.StatusCode.UNIMPLEMENTED, 408: grpc.StatusCode.DEADLINE_EXCEEDED,
                413: grpc.StatusCode.RESOURCE_EXHAUSTED, 422: grpc.StatusCode.FAILED_PRECONDITION,
                429: grpc.StatusCode.RESOURCE_EXHAUSTED, 502: grpc.StatusCode.UNAVAILABLE,
                503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED}
"""An HTTP status of the router's as the gRPC code Triton answers for the same trouble (else INTERNAL)."""
_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
             "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
             "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
             "FP64": "fp64_contents", "BYTES": "bytes_contents"}
"""A datatype -> the typed contents field that may carry it (FP16 and BF16 travel raw only)."""
_KEY = "x-request-key"

Handler = Callable[[Request], Awaitable[Response]]


def model_path(model: str, version: str, action: str = "") -> str:
    """The HTTP route of a model's (or one version's) action."""
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "")
    return f"{path}/{action}" if action else path


def parameters(found) -> dict:  # noqa: ANN001 - a protobuf map of InferParameter
    """gRPC parameters as the HTTP protocol's JSON object."""
    out = {}
    for name, parameter in found.items():
        kind = parameter.WhichOneof("parameter_choice")
        if kind is not None:
            out[name] = getattr(parameter, kind)
    return out


def set_parameters(target, values: dict) -> None:  # noqa: ANN001 - a protobuf map of InferParameter
    """The HTTP protocol's parameters into a gRPC message's map."""
    for name, value in values.items():
        if isinstance(value, bool):
            target[name].bool_param = value
        elif isinstance(value, int):
            target[name].int64_param = value
        elif isinstance(value, float):
            target[name].double_param = value
        else:
            target[name].string_param = str(value)


def http_infer(request: service_pb2.ModelInferRequest) -> Request:
    """The HTTP request (binary tensor data extension, binary outputs) that
    asks what a gRPC ModelInferRequest asks."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise RequestError(400, f"raw_input_contents holds {len(raw)} tensors for {len(request.inputs)} inputs: "
                                "give every input its raw contents, or none")
    inputs, blobs = [], []
    for i, tensor in enumerate(request.inputs):
        blob = raw[i] if raw else typed_bytes(tensor)
        inputs.append({"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape),
                       "parameters": {**parameters(tensor.parameters), "binary_data_size": len(blob)}})
        blobs.append(blob)
    header: dict = {"inputs": inputs}
    if request.id:
        header["id"] = request.id
    asked = parameters(request.parameters)
    if request.outputs:
        header["outputs"] = [{"name": o.name, "parameters": {**parameters(o.parameters), "binary_data": True}}
                             for o in request.outputs]
    else:
        asked["binary_data_output"] = True
    if asked:
        header["parameters"] = asked
    head = orjson.dumps(header)
    return Request("POST", model_path(request.model_name, request.model_version, "infer"),
                   {REQUEST_HEADER: str(len(head)).encode()}, head + b"".join(blobs))


def typed_bytes(tensor: service_pb2.ModelInferRequest.InferInputTensor) -> bytes:
    """A tensor's typed contents as the raw bytes Triton reads (row-major,
    little-endian; BYTES elements each length-prefixed)."""
    field = _CONTENTS.get(tensor.datatype)
    if field is None:
        raise RequestError(400, f"input {tensor.name}: datatype {tensor.datatype} has no typed contents; "
                                "send it in raw_input_contents")
    values = list(getattr(tensor.contents, field))
    count = math.prod(tensor.shape)
    if len(values) != count:
        raise RequestError(400, f"input {tensor.name}: contents.{field} holds {len(values)} values for shape "
                                f"{list(tensor.shape)} ({count})")
    return tensor_bytes(tensor.datatype, values)


def header_length(headers: bytes) -> int | None:
    """The Inference-Header-Content-Length among a Response's header lines."""
    for header in headers.split(b"\r\n"):
        name, _, value = header.partition(b":")
        if name.strip().lower() == REQUEST_HEADER:
            return int(value)
    return None


def infer_response(answer: Response) -> service_pb2.ModelInferResponse:
    """The router's 200 answer to http_infer's request as Triton's gRPC answer."""
    length = header_length(answer.headers)
    head = orjson.loads(answer.body if length is None else answer.body[:length])
    rest = b"" if length is None else answer.body[length:]
    response = service_pb2.ModelInferResponse(model_name=head.get("model_name", ""),
                                              model_version=head.get("model_version", ""), id=head.get("id", ""))
    set_parameters(response.parameters, head.get("parameters") or {})
    offset = 0
    for tensor in head.get("outputs", []):
        given = dict(tensor.get("parameters") or {})
        size = given.pop("binary_data_size", None)
        if size is None:
            blob = tensor_bytes(tensor["datatype"], tensor.get("data", []))
        else:
            blob, offset = rest[offset:offset + size], offset + size
        output = response.outputs.add(name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"])
        set_parameters(output.parameters, given)
        response.raw_output_contents.append(blob)
    return response


def refusal(answer: Response) -> tuple[grpc.StatusCode, str]:
    """The gRPC code and message of a router's non-200 answer."""
    try:
        message = str(orjson.loads(answer.body)["error"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        message = answer.body.decode("utf-8", "replace") or f"HTTP {answer.status}"
    return STATUS_CODES.get(answer.status, grpc.StatusCode.INTERNAL), message


class InferenceService(service_pb2_grpc.GRPCInferenceServiceServicer):
    """GRPCInferenceService over a router's HTTP handler."""

    def __init__(self, handle: Handler):
        self.handle = handle

    async def _call(self, request: Request, context: grpc.aio.ServicerContext) -> Response:
        key = dict(context.invocation_metadata() or ()).get(_KEY)
        if key:
            request.headers[_KEY.encode()] = key.encode("latin-1")
        answer = await self.handle(request)
        if answer.after is not None:  # the bookkeeping, once this call's answer is on its way
            asyncio.get_running_loop().call_soon(answer.after)
        return answer

    async def _get(self, path: str, context: grpc.aio.ServicerContext) -> dict:
        answer = await self._call(Request("GET", path, {}, b""), context)
        if answer.status != 200:
            await context.abort(*refusal(answer))
        return orjson.loads(answer.body)

    async def _status(self, path: str, context: grpc.aio.ServicerContext) -> bool:
        return (await self._call(Request("GET", path, {}, b""), context)).status == 200

    async def ServerLive(self, request, context):  # noqa: ANN001, ANN201, N802 - gRPC's names
        return service_pb2.ServerLiveResponse(live=await self._status("/v2/health/live", context))

    async def ServerReady(self, request, context):  # noqa: ANN001, ANN201, N802
        return service_pb2.ServerReadyResponse(ready=await self._status("/v2/health/ready", context))

    async def ModelReady(self, request, context):  # noqa: ANN001, ANN201, N802
        path = model_path(request.name, request.version, "ready")
        return service_pb2.ModelReadyResponse(ready=await self._status(path, context))

    async def ServerMetadata(self, request, context):  # noqa: ANN001, ANN201, N802
        return json_format.ParseDict(await self._get("/v2", context), service_pb2.ServerMetadataResponse(),
                                     ignore_unknown_fields=True)

    async def ModelMetadata(self, request, context):  # noqa: ANN001, ANN201, N802
        return json_format.ParseDict(await self._get(model_path(request.name, request.version), context),
                                     service_pb2.ModelMetadataResponse(), ignore_unknown_fields=True)

    async def ModelConfig(self, request, context):  # noqa: ANN001, ANN201, N802
        config = await self._get(model_path(request.name, request.version, "config"), context)
        return service_pb2.ModelConfigResponse(config=json_format.ParseDict(
            config, model_config_pb2.ModelConfig(), ignore_unknown_fields=True))

    async def ModelStatistics(self, request, context):  # noqa: ANN001, ANN201, N802
        return json_format.ParseDict(await self._get(model_path(request.name, request.version, "stats"), context),
                                     service_pb2.ModelStatisticsResponse(), ignore_unknown_fields=True)

    async def ModelInfer(self, request, context):  # noqa: ANN001, ANN201, N802
        answer = await self._infer(request, context)
        if answer.status != 200:
            await context.abort(*refusal(answer))
        return infer_response(answer)

    async def ModelStreamInfer(self, requests, context):  # noqa: ANN001, ANN201, N802
        """Each request's answer in turn; a refused one answers its error
        message in the stream, as Triton's does, and the stream goes on."""
        async for request in requests:
            answer = await self._infer(request, context)
            if answer.status == 200:
                yield service_pb2.ModelStreamInferResponse(infer_response=infer_response(answer))
            else:
                yield service_pb2.ModelStreamInferResponse(
                    error_message=refusal(answer)[1], infer_response=service_pb2.ModelInferResponse(id=request.id))

    async def _infer(self, request: service_pb2.ModelInferRequest, context: grpc.aio.ServicerContext) -> Response:
        try:
            return await self._call(http_infer(request), context)
        except RequestError as exc:
            return Response(exc.status, orjson.dumps({"error": str(exc)}))


def _not_served(method: str) -> Callable:
    async def refuse(self, request, context):  # noqa: ANN001, ANN202
        await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                            f"the serving front does not serve {method}: call the Triton of the version instead")
    return refuse


for _method in ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload", "SystemSharedMemoryStatus",
                "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister", "CudaSharedMemoryStatus",
                "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister", "TraceSetting", "LogSettings"):
    setattr(InferenceService, _method, _not_served(_method))


async def start(handle: Handler, host: str, port: int) -> tuple[grpc.aio.Server, int]:
    """The service on host:port (0: any free port) in this event loop; the server and its port."""
    server = grpc.aio.server(maximum_concurrent_rpcs=MAX_CALLS, options=[
        ("grpc.max_receive_message_length", MAX_BODY), ("grpc.max_send_message_length", MAX_BODY)])
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceService(handle), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if not bound:
        raise OSError(f"cannot serve gRPC on {host}:{port}")
    await server.start()
    return server, bound

