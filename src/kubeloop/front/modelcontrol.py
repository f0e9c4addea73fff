"""A pool's members' model repositories, through Triton's gRPC API: load
(with a config override), unload, and the index of every version's state.

Why gRPC while requests go over HTTP: Triton answers a repository call
over HTTP on the thread that serves HTTP requests, so a load held up the
member's requests to its other, loaded models until it was over (1.4 s for
a python-backend model: five of six kept-alive connections waited). Over
gRPC the same loads left them answering within 0.07 s.
"""

from __future__ import annotations

from typing import NamedTuple

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from kubeloop.front.upstream import UpstreamError

UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
"""A member that did not take the call (not listening, restarting, too slow): not the model's fault."""


class Member(NamedTuple):
    """A pool member's addresses."""

    http: str
    """Triton's HTTP URL, where requests go."""
    grpc: str
    """Triton's gRPC address (host:port), where its repository is controlled."""


class LoadError(RuntimeError):
    """Triton could not load (or unload) a model."""


class ModelControl:
    """members: name -> gRPC address; timeout: seconds a call may take (a
    load is answered once the model is ready or has failed)."""

    def __init__(self, members: dict[str, str], timeout: float):
        self.addresses = dict(members)
        self.timeout = timeout
        self.channels: dict[str, tuple[grpc.aio.Channel, service_pb2_grpc.GRPCInferenceServiceStub]] = {}
        """Opened on a member's first call: a channel belongs to the event loop it was opened on."""

    def _stub(self, member: str) -> service_pb2_grpc.GRPCInferenceServiceStub:
        if member not in self.channels:
            channel = grpc.aio.insecure_channel(self.addresses[member])
            self.channels[member] = channel, service_pb2_grpc.GRPCInferenceServiceStub(channel)
        return self.channels[member][1]

    async def load(self, member: str, model: str, config: str | None = None) -> None:
        """config: the model's config as JSON, in place of its config.pbtxt for this load."""
        parameters = {"config": service_pb2.ModelRepositoryParameter(string_param=config)} if config else {}
        await self._call(member, "load", model, self._stub(member).RepositoryModelLoad(
            service_pb2.RepositoryModelLoadRequest(model_name=model, parameters=parameters), timeout=self.timeout))

    async def unload(self, member: str, model: str) -> None:
        await self._call(member, "unload", model, self._stub(member).RepositoryModelUnload(
            service_pb2.RepositoryModelUnloadRequest(model_name=model), timeout=self.timeout))

    async def index(self, member: str) -> list[dict]:
        """Every model version the member knows: name, version, state (READY,
        UNAVAILABLE...) and, where it is not ready, Triton's reason."""
        answer = await self._call(member, "list", "its models", self._stub(member).RepositoryIndex(
            service_pb2.RepositoryIndexRequest(), timeout=self.timeout))
        return [{"name": m.name, "version": m.version, "state": m.state, "reason": m.reason} for m in answer.models]

    @staticmethod
    async def _call(member: str, action: str, model: str, call):  # noqa: ANN001, ANN205 - a gRPC call and its answer
        try:
            return await call
        except grpc.aio.AioRpcError as exc:
            if exc.code() in UNREACHABLE:
                raise UpstreamError(f"Triton ({member}) did not take the call to {action} {model}: "
                                    f"{exc.code().name} {exc.details()}") from exc
            raise LoadError(f"Triton ({member}) could not {action} {model}: {exc.details()}") from exc

    async def close(self) -> None:
        channels, self.channels = self.channels, {}
        for channel, _ in channels.values():
            await channel.close()
