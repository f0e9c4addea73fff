"""A pool of two real tritonservers (the local serving runtime, explicit
model control) serving more models than their budgets hold
(kubeloop.front.pool): every request is answered by its own model, each
member's measured memory stays within its budget, and loads and unloads
are counted; a hot model is copied onto a second member and its requests
spread over both. Local backend's runtime; no control plane, no router
(the pool's front is proven in tests/e2e/test_serving_pools.py)."""

from __future__ import annotations

import asyncio
import logging
import shutil
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator

import aiohttp
import numpy as np
import psutil
import pytest
import torch
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from kubeloop import processes
from kubeloop.api.signature import ModelSignature
from kubeloop.components.model import Architecture, build_model, export_onnx
from kubeloop.components.triton import write_repository
from kubeloop.front.memory import private_by_process
from kubeloop.front.modelcontrol import LoadError, Member
from kubeloop.front.pool import Pool
from kubeloop.serving.repository import write_config, write_model_py
from kubeloop.serving.runtime import TritonRuntime
from tests.support.waiting import wait_for

N_INPUTS = 4
MODELS = 8
BROKEN = "two-versions"
"""A model of two versions, the second of which Triton cannot load."""
SIGNATURE = ModelSignature(feature_columns=[f"f{i}" for i in range(N_INPUTS)], threshold=0.5)
ROWS = np.random.default_rng(3).normal(0, 1, (3, N_INPUTS)).astype(np.float32)


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pool") / "repository"


@pytest.fixture(scope="module")
def members(repository):
    """Two tritonservers over one repository of MODELS models, none
    loaded; each model a different small network (its answer names it)."""
    root, expected = repository.parent, {}
    for seed in range(MODELS):
        torch.manual_seed(seed)
        model = build_model(Architecture("binary", N_INPUTS, 1, parameters={"hidden_units": [8], "dropout": 0.0}))
        write_repository(repository, f"model-{seed}", export_onnx(model.eval(), root / f"{seed}.onnx"), SIGNATURE,
                         None, "python")
        write_model_py(repository / f"model-{seed}" / "1")  # as the serving repository holds it
        with torch.no_grad():
            expected[f"model-{seed}"] = model(torch.from_numpy(ROWS)).numpy().ravel()
    _with_a_version_that_cannot_load(repository, "model-0", BROKEN)
    servers = {}
    try:
        for name in ("a", "b"):
            servers[name] = _start_member(repository, name)
        yield servers, expected
    finally:
        for server, _ in servers.values():
            processes.stop(server)


def _start_member(repository: Path, name: str):  # noqa: ANN202 - the server's process and its addresses
    runtime, ports = TritonRuntime.discover(), [processes.free_port() for _ in range(3)]
    server = processes.start(f"triton-{name}", runtime.argv(repository, *ports), repository.parent / name,
                             env=runtime.env())
    url = f"http://127.0.0.1:{ports[0]}"
    wait_for(lambda: _answers(f"{url}/v2/health/live"), timeout=120, what=f"tritonserver {name} live")
    return server, Member(url, f"127.0.0.1:{ports[1]}")


def test_a_pool_serves_more_models_than_it_holds_within_its_measured_budget(members):
    servers, expected = members
    memory = {name: (lambda record=server: private_by_process(record.pid)) for name, (server, _) in servers.items()}
    asyncio.run(_probe_and_serve(servers, expected, memory))


async def _probe_and_serve(servers, expected, memory) -> None:  # noqa: ANN001
    # Two loads measured alone set the budget: the first also loads the
    # backend's libraries, the second is what a model adds. Room for about
    # two models a member, four of the eight in the pool.
    probe = Pool({"a": servers["a"][1]}, {"a": 1e9}, lambda _name: memory["a"]())
    for model in ("model-0", "model-1"):
        async with probe.serving(model):
            pass
    first, size = probe.sizes["model-0"], probe.sizes["model-1"]
    assert first > size > 1, f"loads grew the member by {first:.1f} and {size:.1f} MiB"
    await probe._unload("a", ["model-0", "model-1"])
    await probe.close()
    # A budget is over what a member used at the pool's start, holding no model.
    used = {name: (lambda read=read: sum(read().values())) for name, read in memory.items()}
    empty = {name: measure() for name, measure in used.items()}
    budget = first + 1.5 * size
    pool = Pool({name: member for name, (_, member) in servers.items()}, dict.fromkeys(servers, budget),
                lambda name: memory[name](), estimate_mib=size)
    rng = np.random.default_rng(5)
    order = [f"model-{i}" for i in rng.integers(0, MODELS, 16)] + [f"model-{i}" for i in range(MODELS)]
    async with aiohttp.ClientSession() as session:
        for start in range(0, len(order), 4):  # four callers at once
            wave = order[start:start + 4]
            answers = await asyncio.gather(*(_infer(pool, session, model) for model in wave))
            for model, answer in zip(wave, answers, strict=True):
                assert np.allclose(answer, expected[model], atol=1e-4), f"{model} answered as another model"
            for name in servers:
                grown = used[name]() - empty[name]
                assert grown <= budget, f"member {name} grew {grown:.0f} MiB, budget {budget:.0f}"
                held = pool.residency.members[name].loaded
                assert sorted(await pool._ready(name, [f"model-{i}" for i in range(MODELS)])) == sorted(held)
                assert sum(held.values()) <= budget
    counters = pool.residency.counters
    held = sum(len(member.loaded) for member in pool.residency.members.values())
    assert counters.loads >= MODELS and counters.failed == 0 and counters.unloads == counters.loads - held
    assert held <= 4 and counters.unloads >= MODELS - 4
    assert counters.loads + counters.hits == len(order)
    assert len(pool.cold_seconds) == counters.loads
    await pool.close()


def test_a_hot_model_is_copied_onto_the_other_member_and_its_requests_spread_over_both(members):
    servers, expected = members
    memory = {name: (lambda record=server: private_by_process(record.pid)) for name, (server, _) in servers.items()}
    asyncio.run(_spread(servers, expected, memory))


async def _spread(servers, expected, memory) -> None:  # noqa: ANN001
    urls = {name: member.http for name, (_, member) in servers.items()}
    pool = Pool({name: member for name, (_, member) in servers.items()}, dict.fromkeys(servers, 1e9),
                lambda name: memory[name](), spread_at=2)
    models = [f"model-{i}" for i in range(MODELS)]
    for name in servers:  # what the test before left loaded
        await pool._unload(name, await pool._ready(name, models))
    async with aiohttp.ClientSession() as session:
        await _infer(pool, session, "model-5")
        (holder,) = [name for name, member in pool.residency.members.items() if "model-5" in member.loaded]
        for _ in range(2):  # eight callers at once: the model is hot from the second
            answers = await asyncio.gather(*(_infer(pool, session, "model-5") for _ in range(8)))
            assert all(np.allclose(answer, expected["model-5"], atol=1e-4) for answer in answers)
            await asyncio.gather(*pool.copies)
        for name in servers:
            assert await pool._ready(name, ["model-5"]) == ["model-5"], f"{name} does not hold a copy"
        assert pool.residency.counters.spreads == 1 and pool.residency.counters.failed == 0
        seen = []
        answers = await asyncio.gather(*(_infer(pool, session, "model-5", seen) for _ in range(8)))
        assert all(np.allclose(answer, expected["model-5"], atol=1e-4) for answer in answers)
        assert set(seen) == set(urls.values()), f"all of them went to {seen[0]}, {holder} holding it first"
    await pool.close()


def test_a_load_does_not_hold_up_the_members_requests_to_its_other_models(members):
    """While the pool loads models on a member, callers of a model the member
    holds keep being answered, each on its own kept-alive connection. Loads
    through Triton's HTTP repository API held five of six such connections
    for the whole load (1.4 s a python-backend model); the pool loads over gRPC."""
    servers, expected = members
    asyncio.run(_answered_during_loads(servers["a"][1], expected))


async def _answered_during_loads(member: Member, expected: dict) -> None:
    pool = Pool({"a": member}, {"a": 1e9}, lambda _name: {})
    loading, callers = asyncio.Event(), 6
    answered_meanwhile = [0] * callers
    try:
        await pool._unload("a", await pool._ready("a", [f"model-{i}" for i in range(MODELS)]))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=callers)) as session:
            await _infer(pool, session, "model-1")

            async def call(caller: int) -> None:
                while not stop.is_set():
                    during = loading.is_set()
                    answer = await _infer(pool, session, "model-1")
                    assert np.allclose(answer, expected["model-1"], atol=1e-4)
                    answered_meanwhile[caller] += during and loading.is_set()

            stop = asyncio.Event()
            calling = [asyncio.create_task(call(i)) for i in range(callers)]
            await asyncio.sleep(0.2)
            for model in ("model-2", "model-3"):
                loading.set()
                async with pool.serving(model):
                    loading.clear()
            stop.set()
            await asyncio.gather(*calling)
        assert pool.residency.counters.loads >= 3
        assert all(answered_meanwhile), f"callers answered while the member loaded: {answered_meanwhile}"
    finally:
        await pool.close()


def test_measured_models_load_side_by_side_and_a_first_load_alone(members, repository):
    """Models whose first load was measured load together on one member
    (Triton lists several LOADING at once); a model's first load has its
    member to itself, so its measured size is its own: no other model is
    LOADING while it is. A member of its own, none of its loads measured
    yet."""
    _, expected = members
    server, member = _start_member(repository, "c")
    pool = Pool({"a": member}, {"a": 1e9}, lambda _name: private_by_process(server.pid))
    measured, together = ["model-1", "model-2", "model-3"], ["model-4", "model-5"]

    async def scenario() -> list[set[str]]:
        async with pool_closed(pool), aiohttp.ClientSession() as session:
            for model in measured:  # first loads, one after another
                await _infer(pool, session, model)
            for model in measured:  # as a member unloads to make room: the sizes stay
                pool.residency.forget(model)
            await pool._unload("a", measured)
            seen: list[set[str]] = []
            watching = asyncio.create_task(_loading_states(pool, seen))
            try:
                # Two measured models, then two first loads, then the third measured one.
                answers = await asyncio.gather(*(_infer(pool, session, m) for m in [*measured[:2], *together, measured[2]]))
            finally:
                watching.cancel()
            for model, answer in zip([*measured[:2], *together, measured[2]], answers, strict=True):
                assert np.allclose(answer, expected[model], atol=1e-4), f"{model} answered as another model"
            return seen

    try:
        seen = asyncio.run(scenario())
    finally:
        processes.stop(server)
    assert max(map(len, seen)) > 1, f"measured models loaded one at a time ({len(seen)} readings)"
    for first in together:
        beside = [loading for loading in seen if first in loading and loading != {first}]
        assert not beside, f"{first} loaded beside others: {beside[:3]}"
        assert 0.5 < pool.sizes[first] / pool.sizes["model-2"] < 2, pool.sizes


@asynccontextmanager
async def pool_closed(pool: Pool) -> AsyncIterator[Pool]:
    try:
        yield pool
    finally:
        await pool.close()


async def _loading_states(pool: Pool, seen: list[set[str]]) -> None:
    """The models Triton lists LOADING on member a, each time it is asked."""
    while True:
        seen.append({e["name"] for e in await pool.repository.index("a") if e.get("state") == "LOADING"})
        await asyncio.sleep(0.01)


def test_a_held_models_reload_with_nothing_changed_loads_nothing_again(members):
    """A pool reloads a held model for its service's new routes; where they
    name the same versions its repository is unchanged, and Triton keeps
    what it holds: the same python stub, no second one meanwhile. (The
    stub's __pycache__, written into the version's folder at the first load,
    made Triton load it all again once: 1.4 s and a second stub.)"""
    servers, expected = members
    server, member = servers["b"]

    async def scenario() -> None:
        pool = Pool({"b": member}, {"b": 1e9}, lambda _name: {})
        try:
            async with aiohttp.ClientSession() as session:
                await pool._unload("b", await pool._ready("b", [f"model-{i}" for i in range(MODELS)]))
                await _infer(pool, session, "model-6")
                stubs = _stubs(server.pid)
                assert stubs, "no python stub found for the loaded model"
                await pool.reload("model-6")
                assert _stubs(server.pid) == stubs, "the reload started another stub"
                assert np.allclose(await _infer(pool, session, "model-6"), expected["model-6"], atol=1e-4)
        finally:
            await pool.close()

    asyncio.run(scenario())


def test_an_unload_of_one_of_two_stubs_ends_when_its_stub_has_gone(members, caplog):
    """A member holding two python-backend models unloads one: the unload
    is over once that model's own stub has exited, though the survivor's
    private memory rises as the pages the two shared become its own (the
    member's memory falls by less than the model measured, and the pool
    waited SETTLE_SECONDS for a fall that never came, then warned)."""
    servers, _ = members
    server, member = servers["b"]

    async def scenario() -> tuple[set[int], set[int]]:
        pool = Pool({"b": member}, {"b": 1e9}, lambda _name: private_by_process(server.pid))
        async with pool_closed(pool), aiohttp.ClientSession() as session:
            await pool._unload("b", await pool._ready("b", [f"model-{i}" for i in range(MODELS)]))
            await _infer(pool, session, "model-6")
            kept = _stubs(server.pid)
            await _infer(pool, session, "model-7")
            gone = _stubs(server.pid) - kept
            pool.residency.forget("model-7")
            await pool._unload("b", ["model-7"])
            return gone, _stubs(server.pid)

    with caplog.at_level(logging.WARNING, logger="kubeloop.pool"):
        gone, left = asyncio.run(scenario())
    assert gone and not gone & left, f"model-7's stub {gone} still runs: {left}"
    assert not caplog.records, caplog.text


def _stubs(pid: int) -> set[int]:
    return {p.pid for p in psutil.Process(pid).children(recursive=True) if "python_backend_stub" in p.name()}


def _with_a_version_that_cannot_load(repository: Path, source: str, name: str) -> None:
    """name: source's version 1, and beside it a version 2 whose ONNX file
    is garbage, which the model's config does not serve yet (offer() does)."""
    shutil.copytree(repository / source, repository / name)
    shutil.copytree(repository / name / "1", repository / name / "2")
    for onnx in (repository / name / "2").rglob("*.onnx"):
        onnx.write_bytes(b"not a model")
    offer(repository, name, ["1"])


def offer(repository: Path, name: str, versions: list[str]) -> None:
    config = text_format.Parse((repository / name / "config.pbtxt").read_text(), mc.ModelConfig())
    config.name = name
    write_config(repository, config, versions)


def test_a_version_that_cannot_load_is_named_and_the_others_serve(members, repository):
    """Triton loads a model's versions all or none. A pool that reads the
    repository loads a model offered a version 2 that cannot load with
    its other versions, on a held model's reload and on a cold load alike:
    version 1 answers and the pool says version 2 is why (its service's
    canary is rolled back, the primary stays ready). A pool without the
    repository fails the cold load whole."""
    servers, _ = members

    async def scenario() -> None:
        pool = Pool({"a": servers["a"][1]}, {"a": 1e9}, lambda _name: {}, repository=repository)
        blind = Pool({"a": servers["a"][1]}, {"a": 1e9}, lambda _name: {})
        try:
            async with aiohttp.ClientSession() as session:
                await _infer(pool, session, BROKEN)
                offer(repository, BROKEN, ["1", "2"])
                await pool.reload(BROKEN)
                _version_2_named(pool)
                assert pool.has_loaded(BROKEN)
                await _infer(pool, session, BROKEN)  # version 1 answers
                await pool.forget(BROKEN)
                await _infer(pool, session, BROKEN)  # a cold load: version 1 alone
                _version_2_named(pool)
                assert await pool._ready("a", [BROKEN]) == [BROKEN] and pool.residency.held(BROKEN)
                await pool.forget(BROKEN)

                with pytest.raises(LoadError, match="version 2"):
                    async with blind.serving(BROKEN):
                        pass
                _version_2_named(blind)
                assert not blind.residency.held(BROKEN)
                # Read once the failed load has unloaded version 1 again ("unloaded"): still not a failure of it.
                for _ in range(200):
                    if {e.get("reason") for e in await blind.repository.index("a") if e.get("name") == BROKEN} >= {"unloaded"}:
                        break
                    await asyncio.sleep(0.05)
                else:
                    raise AssertionError("Triton never listed version 1 as unloaded after the failed load")
                await blind._failed("a", BROKEN, LoadError("the same load"))
                _version_2_named(blind)
        finally:
            await pool.close()
            await blind.close()
            offer(repository, BROKEN, ["1"])

    asyncio.run(scenario())


def _version_2_named(pool: Pool) -> None:
    assert "Protobuf parsing failed" in (pool.unready(BROKEN, "2") or ""), pool.failed_versions
    assert pool.unready(BROKEN, "1") is None, pool.failed_versions


async def _infer(pool: Pool, session: aiohttp.ClientSession, model: str, seen: list | None = None) -> np.ndarray:
    body = {"inputs": [{"name": "features", "shape": list(ROWS.shape), "datatype": "FP32", "data": ROWS.tolist()}]}
    async with pool.serving(model) as url:
        if seen is not None:
            seen.append(url)
        async with session.post(f"{url}/v2/models/{model}/infer", json=body) as response:
            assert response.status == 200, await response.text()
            (output,) = (await response.json())["outputs"]
    return np.asarray(output["data"], dtype=np.float32)


def _answers(url: str) -> bool:
    import requests

    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False
