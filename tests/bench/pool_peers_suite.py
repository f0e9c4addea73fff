"""Peers suite: a pool of two Pods' worth of fronts and members on this
machine (two pool fronts, each with a tritonserver of its own), callers
spread over the two at random as a Service spreads them: Zipf-skewed
traffic (s = 1.1, four callers at once) over 48 python-backend models (16
quick), each member's budget holding a quarter of them. Two runs in one
process, on fresh members each: the fronts on their own (each loads what
its callers ask for, as a pool's replicas did before owners), then as
peers (kubeloop.front.peers: a model is loaded on its owner, the other
front sends its requests on). Reported for each: loads, hit rate, copies
(models held on both), the members' peak memory over their empty selves;
and, as peers, a loaded model's request sent on against one its owner
serves (p50 and p99, interleaved rounds of 200).

Local: both fronts and the caller share this process's event loop (on a
cluster each front is a Pod of its own), so a request sent on also pays
for the second front's work on the same loop and core."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path

import aiohttp
import numpy as np
from rich.console import Console

from kubeloop import processes
from kubeloop.front.memory import private_by_process
from kubeloop.front.peers import Peers, owner
from kubeloop.front.pool import Pool
from kubeloop.front.poolfront import PoolConfig, PooledFront, PoolMember
from kubeloop.front.router import listening
from tests.bench.pool_suite import BODY, CALLERS, _repository, _start, interleaved_ratios
from tests.bench.repeat import Figure

SPREAD_AT = 4
"""The operator's default spreadAt."""


def run(context, console: Console, quick: bool = False) -> dict:  # noqa: ANN001 - the bench context (unused)
    models, requests = (16, 160) if quick else (48, 480)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with console.status(f"peers: exporting {models} models"):
            repository = _repository(root, models)
        budget = _budget(root, repository, models)
        for mode in ("alone", "peers"):
            servers = {name: _start(root, repository, f"{mode}-{name}") for name in ("a", "b")}
            try:
                with console.status(f"peers: {requests} Zipf requests over {models} models, fronts {mode}"):
                    results[mode] = asyncio.run(_measure(root / mode, servers, models, requests, budget,
                                                         mode == "peers"))
            finally:
                for server, _member in servers.values():
                    processes.stop(server)
    results["budget_mib"] = round(budget, 1)
    _print(console, results, models, requests)
    return {mode: {k: v.to_json() if isinstance(v, Figure) else v for k, v in found.items()}
            if isinstance(found, dict) else found for mode, found in results.items()}


def _budget(root: Path, repository: Path, models: int) -> float:
    """A member's budget for a quarter of the models: the first model (with
    the backend's libraries) and the rest at the size a second one measures."""
    server, member = _start(root, repository, "sizing")

    async def measure() -> tuple[float, float]:
        pool = Pool({"m": member}, {"m": 1e9}, lambda _n: private_by_process(server.pid))
        try:
            for model in ("model-0", "model-1"):
                async with pool.serving(model):
                    pass
            return pool.sizes["model-0"], pool.sizes["model-1"]
        finally:
            await pool.close()
    try:
        first, size = asyncio.run(measure())
    finally:
        processes.stop(server)
    return first + size * (models / 4 - 1)


async def _measure(folder: Path, servers: dict, models: int, requests: int, budget: float, peered: bool) -> dict:
    routes = folder / "routes"
    routes.mkdir(parents=True)
    for i in range(models):
        (routes / f"model-{i}.json").write_text(json.dumps({
            "service": f"bench/model-{i}", "model": f"model-{i}", "triton_model": f"model-{i}", "triton_url": "",
            "routes": [{"role": "primary", "version": "1", "percent": 100}]}))
    async with AsyncExitStack() as stack:
        fronts = await _fronts(stack, servers, routes, budget, peered)
        urls = list(fronts.values())
        bases = {name: _memory(server.pid) for name, (server, _) in servers.items()}
        peak = dict.fromkeys(bases, 0.0)
        weights = 1.0 / np.arange(1, models + 1) ** 1.1
        rng = np.random.default_rng(11)
        picks = rng.choice(models, size=requests, p=weights / weights.sum())
        sides = rng.integers(0, 2, size=requests)
        session = await stack.enter_async_context(aiohttp.ClientSession())
        for start in range(0, requests, CALLERS):
            batch = range(start, min(start + CALLERS, requests))
            await asyncio.gather(*(_infer(session, urls[sides[i]], f"model-{picks[i]}") for i in batch))
            for name in bases:
                peak[name] = max(peak[name], _memory(servers[name][0].pid) - bases[name])
        counters = [replace(front.pool.residency.counters) for front in fronts]
        held = [{m for member in front.pool.residency.members.values() for m in member.loaded} for front in fronts]
        found = {
            "loads": sum(c.loads for c in counters), "unloads": sum(c.unloads for c in counters),
            "spreads": sum(c.spreads for c in counters), "failed": sum(c.failed for c in counters),
            "hit_rate": round(sum(c.hits for c in counters) / sum(c.hits + c.loads for c in counters), 3),
            "held": len(held[0] | held[1]), "copies": len(held[0] & held[1]),
            "peak_over_base_mib": {k: round(v, 1) for k, v in peak.items()},
        }
        if peered:
            found["forwarded"] = sum(front.peers.forwarded for front in fronts)
            found.update(await _sent_on_rounds(session, fronts))
        return found


async def _fronts(stack: AsyncExitStack, servers: dict, routes: Path, budget: float,
                  peered: bool) -> dict[PooledFront, str]:
    fronts: dict[PooledFront, str] = {}
    for name, (server, member) in servers.items():
        config = PoolConfig(f"bench-{name}", {"m": PoolMember(member.http, member.grpc, server.pid, budget)}, routes,
                            spread_at=SPREAD_AT)
        front = PooledFront(config)
        await front.start()
        stack.push_async_callback(front.stop)
        url, _ = await stack.enter_async_context(listening(front.handle, "127.0.0.1", 0, None))
        fronts[front] = url
    if peered:
        addresses = [url.removeprefix("http://") for url in fronts.values()]

        async def resolver(host: str, port: int) -> list[str]:
            return addresses
        for front, url in fronts.items():
            front.peers = Peers("bench", int(url.rsplit(":", 1)[1]), "127.0.0.1", resolver)
            await front.peers.start()
    return fronts


async def _sent_on_rounds(session: aiohttp.ClientSession, fronts: dict[PooledFront, str]) -> dict:
    """model-0 (the most requested, loaded on its owner): 200 requests one at
    a time to its owner's front and to the other, alternating, per round."""
    by_address = {front.peers.me: url for front, url in fronts.items()}
    at_owner = by_address[owner("model-0", by_address)]
    elsewhere = next(url for url in by_address.values() if url != at_owner)
    ratios = await interleaved_ratios(lambda: _infer(session, elsewhere, "model-0"),
                                      lambda: _infer(session, at_owner, "model-0"))
    return {"sent_on_p50": Figure("loaded model p50, sent on / served by its owner", ratios["p50"], "x"),
            "sent_on_p99": Figure("loaded model p99, sent on / served by its owner", ratios["p99"], "x")}


async def _infer(session: aiohttp.ClientSession, url: str, model: str) -> float:
    started = time.perf_counter()
    async with session.post(f"{url}/v2/models/{model}/infer", json=BODY) as response:
        if response.status != 200:
            raise RuntimeError(f"{model} at {url}: {response.status} {await response.text()}")
        await response.read()
    return time.perf_counter() - started


def _memory(pid: int) -> float:
    return sum(private_by_process(pid).values())


def _print(console: Console, results: dict, models: int, requests: int) -> None:
    console.print(f"peers: two pool fronts, one member each ({results['budget_mib']} MiB: a quarter of the "
                  f"{models} models), {requests} Zipf requests spread over the fronts at random")
    for mode in ("alone", "peers"):
        r = results[mode]
        console.print(f"  {mode}: {r['loads']} loads, {r['unloads']} unloads, hit rate {r['hit_rate']}, "
                      f"{r['held']} models held, {r['copies']} on both, {r['spreads']} hot copies, "
                      f"{r['failed']} failed; members' peak over empty {r['peak_over_base_mib']} MiB")
    peers = results["peers"]
    console.print(f"  requests sent on: {peers['forwarded']}; a loaded model's request sent on against its owner: "
                  f"p50 {peers['sent_on_p50'].median:.2f}x (spread {peers['sent_on_p50'].spread:.0%}), "
                  f"p99 {peers['sent_on_p99'].median:.2f}x (spread {peers['sent_on_p99'].spread:.0%})")
