"""Online features suite: an entity request's retrieval through the serving
path (kubeloop.serving.features: Feast's get_online_features, the
missing/stale policy, the vector in training order) against Feast's own
get_online_features called directly, in the same process on the same store
(the example's fraud views, sqlite online store), 1 and 32 rows per
request; p50/p99 and their ratio, one run. Local: no platform needed."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from kubeloop.featurestore.generate import Scenario, default_start
from kubeloop.featurestore.store import StoreLocation, create_repository, materialize
from kubeloop.serving.features import FeatureSpec, OnlineStore

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
    with tempfile.TemporaryDirectory() as tmp:
        repo = create_repository(Path(tmp) / "repo", Scenario(start=default_start(21), days=21, seed=5))
        materialize(repo)
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

        results = {"iterations": iterations}
        for rows in (1, 32):
            batches = _requests(repo, rows, iterations)
            for call in (feast, serving_path):  # warm both
                _timed(call, batches[:50])
            # Interleaved in blocks, so load from elsewhere on the machine hits all alike.
            timings: dict[str, list[float]] = {"feast": [], "feast_to_dict": [], "serving_path": []}
            for start in range(0, iterations, 100):
                block = batches[start:start + 100]
                for name, call in (("feast", feast), ("feast_to_dict", feast_to_dict), ("serving_path", serving_path)):
                    with console.status(f"online features: {name}, {rows} rows"):
                        timings[name] += _timed(call, block)
            for name, values in timings.items():
                ms = np.array(values) * 1000
                results[f"{name}_{rows}"] = {"p50_ms": round(float(np.percentile(ms, 50)), 3),
                                             "p99_ms": round(float(np.percentile(ms, 99)), 3)}
            base, ours = results[f"feast_{rows}"], results[f"serving_path_{rows}"]
            results[f"ratio_p50_{rows}"] = round(ours["p50_ms"] / base["p50_ms"], 2)
            results[f"ratio_p99_{rows}"] = round(ours["p99_ms"] / base["p99_ms"], 2)
    table = Table(title=f"Online retrieval per request, sqlite online store ({iterations} requests each, in process)")
    for column in ("rows", "path", "p50 ms", "p99 ms", "p50 ratio", "p99 ratio"):
        table.add_column(column)
    for rows in (1, 32):
        for name, label in (("feast", "Feast get_online_features (baseline)"),
                            ("feast_to_dict", "Feast get_online_features + to_dict()"),
                            ("serving_path", "kubeloop serving path (retrieve, policy, assemble)")):
            r, b = results[f"{name}_{rows}"], results[f"feast_{rows}"]
            table.add_row(str(rows), label, str(r["p50_ms"]), str(r["p99_ms"]), f"{r['p50_ms'] / b['p50_ms']:.2f}x",
                          f"{r['p99_ms'] / b['p99_ms']:.2f}x")
    console.print(table)
    return results
