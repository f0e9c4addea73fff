"""A pool's Pods as one pool (kubeloop.front.peers): a front sends a request
for a model its members do not hold to the model's owner among its peers,
serves a request a peer sent on itself, and serves a request itself when
the owner cannot be reached.
A hot model's owner tells the front that sent it a request, which loads a
copy and serves the model itself once it is loaded.
Unit: two pool fronts on this machine over HTTP, their peers given by a
resolver of the test's; no Triton (a model's load fails; the request
counters of the front that served it count it), or a stand-in answering
Triton's load and inference routes where a model must be loaded.
Through the headless Service of real pool Pods: tests/e2e/test_real_node.py
(cluster path)."""

from __future__ import annotations

import asyncio
import json
import os
from contextlib import AsyncExitStack

import grpc
import orjson
import requests
from tritonclient.grpc import service_pb2, service_pb2_grpc

from kubeloop.front.httpserver import Request, Response, json_response
from kubeloop.front.peers import FORWARDED, Peers, owner
from kubeloop.front.poolfront import PoolConfig, PooledFront, PoolMember
from kubeloop.front.router import listening
from kubeloop.front.upstream import Upstreams
from kubeloop.processes import free_port
from tests.unit.test_pool_front import routes


def test_a_models_owner_is_the_same_for_every_front_and_moves_only_with_the_peer_that_goes():
    peers = ["10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"]
    models = [f"team.model-{i}" for i in range(300)]
    owners = {m: owner(m, peers) for m in models}
    assert owners == {m: owner(m, list(reversed(peers))) for m in models}, "the order a resolver gives is no matter"
    assert all(300 / 3 * 0.7 < list(owners.values()).count(p) < 300 / 3 * 1.3 for p in peers), "spread evenly"
    left = {m: owner(m, peers[:2]) for m in models}
    moved = {m for m in models if left[m] != owners[m]}
    assert moved == {m for m in models if owners[m] == peers[2]}, "only the gone peer's models move"


def served(front: PooledFront) -> float:
    """Inference requests the front's routers answered (whatever their code)."""
    return sum(s.value for metric in front.metrics.registry.collect()
               if metric.name == "kubeloop_inference_requests" for s in metric.samples if s.name.endswith("_total"))


async def infer(client: Upstreams, url: str, model: str, headers: bytes = b"") -> tuple[int, dict]:
    body = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]})
    answer = await client.call(b"POST", f"{url}/v2/models/{model}/infer", body,
                               b"content-type: application/json\r\n" + headers)
    return answer.status, json.loads(answer.body)


async def two_fronts(stack: AsyncExitStack, config: PoolConfig, resolved: list[str]) -> list[tuple[PooledFront, str]]:
    """Two pool fronts listening, each with the other and itself as its peers."""
    async def resolver(host: str, port: int) -> list[str]:
        return list(resolved)

    fronts = []
    for _ in range(2):
        front = PooledFront(config)
        await front.start()
        stack.push_async_callback(front.stop)
        url, _ = await stack.enter_async_context(listening(front.handle, "127.0.0.1", 0, None))
        front.peers = Peers("peers.test", int(url.rsplit(":", 1)[1]), "127.0.0.1", resolver)
        fronts.append((front, url))
    resolved[:] = [f.peers.me for f, _ in fronts]
    for front, _ in fronts:
        await front.peers.start()
    return fronts


def test_a_front_sends_a_request_on_to_its_models_owner_and_serves_it_where_the_owner_is_gone(tmp_path):
    folder = tmp_path / "routes"
    folder.mkdir()
    nowhere = free_port()
    member = PoolMember(f"http://127.0.0.1:{nowhere}", f"127.0.0.1:{nowhere}", os.getpid(), 100.0)  # loads fail
    resolved: list[str] = []

    async def scenario(client: Upstreams) -> None:
        async with AsyncExitStack() as stack:
            (a, a_url), (b, b_url) = await two_fronts(stack, PoolConfig("shared", {"m": member}, folder), resolved)
            assert a.peers.peers == b.peers.peers == {a.peers.me, b.peers.me}
            # A model of b's, asked of a: b serves it (its load fails: no Triton), a sends it on.
            model = next(m for m in (f"ml.s{i}" for i in range(50)) if owner(m, resolved) == b.peers.me)
            routes(folder, model, "churn")
            await a.sync()
            await b.sync()
            status, body = await infer(client, a_url, model)
            assert status == 503 and "model server unavailable" in body["error"], body
            assert (served(a), served(b)) == (0, 1) and (a.peers.forwarded, b.peers.forwarded) == (1, 0)
            # Its readiness is its owner's: unready after the load that failed there.
            ready = await client.call(b"GET", f"{a_url}/v2/models/{model}/ready", b"", b"")
            assert ready.status == 503 and a.peers.forwarded == 2, ready.body
            # Asked of its owner, it stays there; a request a peer sent on is served where it arrives.
            await infer(client, b_url, model)
            assert (served(a), served(b)) == (0, 2) and b.peers.forwarded == 0
            await infer(client, a_url, model, FORWARDED + b": 1\r\n")
            assert (served(a), served(b)) == (1, 2) and a.peers.forwarded == 2
            # The owner gone (its address still listed): a serves the request itself and leaves it out.
            gone = f"127.0.0.1:{free_port()}"
            resolved[:] = [a.peers.me, gone]
            await a.peers.refresh()
            lost = next(m for m in (f"ml.t{i}" for i in range(50)) if owner(m, resolved) == gone)
            routes(folder, lost, "fraud")
            await a.sync()
            status, body = await infer(client, a_url, lost)
            assert status == 503 and served(a) == 2, body
            assert a.peers.unreachable == 1 and a.peers.peers == {a.peers.me}
            metrics = {s.name: s.value for metric in a.metrics.registry.collect()
                       if metric.name.startswith("kubeloop_pool_peer") for s in metric.samples}
            assert metrics == {"kubeloop_pool_peer_forwarded_total": 2.0, "kubeloop_pool_peer_unreachable_total": 1.0}

    run(scenario)


async def stand_in_triton(request: Request) -> Response:
    """Triton's inference routes, as far as a pool front calls them."""
    parts = request.path.strip("/").split("/")
    if parts[-1] == "infer":
        return json_response({"model_name": parts[2], "outputs": [
            {"name": "y", "datatype": "FP32", "shape": [1, 1], "data": [0.5]}]})
    if parts[-1] == "ready":
        return Response(404)  # asked after an unload: gone
    return json_response({})


def test_a_models_owner_finding_it_busy_gets_a_copy_loaded_by_the_front_that_sent_it_on(tmp_path):
    folder = tmp_path / "routes"
    folder.mkdir()
    resolved: list[str] = []

    async def scenario(client: Upstreams) -> None:
        async with AsyncExitStack() as stack:
            triton, _ = await stack.enter_async_context(listening(stand_in_triton, "127.0.0.1", 0, None))
            member = PoolMember(triton, await stand_in_repository(stack), os.getpid(), 1000.0)
            config = PoolConfig("shared", {"m": member}, folder, spread_at=2)
            (a, a_url), (b, _) = await two_fronts(stack, config, resolved)
            model = next(m for m in (f"ml.h{i}" for i in range(50)) if owner(m, resolved) == b.peers.me)
            routes(folder, model, "churn")
            await a.sync()
            await b.sync()
            assert (await infer(client, a_url, model))[0] == 200
            assert b.pool.has_loaded(model) and not a.pool.residency.held(model), "loaded on its owner only"
            # The model's metadata (a client's HEAD too) is its owner's to answer: a loads no copy for it.
            answer = await client.call(b"GET", f"{a_url}/v2/models/{model}", b"", b"")
            assert (answer.status, answer.body) == (200, b"{}"), answer
            head = await asyncio.to_thread(requests.head, f"{a_url}/v2/models/{model}", timeout=10)
            assert (head.status_code, head.content) == (200, b""), head
            assert a.peers.forwarded == 3 and not a.pool.residency.held(model), "a metadata call loads no copy"
            # Two requests under way on b's only member holding it: busy.
            b.pool.residency.members["m"].in_use[model] = 2
            assert (await infer(client, a_url, model))[0] == 200
            for _ in range(100):
                if a.pool.has_loaded(model):
                    break
                await asyncio.sleep(0.05)
            assert a.pool.has_loaded(model), "the front that sent the busy model on loads a copy"
            assert a.pool.residency.counters.spreads == 1 and served(a) == 0
            assert (await infer(client, a_url, model))[0] == 200
            assert served(a) == 1 and a.peers.forwarded == 4, "served where its copy is loaded"

    run(scenario)


class StandInRepository(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Triton's repository API over gRPC, as far as a pool calls it: every
    load succeeds, and the index lists nothing (an unloaded model is gone)."""

    async def RepositoryModelLoad(self, request, context):  # noqa: ANN001, ANN201, N802 - gRPC's names
        return service_pb2.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request, context):  # noqa: ANN001, ANN201, N802
        return service_pb2.RepositoryModelUnloadResponse()

    async def RepositoryIndex(self, request, context):  # noqa: ANN001, ANN201, N802
        return service_pb2.RepositoryIndexResponse()


async def stand_in_repository(stack: AsyncExitStack) -> str:
    """The address of a StandInRepository serving until the stack closes."""
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(StandInRepository(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    stack.push_async_callback(server.stop, None)
    return f"127.0.0.1:{port}"


def run(scenario) -> None:  # noqa: ANN001 - an async function of a client
    client = Upstreams()

    async def with_client() -> None:
        try:
            await scenario(client)
        finally:
            client.close()
    asyncio.run(with_client())
