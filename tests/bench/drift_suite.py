"""Drift suite: Evidently's DataDriftPreset on 100k and 1M logged rows x 20
features. The drift job evaluates a uniform sample of each side (50k rows);
the baseline is a full run on every row, in the same process. Reported: the
time of each, the ratio, and whether the two agree on the verdict and on
which features drifted, for windows without, with slight and with strong
drift. Reading the request log (JSON lines) is timed too: at 1M rows it is
part of the job's cost. The timings are repeated (five runs, full and
sampled alternating, on the strong-drift window; five reads of each log)
and printed with median and spread; the verdicts come from one run per window."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from kubeloop.monitoring.drift import evaluate, load_requests
from kubeloop.monitoring.job import DriftJob
from tests.bench.repeat import Figure, figures, figures_table, repeat

FEATURES = [f"f{i:02d}" for i in range(20)]
THRESHOLD = 0.3
REFERENCE_ROWS = 200_000
SCENARIOS = {
    # name: (features that move, how far in standard deviations)
    "no drift": (0, 0.0),
    "slight (4 features, 0.08 sd)": (4, 0.08),
    "strong (8 features, 0.5 sd)": (8, 0.5),
}


def _frame(rows: int, moved: int, shift: float, seed: int) -> pd.DataFrame:
    """Mixed shapes like the fraud features: normal, skewed (amounts) and 0/1."""
    rng = np.random.default_rng(seed)
    columns = {}
    for i, name in enumerate(FEATURES):
        delta = shift if i < moved else 0.0
        if i % 4 == 3:
            columns[name] = (rng.random(rows) < 0.3 + delta * 0.2).astype(np.float64)
        elif i % 4 == 2:
            columns[name] = rng.lognormal(3.5 + delta * 0.6, 0.6, rows)
        else:
            columns[name] = rng.normal(delta, 1.0, rows)
    return pd.DataFrame(columns)


def _write_log(frame: pd.DataFrame, folder: Path, batch: int = 8) -> None:
    """The router's request log format: one JSON line per request."""
    folder.mkdir(parents=True, exist_ok=True)
    values = frame.to_numpy().round(5).tolist()
    now = time.time()
    with open(folder / "requests-0.jsonl", "w") as log:
        for i in range(0, len(values), batch):
            log.write(json.dumps({"ts": now, "role": "primary", "version": "1", "features": values[i:i + batch]}) + "\n")


def _agreement(full, sampled) -> float:
    flagged = set(full.features_drifted), set(sampled.features_drifted)
    return 1 - len(flagged[0] ^ flagged[1]) / len(FEATURES)


def run(context, console: Console, quick: bool = False) -> dict:
    sizes = [20_000, 100_000] if quick else [100_000, 1_000_000]
    sample = DriftJob.__dataclass_fields__["sample_rows"].default
    reference = _frame(REFERENCE_ROWS, 0, 0.0, seed=1)
    rows = []
    for size in sizes:
        for name, (moved, shift) in SCENARIOS.items():
            current = _frame(size, moved, shift, seed=2 + size)
            with console.status(f"drift: {size:,} rows, {name}: full Evidently run"):
                full = evaluate(reference, current, FEATURES, THRESHOLD)
            with console.status(f"drift: {size:,} rows, {name}: sampled ({sample:,} rows per side)"):
                sampled = evaluate(reference, current, FEATURES, THRESHOLD, sample_rows=sample)
            rows.append({"rows": size, "scenario": name, "full_s": full.seconds, "sampled_s": sampled.seconds,
                         "full_over_sampled": round(full.seconds / sampled.seconds, 2),
                         "full_share": round(full.share, 3), "sampled_share": round(sampled.share, 3),
                         "verdict_agrees": full.drifted == sampled.drifted,
                         "feature_agreement": round(_agreement(full, sampled), 3)})
    timings: list[Figure] = []
    for size in sizes:
        current = _frame(size, *SCENARIOS["strong (8 features, 0.5 sd)"], seed=2 + size)
        with console.status(f"drift: {size:,} rows, strong window: full and sampled alternating"):
            runs = repeat(lambda _, current=current: _paired(reference, current, sample))
        timings += [Figure(f"{size:,} rows {f.name}", f.values, f.unit)
                    for f in figures(runs, {"full s": "s", "sampled s": "s", "full / sampled": "x"})]
    reading = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            folder = Path(tmp) / str(size)
            _write_log(_frame(size, 0, 0.0, seed=3), folder)
            with console.status(f"drift: reading a {size:,}-row request log, repeatedly"):
                read = Figure(f"read {size:,}-row log", repeat(lambda _, f=folder, n=size: _read(f, n)), "s")
            timings.append(read)
            reading[size] = round(read.median, 2)
    table = Table(title=f"Drift evaluation, 20 features, reference {REFERENCE_ROWS:,} rows, threshold {THRESHOLD} "
                        f"(sampled: {sample:,} rows per side; one run per window, repeated timings below)")
    for column in ("logged rows", "window", "full s", "sampled s", "full / sampled", "share full / sampled",
                   "verdict agrees", "features agree"):
        table.add_column(column)
    for r in rows:
        table.add_row(f"{r['rows']:,}", r["scenario"], f"{r['full_s']:.2f}", f"{r['sampled_s']:.2f}",
                      f"{r['full_over_sampled']}x", f"{r['full_share']} / {r['sampled_share']}",
                      "yes" if r["verdict_agrees"] else "NO", f"{r['feature_agreement']:.0%}")
    console.print(table)
    console.print(figures_table("drift: repeated timings", timings))
    return {"evaluations": rows, "read_log_seconds": {str(k): v for k, v in reading.items()},
            "repeated": {f.name: f.to_json() for f in timings}}


def _paired(reference: pd.DataFrame, current: pd.DataFrame, sample: int) -> dict:
    full = evaluate(reference, current, FEATURES, THRESHOLD).seconds
    sampled = evaluate(reference, current, FEATURES, THRESHOLD, sample_rows=sample).seconds
    return {"full s": full, "sampled s": sampled, "full / sampled": full / sampled}


def _read(folder: Path, size: int) -> float:
    started = time.perf_counter()
    loaded = load_requests(folder, 0, FEATURES)
    took = time.perf_counter() - started
    assert len(loaded) == size
    return took
