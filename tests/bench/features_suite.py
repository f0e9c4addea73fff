"""Online features suite: an entity request's retrieval through the serving
path (kubeloop.front.features: Feast's get_online_features, the
missing/stale policy, the vector in training order) against Feast's own
get_online_features called directly, in the same process on the same store
(the example's fraud views), 1 and 32 rows per request, with Feast's
sqlite online store and with Redis (Debian's redis-server on loopback);
p50/p99 and their ratio, one run, and a caller's first read after the
store opened against the p50 of those after it. Then the whole path: entity requests
against raw-vector requests through kubeloop's router and a real
tritonserver, concurrency 1 and 16, over rounds. Local: no platform needed."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from kubeloop import processes
from kubeloop.dev import onlinestore
from kubeloop.featurestore.generate import Scenario, default_start
from kubeloop.featurestore.store import StoreLocation, create_repository, materialize
from kubeloop.front.features import FeatureSpec, OnlineStore
from tests.bench.repeat import RUNS, Figure, figures_table
from tests.bench.serving_suite import load_round, round_medians, triton_serving, vector_bodies, wait_ready
from tests.support.models import N_FEATURES

VIEWS = ("card_activity", "merchant_risk", "card_profile", "transaction_context")
SENT = ["card_id", "merchant_id", "amount", "hour", "channel"]


def _requests(repo: Path, rows: int, count: int) -> list[dict[str, list]]:
    transactions = pd.read_parquet(repo / "data" / "transactions.parquet", columns=SENT)
    rng = np.random.default_rng(rows)
    picks = [transactions.iloc[rng.integers(0, len(transactions), rows)] for _ in range(count)]
    return [{c: p[c].tolist() for c in SENT} for p in picks]


def _timed(call, batches: list[dict]) -> list[float]:  # noqa: ANN001
    out = []
    for batch in batches:
        start = time.perf_counter()
        call(batch)
        out.append(time.perf_counter() - start)
    return out


def run(context, console: Console, quick: bool = False) -> dict:
    iterations = 200 if quick else 1000
    results: dict = {"iterations": iterations}
    with tempfile.TemporaryDirectory() as tmp, _redis(Path(tmp)) as redis_address:
        for store, address in (("sqlite", ""), ("redis", redis_address)):
            repo = create_repository(Path(tmp) / store, Scenario(start=default_start(21), days=21, seed=5),
                                     redis_address=address)
            materialize(repo)
            results[store] = _measure(repo, store, iterations, console)
        _print(console, results, iterations)
        repeated = _end_to_end(Path(tmp), Path(tmp) / "sqlite", results, console, quick)
    _print_end_to_end(console, results, repeated)
    results["repeated"] = {f.name: f.to_json() for f in repeated}
    return results


def _end_to_end(root: Path, repo: Path, results: dict, console: Console, quick: bool) -> list[Figure]:
    """Batch-1 requests through kubeloop's router to a real tritonserver:
    entity requests (card, merchant, amount, hour, channel; the router reads
    the rest from the sqlite online store) against raw-vector requests to the
    same router, alternating over rounds at concurrency 1 and 16. The bench
    model takes N_FEATURES inputs, so the route assembles the first
    N_FEATURES of the fraud views' columns: the latency of the whole path,
    not the fraud model's answers."""
    seconds = 0.6 if quick else 1.6
    probe = OnlineStore(FeatureSpec(StoreLocation(path=str(repo)).to_json(), VIEWS, (), (), ()))
    columns = tuple(f for v in probe.views for f in v.features)[:N_FEATURES]
    spec = FeatureSpec(StoreLocation(path=str(repo)).to_json(), VIEWS, ("card_id", "merchant_id"),
                       ("amount", "hour", "channel"), columns)
    figures: list[Figure] = []
    (root / "triton").mkdir()
    with triton_serving(root / "triton") as (base, x, _plan, _grpc):
        router, url = _start_router(root, base, spec)
        try:
            types = {"amount": "FP64", "channel": "BYTES"}
            bodies = {
                "entities": [json.dumps({"inputs": [{"name": c, "shape": [1], "datatype": types.get(c, "INT64"),
                                                     "data": batch[c]} for c in SENT]})
                             for batch in _requests(repo, 1, 512)],
                "vector": vector_bodies(x),
            }
            for concurrency in (1, 16):
                with console.status(f"online features: entity and raw requests at concurrency {concurrency}"):
                    rounds = [load_round({name: (url, b) for name, b in bodies.items()}, concurrency, seconds, r)
                              for r in range(RUNS)]
                for name in bodies:
                    results[f"end_to_end_{name}_c{concurrency}"] = round_medians(rounds, name, 3)
                figures += [Figure(f"{key} c{concurrency}", [r["entities"][key] / r["vector"][key] for r in rounds],
                                   "x") for key in ("requests_per_s", "p50_ms", "p99_ms")]
        finally:
            processes.stop(router)
    return figures


def _start_router(root: Path, triton: str, spec: FeatureSpec):  # noqa: ANN202
    config = root / "router.json"
    config.write_text(json.dumps({
        "service": "bench/features", "model": "tuned", "triton_model": "tuned", "triton_url": triton,
        "routes": [{"role": "primary", "version": "1", "percent": 100}], "request_log": None,
        "sample_rate": 1.0, "task": "binary", "output": "probability",
        "features": {"1": spec.to_dict()}, "missing": "default"}))
    port = processes.free_port()
    router = processes.start("router", [sys.executable, "-m", "kubeloop.front.router", "--config", str(config),
                                        "--port", str(port)], root / "logs")
    url = f"http://127.0.0.1:{port}"
    wait_ready([f"{url}/v2/health/ready"], router, timeout=120)
    return router, f"{url}/v2/models/tuned/infer"


@contextmanager
def _redis(root: Path) -> Iterator[str]:
    """Debian's redis-server on loopback, as the local platform starts it."""
    port = processes.free_port()
    server = processes.start("redis", onlinestore.build_redis_argv(onlinestore.redis_binary(), port, root),
                             root / "logs")
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not onlinestore.answering(address):
            if time.monotonic() > deadline or not server.running():
                raise RuntimeError(f"redis-server did not answer:\n{processes.log_tail(server.log)}")
            time.sleep(0.05)
        yield address
    finally:
        processes.stop(server)


def _measure(repo: Path, store_name: str, iterations: int, console: Console) -> dict:
    probe = OnlineStore(FeatureSpec(StoreLocation(path=str(repo)).to_json(), VIEWS, (), (), ()))
    columns = tuple(f for v in probe.views for f in v.features)
    spec = FeatureSpec(StoreLocation(path=str(repo)).to_json(), VIEWS, ("card_id", "merchant_id"),
                       ("amount", "hour", "channel"), columns)
    online = OnlineStore(spec)
    store, refs = online.store, online.refs
    now = time.time()

    def feast(batch: dict) -> None:
        store.get_online_features(features=refs, entity_rows=batch)

    def feast_to_dict(batch: dict) -> None:
        store.get_online_features(features=refs, entity_rows=batch).to_dict()

    def serving_path(batch: dict) -> None:
        online.assemble(batch, now, "default")

    results = {}
    for rows in (1, 32):
        batches = _requests(repo, rows, iterations)
        if rows == 1:  # a caller's first read after the store opened (it read placeholders when it opened)
            results["first_read_ms"] = round(_timed(serving_path, batches[:1])[0] * 1000, 3)
        for call in (feast, serving_path):  # warm both
            _timed(call, batches[:50])
        # Interleaved in blocks, so load from elsewhere on the machine hits all alike.
        timings: dict[str, list[float]] = {"feast": [], "feast_to_dict": [], "serving_path": []}
        for start in range(0, iterations, 100):
            block = batches[start:start + 100]
            for name, call in (("feast", feast), ("feast_to_dict", feast_to_dict), ("serving_path", serving_path)):
                with console.status(f"online features ({store_name}): {name}, {rows} rows"):
                    timings[name] += _timed(call, block)
        for name, values in timings.items():
            ms = np.array(values) * 1000
            results[f"{name}_{rows}"] = {"p50_ms": round(float(np.percentile(ms, 50)), 3),
                                         "p99_ms": round(float(np.percentile(ms, 99)), 3)}
        base, ours = results[f"feast_{rows}"], results[f"serving_path_{rows}"]
        results[f"ratio_p50_{rows}"] = round(ours["p50_ms"] / base["p50_ms"], 2)
        results[f"ratio_p99_{rows}"] = round(ours["p99_ms"] / base["p99_ms"], 2)
    return results


def _print(console: Console, results: dict, iterations: int) -> None:
    table = Table(title=f"Online retrieval per request ({iterations} requests each, in process)")
    for column in ("store", "rows", "path", "p50 ms", "p99 ms", "p50 ratio", "p99 ratio"):
        table.add_column(column)
    for store in ("sqlite", "redis"):
        for rows in (1, 32):
            for name, label in (("feast", "Feast get_online_features (baseline)"),
                                ("feast_to_dict", "Feast get_online_features + to_dict()"),
                                ("serving_path", "kubeloop serving path (retrieve, policy, assemble)")):
                r, b = results[store][f"{name}_{rows}"], results[store][f"feast_{rows}"]
                table.add_row(store, str(rows), label, str(r["p50_ms"]), str(r["p99_ms"]),
                              f"{r['p50_ms'] / b['p50_ms']:.2f}x", f"{r['p99_ms'] / b['p99_ms']:.2f}x")
    console.print(table)
    for store in ("sqlite", "redis"):
        first, steady = results[store]["first_read_ms"], results[store]["serving_path_1"]["p50_ms"]
        console.print(f"{store}: a caller's first one-row read after the store opened took {first} ms, "
                      f"{first / steady:.2f}x the p50 of those after it")


def _print_end_to_end(console: Console, results: dict, repeated: list[Figure]) -> None:
    table = Table(title="Through router and Triton, batch-1 requests (median over the rounds)")
    for column in ("request", "concurrency", "requests/s", "p50 ms", "p99 ms"):
        table.add_column(column)
    for concurrency in (1, 16):
        for name, label in (("vector", "raw feature vector"), ("entities", "entities (sqlite online store)")):
            r = results[f"end_to_end_{name}_c{concurrency}"]
            table.add_row(label, str(concurrency), f"{r['requests_per_s']:.0f}", str(r["p50_ms"]), str(r["p99_ms"]))
    console.print(table)
    console.print(figures_table("entity request / raw-vector request through router and Triton, each figure over "
                                "the rounds", repeated))
