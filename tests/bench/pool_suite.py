"""Pool suite: many small models (1,000; 32 quick) on a pool of real
tritonservers (4 members; 2 quick) in explicit model-control mode (kubeloop.front.pool: loaded on first request,
least recently used unloaded when a member's measured budget would be
exceeded) against one Triton per model. Zipf-skewed traffic over the models
(s = 1.1, four callers at once); the members' budgets hold a quarter of
the models together. Reported: servers and memory against one Triton per model
(ratio; a dedicated Triton's memory measured with its one model loaded),
the hit rate of the skewed traffic, the cold loads' p50/p99, the members' peak memory against
their budgets, and a loaded model's request p99 through the pool against a
dedicated Triton (interleaved rounds), also while its member loads other
models (through Triton's gRPC repository API, as the pool loads, and
through its HTTP one, as it loaded before), and a burst of cold loads of
measured models on one member (each after an unload) against one such
load alone. Local: no platform, no operator;
requests go from the pool's placement straight to the member (the pool's
front adds its router, as a dedicated front does)."""

from __future__ import annotations

import asyncio
import itertools
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Awaitable, Callable

import aiohttp
import numpy as np
import torch
from rich.console import Console

from kubeloop import processes
from kubeloop.api.signature import ModelSignature
from kubeloop.components.model import Architecture, build_model, export_onnx
from kubeloop.components.triton import write_repository
from kubeloop.front.memory import private_by_process
from kubeloop.front.modelcontrol import Member
from kubeloop.front.pool import HEADROOM, Pool
from kubeloop.serving.runtime import TritonRuntime
from tests.bench.repeat import RUNS, Figure, figures_table
from tests.bench.serving_suite import wait_ready

N_INPUTS = 4
SIGNATURE = ModelSignature(feature_columns=[f"f{i}" for i in range(N_INPUTS)], threshold=0.5)
BODY = {"inputs": [{"name": "features", "shape": [1, N_INPUTS], "datatype": "FP32", "data": [[0.1, 0.2, 0.3, 0.4]]}]}
CALLERS = 4


def run(context, console: Console, quick: bool = False) -> dict:  # noqa: ANN001 - the bench context (unused)
    models, members, requests = (32, 2, 240) if quick else (1000, 4, 2400)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with console.status(f"pool: exporting {models} models"):
            repository = _repository(root, models)
        names = ["dedicated", *(f"m{i}" for i in range(members))]
        servers = {name: _start(root, repository, name) for name in names}
        try:
            results = asyncio.run(_measure(servers, models, requests, console))
        finally:
            for server, _url in servers.values():
                processes.stop(server)
    _print(console, results, models, requests)
    return {key: value.to_json() if isinstance(value, Figure) else value for key, value in results.items()}


def _repository(root: Path, models: int) -> Path:
    repository = root / "repository"
    for seed in range(models):
        torch.manual_seed(seed)
        model = build_model(Architecture("binary", N_INPUTS, 1, parameters={"hidden_units": [8], "dropout": 0.0}))
        write_repository(repository, f"model-{seed}", export_onnx(model.eval(), root / f"{seed}.onnx"), SIGNATURE,
                         None, "python")
    return repository


def _start(root: Path, repository: Path, name: str):  # noqa: ANN202 - the process and its addresses
    ports = [processes.free_port() for _ in range(3)]
    runtime = TritonRuntime.discover()
    server = processes.start(f"triton-{name}", runtime.argv(repository, *ports), root / name, env=runtime.env())
    url = f"http://127.0.0.1:{ports[0]}"
    wait_ready([f"{url}/v2/health/live"], server, timeout=120)
    return server, Member(url, f"127.0.0.1:{ports[1]}")


async def _measure(servers: dict, models: int, requests: int, console: Console) -> dict:
    memory = {name: (lambda record=server: private_by_process(record.pid)) for name, (server, _) in servers.items()}
    used = {name: (lambda read=read: sum(read().values())) for name, read in memory.items()}
    empty = used["dedicated"]()
    dedicated = Pool({"dedicated": servers["dedicated"][1]}, {"dedicated": 1e9}, lambda _n: memory["dedicated"]())
    async with dedicated.serving("model-0"):
        pass
    one_per_model = used["dedicated"]()  # a Triton serving one model: the server and the model
    async with dedicated.serving("model-1"):  # what a model adds beside another (the first loads the libraries)
        pass
    first, size = dedicated.sizes["model-0"], dedicated.sizes["model-1"]
    await dedicated._unload("dedicated", ["model-1"])
    members = [name for name in servers if name != "dedicated"]
    budget = first + size * (models / 4 / len(members) - 1)
    pool = Pool({name: servers[name][1] for name in members}, dict.fromkeys(members, budget),
                lambda name: memory[name](), estimate_mib=size)
    bases = {name: used[name]() for name in members}
    weights = 1.0 / np.arange(1, models + 1) ** 1.1
    picks = np.random.default_rng(11).choice(models, size=requests, p=weights / weights.sum())
    peak = dict.fromkeys(bases, 0.0)
    async with aiohttp.ClientSession() as session:
        with console.status(f"pool: {requests} Zipf requests over {models} models"):
            for start in range(0, requests, CALLERS):
                await asyncio.gather(*(_through_pool(pool, session, f"model-{i}") for i in picks[start:start + CALLERS]))
                for name in bases:
                    peak[name] = max(peak[name], used[name]() - bases[name])
        counters = replace(pool.residency.counters)
        with console.status("pool: a loaded model's requests, through the pool and to a dedicated Triton"):
            ratios = await _loaded_rounds(pool, session, servers["dedicated"][1].http)
        with console.status("pool: a loaded model's requests while its member loads others"):
            during = await _during_loads(pool, session, servers["dedicated"][1].http, models)
    cold = np.array(pool.cold_seconds) * 1000
    await pool.close()
    await dedicated.close()
    with console.status(f"pool: bursts of {BURST} cold loads on one member"):
        bursts = await _bursts(servers["dedicated"][1], memory["dedicated"], first, size)
    pool_memory = sum(bases.values()) + sum(peak.values())
    return {
        "model_mib": round(size, 1), "first_model_mib": round(first, 1), "dedicated_triton_mib": round(one_per_model, 1), "empty_triton_mib": round(empty, 1),
        "budget_mib": round(budget, 1), "peak_over_base_mib": {k: round(v, 1) for k, v in peak.items()},
        "members": len(members), "servers_ratio": len(members) / models, "memory_ratio": round(pool_memory / (models * one_per_model), 4),
        "hit_rate": round(counters.hits / (counters.hits + counters.loads), 3),
        "loads": counters.loads, "unloads": counters.unloads, "failed": counters.failed,
        "cold_p50_ms": round(float(np.percentile(cold, 50)), 1), "cold_p99_ms": round(float(np.percentile(cold, 99)), 1),
        "loaded_p99": Figure("loaded model p99, pool / dedicated Triton", ratios["p99"], "x"),
        "loaded_p50": Figure("loaded model p50, pool / dedicated Triton", ratios["p50"], "x"),
        "during_grpc_p99": Figure("loaded model p99 while its member loads others over gRPC (the pool), "
                                  "/ dedicated Triton", during["grpc"], "x"),
        "during_http_p99": Figure("same, loads over HTTP (before)", during["http"], "x"),
        "burst": Figure(f"{BURST} cold loads on one member at once (each after an unload), / one such load alone",
                        bursts, "x"),
    }


async def _through_pool(pool: Pool, session: aiohttp.ClientSession, model: str) -> float:
    started = time.perf_counter()
    async with pool.serving(model) as url:
        async with session.post(f"{url}/v2/models/{model}/infer", json=BODY) as response:
            if response.status != 200:
                raise RuntimeError(f"{model}: {response.status} {await response.text()}")
            await response.read()
    return time.perf_counter() - started


async def _direct(session: aiohttp.ClientSession, url: str, model: str) -> float:
    started = time.perf_counter()
    async with session.post(f"{url}/v2/models/{model}/infer", json=BODY) as response:
        await response.read()
    return time.perf_counter() - started


async def _loaded_rounds(pool: Pool, session: aiohttp.ClientSession, dedicated: str) -> dict[str, list[float]]:
    """model-0 (the most requested) is loaded on a pool member and on the
    dedicated Triton: 200 requests one at a time to each, alternating, per round."""
    return await interleaved_ratios(lambda: _through_pool(pool, session, "model-0"),
                                    lambda: _direct(session, dedicated, "model-0"))


LOADS_A_ROUND = 3


async def _during_loads(pool: Pool, session: aiohttp.ClientSession, dedicated: str,
                        models: int) -> dict[str, list[float]]:
    """p99 of model-0's requests through the pool (one at a time) while its
    member loads LOADS_A_ROUND idle models, over each API in turn, against
    the dedicated Triton's p99 in the same round (no loads). The loads are
    unloaded between turns, once their processes have gone."""
    member = next(name for name, m in pool.residency.members.items() if "model-0" in m.loaded)
    held = {m for member_ in pool.residency.members.values() for m in member_.loaded}
    idle = [f"model-{i}" for i in range(models - 1, 0, -1) if f"model-{i}" not in held][:LOADS_A_ROUND]
    url = pool.urls[member]

    async def over_http(model: str) -> None:
        async with session.post(f"{url}/v2/repository/models/{model}/load") as response:
            if response.status != 200:
                raise RuntimeError(f"load {model}: {response.status} {await response.text()}")

    async def over_grpc(model: str) -> None:
        await pool.repository.load(member, model)

    ratios: dict[str, list[float]] = {"grpc": [], "http": []}
    for _ in range(RUNS):
        direct = [await _direct(session, dedicated, "model-0") for _ in range(200)]
        for api, load in (("grpc", over_grpc), ("http", over_http)):
            seen = await _while(lambda: _through_pool(pool, session, "model-0"), _each(load, idle))
            await pool._unload(member, idle)
            ratios[api].append(float(np.percentile(seen, 99) / np.percentile(direct, 99)))
    return ratios


BURST = 4


async def _bursts(member: Member, memory: Callable[[], dict[int, float]], first: float, size: float) -> list[float]:
    """A member whose budget holds about 2 * BURST models, 4 * BURST models each
    measured once (a model's first load runs alone). Per round: a cold load
    of one model, then of BURST models at once, each making room by
    unloading another: the burst's time against the one's (1: the loads
    went wholly side by side; BURST: one after another)."""
    pool = Pool({"burst": member}, {"burst": (first + size * (2 * BURST - 1)) / (1 - HEADROOM)},
                lambda _name: memory(), estimate_mib=size)
    models = [f"model-{i}" for i in range(1, 4 * BURST + 1)]  # model-0 stays loaded there, for the rounds before

    async def served(*names: str) -> float:
        started = time.perf_counter()
        await asyncio.gather(*(_held_a_moment(pool, name) for name in names))
        return time.perf_counter() - started

    try:
        for name in models:
            await served(name)
        ratios, cycle = [], itertools.cycle(models)
        for _ in range(RUNS):
            one = await served(next(cycle))
            burst = await served(*(next(cycle) for _ in range(BURST)))
            ratios.append(burst / one)
        await pool._unload("burst", list(pool.residency.members["burst"].loaded))
    finally:
        await pool.close()
    return ratios


async def _held_a_moment(pool: Pool, model: str) -> None:
    async with pool.serving(model):
        pass


async def _each(work: Callable[[str], Awaitable[None]], models: list[str]) -> None:
    for model in models:
        await work(model)


async def _while(call: Callable[[], Awaitable[float]], work: Awaitable[None]) -> list[float]:
    """Each call's seconds, one call at a time, until the work is done."""
    task, seconds = asyncio.ensure_future(work), []
    try:
        while not task.done():
            seconds.append(await call())
        await task
    finally:
        task.cancel()
    return seconds


async def interleaved_ratios(measured: Callable[[], Awaitable[float]],
                             baseline: Callable[[], Awaitable[float]]) -> dict[str, list[float]]:
    """p50 and p99 of measured against baseline (each call's seconds), per
    round of 200 calls to each, alternating, for RUNS rounds."""
    ratios: dict[str, list[float]] = {"p50": [], "p99": []}
    for _ in range(RUNS):
        through, direct = [], []
        for _ in range(200):
            through.append(await measured())
            direct.append(await baseline())
        for q, key in ((50, "p50"), (99, "p99")):
            ratios[key].append(float(np.percentile(through, q) / np.percentile(direct, q)))
    return ratios


def _print(console: Console, results: dict, models: int, requests: int) -> None:
    console.print(f"pool: {models} models, {requests} Zipf requests, {results['members']} members with "
                  f"{results['budget_mib']} MiB each (a quarter of the models together: the first {results['first_model_mib']} MiB with the backend's "
                  f"libraries, then {results['model_mib']} MiB a model, measured on load)")
    console.print(f"  servers {results['members']} against {models} (ratio {results['servers_ratio']:.3f}); memory "
                  f"{results['memory_ratio']:.3f}x of one Triton per model ({results['dedicated_triton_mib']} MiB "
                  f"each, {results['empty_triton_mib']} MiB with no model)")
    console.print(f"  hit rate {results['hit_rate']}, {results['loads']} loads, {results['unloads']} unloads, "
                  f"{results['failed']} failed; cold load p50 {results['cold_p50_ms']} ms, p99 "
                  f"{results['cold_p99_ms']} ms; members' peak over their empty memory {results['peak_over_base_mib']}"
                  f" MiB (budget {results['budget_mib']})")
    console.print(figures_table("a loaded model's requests: pool / dedicated Triton",
                                [results["loaded_p50"], results["loaded_p99"], results["during_grpc_p99"],
                                 results["during_http_p99"], results["burst"]]))
