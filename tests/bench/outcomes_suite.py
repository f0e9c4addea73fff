"""Outcomes suite: late labels joined to the request log, streamed.

A request log as the router writes it (binary task, one row per request,
20 features a row, files rotated at 64 MiB by the hour) of 10M predictions
over ten days, and 1M arrived labels (85% in time, 5% late, 5% duplicates,
5% for requests never logged). Timed: `join_labels(prediction_batches(log),
read_labels(labels))`, seconds, seconds per million predictions, the
process's peak RSS and the Arrow pool's peak, each run in a fresh process so
that the peaks are the join's. The baseline, in the same run, is the naive
way: pandas.read_json of the whole log then DataFrame.merge, at 1M
predictions (at 10M it would not fit), against the streamed join at that
size: the ratio is at equal size, and both must find the same matches.
Reading alone is compared too (pyarrow.json against orjson), as the module
docstring of kubeloop.monitoring.outcomes.join claims. --quick: 1M
predictions only. Needs no platform."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from rich.console import Console

from kubeloop.requestlog import LogLimits
from tests.bench.repeat import Figure, figures, figures_table, repeat

START = 1_767_225_600.0  # 2026-01-01T00:00:00Z
SPAN = 10 * 86400.0
MAX_DELAY = 7 * 86400.0
SIZES = {"full": 10_000_000, "baseline": 1_000_000}
SHARES = {"matched": 0.85, "late": 0.05, "duplicate": 0.05, "unmatched": 0.05}
"""What the labels are, a tenth as many as the predictions."""
ROOT = Path(__file__).resolve().parents[2]


def _keys(ids: np.ndarray) -> pa.Array:
    """Distinct request keys, as callers send them."""
    return pc.binary_join_element_wise("req-", pc.cast(pa.array(ids * 2_654_435_761 + 10**15), pa.string()), "")


def _ts(ids: np.ndarray, size: int) -> np.ndarray:
    return START + ids * (SPAN / size) + 0.000123


def _lines(ids: np.ndarray, size: int, rng: np.random.Generator, features: pa.Array) -> pa.Array:
    """The router's JSON lines (orjson's key order and number forms), built
    column-wise in C++: a Python loop would take minutes at 10M."""
    canary = rng.random(len(ids)) < 0.1
    outputs = rng.random(len(ids)).astype(np.float32).astype(np.float64)  # Triton's FP32, as a Python float
    parts = ['{"ts":', pc.cast(pa.array(_ts(ids, size)), pa.string()), ',"key":"', _keys(ids),
             '","role":"', pa.array(np.where(canary, "canary", "primary")),
             '","version":"', pa.array(np.where(canary, "4", "3")),
             '","features":', features.take(pa.array(rng.integers(0, len(features), len(ids)))),
             ',"outputs":[', pc.cast(pa.array(outputs), pa.string()), ']}\n']
    return pc.binary_join_element_wise(*parts, "")


def write_log(folder: Path, size: int, seed: int = 0) -> None:
    """`size` requests over SPAN, as the router's FolderStore lays them out:
    a file an hour, rotated at LogLimits().file_bytes."""
    rng = np.random.default_rng(seed)
    values = rng.normal(size=(4096, 20)).round(5)
    features = pa.array(["[[" + ",".join(map(repr, row)) + "]]" for row in values.tolist()])
    per_file = LogLimits().file_bytes // len(_lines(np.arange(1), size, rng, features)[0].as_py())
    folder.mkdir(parents=True, exist_ok=True)
    ids = np.arange(size)
    hours = (_ts(ids, size) - START) // 3600
    for hour in np.split(ids, np.flatnonzero(np.diff(hours)) + 1):
        stem = time.strftime("requests-%Y%m%d-%H", time.gmtime(_ts(hour[:1], size)[0]))
        for part, first in enumerate(range(0, len(hour), per_file)):
            lines = _lines(hour[first:first + per_file], size, rng, features)
            (folder / (f"{stem}.jsonl" if part == 0 else f"{stem}.{part}.jsonl")).write_bytes(_bytes(lines))


def _bytes(lines: pa.Array) -> bytes:
    """The concatenated values of a string array, as one buffer."""
    offsets = np.frombuffer(lines.buffers()[1], np.int32)[lines.offset:lines.offset + len(lines) + 1]
    return memoryview(lines.buffers()[2])[offsets[0]:offsets[-1]].tobytes()


def write_labels(path: Path, size: int, seed: int = 1) -> dict[str, int]:
    """A tenth as many labels as predictions, by SHARES; the counts expected."""
    rng = np.random.default_rng(seed)
    count = {reason: int(size // 10 * share) for reason, share in SHARES.items()}
    ids = rng.choice(size, count["matched"] + count["late"], replace=False)
    matched, late = ids[:count["matched"]], ids[count["matched"]:]
    delays = rng.uniform(60, MAX_DELAY - 86400, len(matched))
    twice = rng.choice(len(matched), count["duplicate"], replace=False)
    unlogged = size + np.arange(count["unmatched"])
    keys = np.concatenate([matched, matched[twice], late, unlogged])
    at = np.concatenate([_ts(matched, size) + delays, _ts(matched[twice], size) + delays[twice] + 3600,
                         _ts(late, size) + MAX_DELAY + rng.uniform(60, 2 * 86400, len(late)),
                         START + rng.uniform(0, SPAN, len(unlogged))])
    pq.write_table(pa.table({"request_id": _keys(keys), "label": rng.integers(0, 2, len(keys), dtype=np.int8),
                             "label_timestamp": pa.array((at * 1e6).astype(np.int64), pa.timestamp("us", "UTC"))}),
                   path)
    return count


# --- measured in a fresh process each, so that peak memory is the measured code's ---------------------------------


def measure(kind: str, log: str, labels: str) -> dict:
    """One timed run of `kind` (streamed, pandas, read arrow, read orjson)."""
    started = time.perf_counter()
    result = MEASURED[kind](Path(log), Path(labels))
    return {"seconds": time.perf_counter() - started, **result, "peak RSS": _peak_rss() / 2**20,
            "Arrow pool peak": pa.default_memory_pool().max_memory() / 2**20}


def _peak_rss() -> int:
    """Bytes: the kernel's high-water mark of this process since its exec
    (ru_maxrss would carry over the suite's own, from the fork)."""
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) * 1024


def _streamed(log: Path, labels: Path) -> dict:
    from kubeloop.monitoring.outcomes.join import join_labels, prediction_batches, read_labels

    result = join_labels(prediction_batches(log), read_labels(labels), now=START + SPAN)
    return {"predictions": result.predictions, "counts": result.counts, "joined": result.joined.num_rows,
            "pending": result.pending, "delays": result.delays}


def _pandas(log: Path, labels: Path) -> dict:
    """The naive way: every record in a DataFrame, then a merge."""
    import pandas as pd

    frame = pd.concat([pd.read_json(path, lines=True, dtype={"key": str}) for path in sorted(log.glob("*.jsonl"))],
                      ignore_index=True).explode("outputs")
    frame["row"] = frame.groupby(level=0).cumcount()
    truth = pd.read_parquet(labels).sort_values("label_timestamp", kind="stable")
    truth = truth.drop_duplicates("request_id").assign(row=0)
    truth["label_ts"] = truth["label_timestamp"].astype("int64") / 1e6
    merged = frame.merge(truth, left_on=["key", "row"], right_on=["request_id", "row"])
    delay = merged["label_ts"] - merged["ts"]
    matched = merged[(delay >= 0) & (delay <= MAX_DELAY)]
    return {"predictions": len(frame), "counts": {"matched": int(matched["key"].nunique())}, "joined": len(matched)}


def _read_arrow(log: Path, labels: Path) -> dict:
    from kubeloop.monitoring.outcomes.join import prediction_batches

    return {"predictions": sum(batch.num_rows for batch in prediction_batches(log))}


def _read_orjson(log: Path, labels: Path) -> dict:
    """The same columns through orjson and a Python loop (as requestlog reads)."""
    import orjson

    columns: dict[str, list] = {"ts": [], "key": [], "role": [], "version": [], "output": []}
    for path in sorted(log.glob("*.jsonl")):
        with open(path, "rb") as handle:
            for line in handle:
                record = orjson.loads(line)
                for output in record["outputs"]:
                    for name in ("ts", "key", "role", "version"):
                        columns[name].append(record[name])
                    columns["output"].append(output)
    return {"predictions": pa.table(columns).num_rows}


MEASURED = {"streamed": _streamed, "pandas": _pandas, "read arrow": _read_arrow, "read orjson": _read_orjson}


def _fresh(kind: str, log: Path, labels: Path) -> dict:
    code = f"import json; from tests.bench.outcomes_suite import measure; " \
           f"print(json.dumps(measure({kind!r}, {str(log)!r}, {str(labels)!r})))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


# --- the suite ----------------------------------------------------------------------------------------------------


def run(context, console: Console, quick: bool = False) -> dict:
    sizes = [SIZES["baseline"]] if quick else [SIZES["full"], SIZES["baseline"]]
    timings: list[Figure] = []
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="kubeloop-outcomes-") as tmp:
        data = {}
        for size in sizes:
            with console.status(f"outcomes: writing a {size:,}-prediction request log and its labels"):
                folder = Path(tmp) / str(size)
                write_log(folder / "log", size)
                data[size] = (folder / "log", folder / "labels.parquet", write_labels(folder / "labels.parquet", size))
        size = sizes[0]
        log, labels, expected = data[size]
        with console.status(f"outcomes: streamed join of {size:,} predictions, repeatedly"):
            runs = repeat(lambda _: _fresh("streamed", log, labels))
        _check(runs[0], expected, size)
        results[f"streamed {size:,}"] = runs[0]
        for run_ in runs:
            run_["s per 1M"] = run_["seconds"] / (size / 1e6)
        timings += _named(f"{size:,} streamed", figures(runs, {"seconds": "s", "s per 1M": "s", "peak RSS": "MiB",
                                                              "Arrow pool peak": "MiB"}))
        log, labels, _ = data[SIZES["baseline"]]
        with console.status("outcomes: pandas read_json + merge against the streamed join, alternating"):
            pairs = repeat(lambda _: _paired(log, labels))
        results["pandas 1,000,000"] = pairs[0]["pandas run"]
        timings += _named("1,000,000", figures(pairs, {"pandas s": "s", "streamed s": "s", "pandas / streamed": "x",
                                                       "pandas peak RSS": "MiB", "streamed peak RSS": "MiB"}))
        with console.status("outcomes: reading the log alone, pyarrow.json against orjson, alternating"):
            reads = repeat(lambda _: _reads(log, labels))
        timings += _named("1,000,000 read", figures(reads, {"arrow s": "s", "orjson s": "s", "orjson / arrow": "x",
                                                                 "arrow peak RSS": "MiB", "orjson peak RSS": "MiB"}))
    console.print(figures_table("outcomes: late labels joined to logged predictions (binary, 20 features a row; "
                                "each run a fresh process)", timings))
    console.print(f"labels of the {sizes[0]:,}-prediction join: {results[f'streamed {sizes[0]:,}']['counts']}")
    return {"runs": results, "repeated": {f.name: f.to_json() for f in timings}}


def _check(run_: dict, expected: dict[str, int], size: int) -> None:
    """A fast wrong answer is no result."""
    counts = run_["counts"]
    assert run_["predictions"] == size, run_
    assert all(counts[reason] == count for reason, count in expected.items()), (counts, expected)


def _named(prefix: str, found: list[Figure]) -> list[Figure]:
    return [Figure(f"{prefix} {f.name}", f.values, f.unit) for f in found]


def _paired(log: Path, labels: Path) -> dict:
    naive, streamed = _fresh("pandas", log, labels), _fresh("streamed", log, labels)
    assert naive["counts"]["matched"] == streamed["counts"]["matched"], (naive, streamed)
    assert naive["joined"] == streamed["joined"], (naive, streamed)
    return {"pandas s": naive["seconds"], "streamed s": streamed["seconds"],
            "pandas / streamed": naive["seconds"] / streamed["seconds"], "pandas peak RSS": naive["peak RSS"],
            "streamed peak RSS": streamed["peak RSS"], "pandas run": naive}


def _reads(log: Path, labels: Path) -> dict:
    arrow, slow = _fresh("read arrow", log, labels), _fresh("read orjson", log, labels)
    assert arrow["predictions"] == slow["predictions"]
    return {"arrow s": arrow["seconds"], "orjson s": slow["seconds"], "orjson / arrow": slow["seconds"] / arrow["seconds"],
            "arrow peak RSS": arrow["peak RSS"], "orjson peak RSS": slow["peak RSS"]}
