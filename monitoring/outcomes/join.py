"""Late ground truth joined to logged predictions, streamed.

Labels arrive hours or days after the request they judge, as Parquet rows
holding the request key the caller sent (see kubeloop.requestlog). They are
few next to the predictions (a label set fits in memory; a month of request
log does not), so the labels are read whole and the request log is streamed
past them one record batch at a time: memory is the labels, one batch, and
the joined rows.

The library is pyarrow (already in the image through Feast; no new
dependency). Its JSON reader parses the log with an explicit schema, so the
heavy `features` field is skipped without being built, straight into Arrow
columns and with the GIL released, so that files parse on every core at
once. A record costs it about the CPU time it costs orjson (the parser still
scans the features): the gain is the second core and no Python objects
(tests/bench/outcomes_suite.py, 1M router records on 2 cores: 1.2-1.5x
faster than orjson and a Python loop while the second core is free, on par
while other work holds it; peak memory 306 MiB against 535). Acero's hash join
matches a batch of a million predictions against a million labels on key
and row together in 0.3-0.6 s; dictionary encoding (pc.index_in, one
column) was no faster, a Python dict of keys twice as slow, pandas' Index
slower still.

Every label read is counted by exactly one reason (JoinResult.counts):
- invalid: it has no key, no label or no timestamp;
- duplicate: a later label for a key and row already labelled (the
  earliest-arriving label is the one kept; ties: the first read);
- matched: some logged prediction of that key and row was made at most
  max_delay_seconds before the label became known;
- late: it was predicted, but every such prediction is older than that;
- unmatched: no logged prediction fits although the key would have been
  logged, either none at all (lost, or outside the predictions read) or
  only predictions made AFTER the label became known: a label cannot judge
  a prediction made later, which is a reused key, not its prediction;
- not_sampled: no logged prediction, and the log's sampling (by the key's
  hash) would not have kept the key.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypeVar

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import pyarrow.parquet as pq

from kubeloop.requestlog import ObjectStore, sampled

SPEC_FIELDS = {"key_column": "keyColumn", "label_column": "labelColumn", "timestamp_column": "timestampColumn",
               "row_column": "rowColumn"}
"""LabelSpec's fields as the user wrote them, under spec.monitoring.groundTruth."""
BATCH_ROWS = 1_000_000
"""Predictions per joined batch: each join hashes the labels afresh, so
batches much smaller than the labels would rehash them often."""
MAX_WORKERS = 4
"""Files parsed at once, at most: each holds a file (64 MiB, rotated) in memory."""
BLOCK_BYTES = 4 << 20
"""The JSON reader's unit of parsing."""
RECORD = [("ts", pa.float64()), ("key", pa.string()), ("role", pa.string()), ("version", pa.string())]
SCALAR_LOG = pa.schema([*RECORD, ("outputs", pa.list_(pa.float64()))])
MULTICLASS_LOG = pa.schema([*RECORD, ("outputs", pa.list_(pa.list_(pa.float64())))])
T, R = TypeVar("T"), TypeVar("R")
PREDICTIONS = pa.schema([("key", pa.string()), ("row", pa.int32()), ("version", pa.string()),
                         ("role", pa.string()), ("ts", pa.float64()), ("output", pa.float64())])
"""A prediction batch (output: list<double> for multiclass)."""


@dataclass(frozen=True)
class LabelSpec:
    """Where a label's parts are in the user's Parquet (GroundTruth's fields)."""

    key_column: str = "request_id"
    label_column: str = "label"
    timestamp_column: str = "label_timestamp"
    """When the label became known: epoch seconds, or a timestamp or date type."""
    row_column: str = "row"
    """Which row of a multi-row request the label judges; without the column, row 0."""
    max_delay_seconds: float = 7 * 86400
    sample_rate: float = 1.0
    """The request log's sample rate: tells labels of unsampled keys from lost ones."""


@dataclass(frozen=True)
class JoinResult:
    """What became of the labels, and what the predictions read hold."""

    joined: pa.Table
    """One row per label and (version, role) that predicted its key and row:
    key, row, version, role, ts, output, label, label_ts."""
    counts: dict[str, int]
    """Labels by reason (every reason, zeros included; they sum to the labels read)."""
    predictions: int
    """Prediction rows read."""
    delays: dict[str, float | None]
    """p50, p90 and max seconds from prediction to label, over matched labels."""
    pending: int
    """Predictions without a label whose max delay has not passed yet."""


# --- labels -------------------------------------------------------------------------------------------------------


def read_labels(location: str | Path, spec: LabelSpec = LabelSpec(), since: float = 0.0) -> pa.Table:
    """Parquet labels (a file, a folder searched recursively, or an s3://
    prefix) as columns key (string), row (int32), label (as stored) and
    label_ts (float64 epoch seconds); labels that became known before
    `since` are left out."""
    tables = [_normalise(table, name, spec) for name, table in _parquet(str(location), spec)]
    if not tables:
        return pa.table({"key": pa.array([], pa.string()), "row": pa.array([], pa.int32()),
                         "label": pa.array([], pa.null()), "label_ts": pa.array([], pa.float64())})
    labels = pa.concat_tables(tables, promote_options="permissive")
    return labels.filter(pc.or_kleene(pc.greater_equal(labels["label_ts"], since), pc.is_null(labels["label_ts"])))


def _parquet(location: str, spec: LabelSpec) -> Iterator[tuple[str, pa.Table]]:
    """(name, the spec's columns) of each Parquet file at the location."""
    if location.startswith("s3://"):
        store = ObjectStore(location)
        folder = f"{store.prefix}/" * bool(store.prefix)
        for key in _s3_keys(store, store.prefix):
            if key == store.prefix or key.startswith(folder) and key.endswith(".parquet"):
                body = store.client.get_object(Bucket=store.bucket, Key=key)["Body"].read()
                name = f"s3://{store.bucket}/{key}"
                yield name, _columns(pq.ParquetFile(pa.BufferReader(body)), name, spec)
        return
    path = Path(location)
    if not path.exists():
        raise FileNotFoundError(f"no labels at {location}")
    for file in [path] if path.is_file() else sorted(path.rglob("*.parquet")):
        yield str(file), _columns(pq.ParquetFile(file), str(file), spec)


def _columns(file: pq.ParquetFile, name: str, spec: LabelSpec) -> pa.Table:
    names = file.schema_arrow.names
    for spec_field in ("key_column", "label_column", "timestamp_column"):
        column = getattr(spec, spec_field)
        if column not in names:
            raise ValueError(f"labels at {name} have no column {column!r} "
                             f"(spec.monitoring.groundTruth.{SPEC_FIELDS[spec_field]}); columns are: {', '.join(names)}")
    wanted = [spec.key_column, spec.label_column, spec.timestamp_column]
    return file.read(columns=wanted + [spec.row_column] * (spec.row_column in names))


def _normalise(table: pa.Table, name: str, spec: LabelSpec) -> pa.Table:
    rows = table[spec.row_column] if spec.row_column in table.column_names else pa.nulls(table.num_rows)
    return pa.table({"key": pc.cast(table[spec.key_column], pa.string()),
                     "row": pc.fill_null(pc.cast(rows, pa.int32()), 0),
                     "label": table[spec.label_column],
                     "label_ts": _epoch_seconds(table[spec.timestamp_column], name, spec)})


def _epoch_seconds(column: pa.ChunkedArray, name: str, spec: LabelSpec) -> pa.ChunkedArray:
    kind = column.type
    if pa.types.is_date(kind):
        column, kind = pc.cast(column, pa.timestamp("s")), pa.timestamp("s")
    if pa.types.is_timestamp(kind):
        per_second = {"s": 1, "ms": 1e3, "us": 1e6, "ns": 1e9}[kind.unit]
        return pc.divide(pc.cast(pc.cast(column, pa.int64()), pa.float64()), per_second)
    try:
        return pc.cast(column, pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ValueError(f"labels at {name}: column {spec.timestamp_column!r} "
                         f"(spec.monitoring.groundTruth.timestampColumn) is {kind}, neither epoch seconds "
                         f"nor a timestamp") from exc


# --- predictions --------------------------------------------------------------------------------------------------


def prediction_batches(location: str | Path, since: float = 0.0, until: float | None = None,
                       batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """The request log (a folder or an s3:// prefix) as record batches of
    about batch_rows predictions, one per row of a request: key, row
    (int32), version, role, ts (float64), output (float64, or list<double>
    of class probabilities). Records made before `since` or from `until` on,
    and records without a key (written before keys were logged), are left
    out; a last line still being written is left for the next read. Files
    are parsed whole, a few at once (MAX_WORKERS): memory is a few files of
    the log (rotated at 64 MiB) and a batch."""
    gathered, rows = [], 0
    read = partial(_predictions, since=since, until=until)
    for batch in itertools.chain.from_iterable(_in_parallel(read, _log_files(str(location), since))):
        gathered.append(batch)
        rows += batch.num_rows
        if rows >= batch_rows:
            yield pa.concat_batches(gathered)
            gathered, rows = [], 0
    if rows:
        yield pa.concat_batches(gathered)


def _in_parallel(work: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
    """work(item) for each item, in order, on every core, a few items ahead
    at most. Each file is parsed by one thread: pyarrow's JSON reader
    releases the GIL, but its own threads did not overlap (measured: wall
    time equal to CPU time), two files at once did."""
    workers = min(pa.cpu_count(), MAX_WORKERS)
    with ThreadPoolExecutor(workers) as pool:
        running: deque = deque()
        for item in items:
            running.append(pool.submit(work, item))
            if len(running) > workers:
                yield running.popleft().result()
        while running:
            yield running.popleft().result()


def _log_files(location: str, since: float) -> Iterator[Callable[[], bytes]]:
    """A reader of each file of the request log that may hold records since `since`."""
    if location.startswith("s3://"):
        store = ObjectStore(location)
        folder = f"{store.prefix}/" * bool(store.prefix)
        # Keys sort by the hour written (see ObjectStore): skip the older hours.
        start = folder + time.strftime("dt=%Y-%m-%d/hour=%H/", time.gmtime(since)) if since > 0 else None
        for key in _s3_keys(store, folder, start):
            if key.endswith(".jsonl"):
                yield partial(_object, store, key)
        return
    for path in sorted(Path(location).glob("*.jsonl")):
        try:
            if path.stat().st_mtime >= since:  # one last written before the window holds none of it
                yield partial(_file, path)
        except FileNotFoundError:  # expired by the writer meanwhile
            continue


def _file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:  # expired by the writer since it was listed
        return b""


def _object(store: ObjectStore, key: str) -> bytes:
    return store.client.get_object(Bucket=store.bucket, Key=key)["Body"].read()


def _s3_keys(store: ObjectStore, prefix: str, start_after: str | None = None) -> Iterator[str]:
    listing = {"Bucket": store.bucket, "Prefix": prefix} | ({"StartAfter": start_after} if start_after else {})
    for page in store.client.get_paginator("list_objects_v2").paginate(**listing):
        yield from (item["Key"] for item in page.get("Contents", []))


def _predictions(read: Callable[[], bytes], since: float, until: float | None) -> list[pa.RecordBatch]:
    """The predictions of one file's complete JSON lines. The parser skips
    `features` and `request` without building them."""
    data = read()
    end = data.rfind(b"\n") + 1
    if not end:
        return []
    outputs = orjson.loads(data[:data.find(b"\n")]).get("outputs") or [0.0]
    schema = MULTICLASS_LOG if isinstance(outputs[0], list) else SCALAR_LOG
    records = pj.open_json(pa.BufferReader(pa.py_buffer(data)[:end]),
                           read_options=pj.ReadOptions(use_threads=False, block_size=BLOCK_BYTES),
                           parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"))
    return [_explode(_window(batch, since, until)) for batch in records]


def _window(records: pa.RecordBatch, since: float, until: float | None) -> pa.RecordBatch:
    ts = records["ts"]
    keep = pc.and_kleene(pc.greater_equal(ts, since), pc.is_valid(records["key"]))
    if until is not None:
        keep = pc.and_kleene(keep, pc.less(ts, until))
    return records.filter(keep)


def _explode(records: pa.RecordBatch) -> pa.RecordBatch:
    """One row per output: a request's rows are numbered from 0."""
    outputs = records["outputs"]
    parents = pc.list_parent_indices(outputs)
    offsets = outputs.offsets.to_numpy()
    parent_rows = parents.to_numpy()
    row = np.arange(len(parent_rows)) + offsets[0] - offsets[parent_rows]
    columns = [records[name].take(parents) for name in ("key", "version", "role", "ts")]
    return pa.RecordBatch.from_arrays([columns[0], pa.array(row, pa.int32()), *columns[1:], pc.list_flatten(outputs)],
                                      names=PREDICTIONS.names)


# --- the join -----------------------------------------------------------------------------------------------------


@dataclass
class _Tally:
    """What the batches showed about each distinct label, as they stream past."""

    labels: pa.Table
    """The distinct labels (key, row, label, label_ts, label_id)."""
    predicted: np.ndarray
    """A prediction of the label's key and row was logged (at any time)."""
    late: np.ndarray
    """One was logged more than the max delay before the label."""
    matched: list[pa.Table] = field(default_factory=list)
    predictions: int = 0
    pending: int = 0


def join_labels(predictions: Iterable[pa.RecordBatch], labels: pa.Table, spec: LabelSpec = LabelSpec(),
                now: float | None = None) -> JoinResult:
    """Each label joined to the predictions of its key and row (one per
    (version, role) that made one: a shadow or a canary is judged on the
    same requests as the primary). The predictions must reach back
    max_delay_seconds before the earliest label, or labels of older
    predictions count as unmatched. A (version, role) that answered one key
    and row several times (a retried request) keeps the answer made last
    before the label. Memory: the labels, one batch, and the joined rows."""
    now = time.time() if now is None else now
    valid = pc.and_kleene(pc.and_kleene(pc.is_valid(labels["key"]), pc.is_valid(labels["label"])),
                          pc.is_valid(labels["label_ts"]))
    numbered = labels.append_column("label_id", pa.array(np.arange(labels.num_rows))).filter(valid)
    distinct = _first_per_group(numbered, ["key", "row"], [("label_ts", "ascending"), ("label_id", "ascending")])
    # From here on a label's id is its index among the distinct labels.
    distinct = distinct.drop_columns(["label_id"]).append_column("label_id", pa.array(np.arange(distinct.num_rows)))
    tally = _Tally(distinct, np.zeros(distinct.num_rows, bool), np.zeros(distinct.num_rows, bool))
    for batch in predictions:
        _join_batch(tally, batch, spec, now)
    joined = _joined(tally)
    counts = _counts(tally, joined, spec, invalid=labels.num_rows - numbered.num_rows,
                     duplicate=numbered.num_rows - distinct.num_rows)
    return JoinResult(joined.drop_columns(["label_id"]), counts, tally.predictions, _delays(joined),
                      tally.pending)


def _join_batch(tally: _Tally, batch: pa.RecordBatch, spec: LabelSpec, now: float) -> None:
    """Note which labels the batch predicted, keep its matches, count its pending predictions."""
    # Only keys go through Acero (it carries no list columns, as multiclass
    # outputs are); the rest is taken from the batch by position.
    keys = pa.table({"key": batch["key"], "row": batch["row"], "prediction": np.arange(batch.num_rows)})
    pairs = keys.join(tally.labels.select(["key", "row", "label_id", "label_ts"]), keys=["key", "row"],
                      join_type="inner")
    positions = pairs["prediction"].to_numpy()
    delay = pairs["label_ts"].to_numpy() - batch["ts"].to_numpy()[positions]
    ids = pairs["label_id"].to_numpy()
    tally.predicted[ids] = True
    tally.late[ids[delay > spec.max_delay_seconds]] = True
    in_time = (delay >= 0) & (delay <= spec.max_delay_seconds)
    tally.matched.append(pa.Table.from_batches([batch.take(positions[in_time])])
                         .append_column("label_id", pa.array(ids[in_time])))
    labelled = np.zeros(batch.num_rows, bool)
    labelled[positions[in_time]] = True
    # Still worth waiting for: younger than the max delay, and not labelled yet.
    waiting = batch["ts"].to_numpy() >= now - spec.max_delay_seconds
    tally.pending += int(np.count_nonzero(waiting & ~labelled))
    tally.predictions += batch.num_rows


def _joined(tally: _Tally) -> pa.Table:
    """The matches, one per label and (version, role), with their labels."""
    none = PREDICTIONS.empty_table().append_column("label_id", pa.array([], pa.int64()))
    matches = _first_per_group(pa.concat_tables(tally.matched or [none]), ["label_id", "version", "role"],
                               [("ts", "descending")])
    ids = matches["label_id"]
    return matches.select([*PREDICTIONS.names, "label_id"]).append_column(
        "label", tally.labels["label"].take(ids)).append_column("label_ts", tally.labels["label_ts"].take(ids))


def _first_per_group(table: pa.Table, keys: list[str], order: list[tuple[str, str]]) -> pa.Table:
    """The first row, in `order`, of each group of rows equal on `keys` (none null)."""
    table = table.take(pc.sort_indices(table, [(key, "ascending") for key in keys] + order))
    first = np.zeros(table.num_rows, bool)
    first[:1] = True
    for key in keys:
        column = table[key]
        first[1:] |= pc.not_equal(column.slice(1), column.slice(0, max(table.num_rows - 1, 0))).to_numpy()
    return table.filter(first)


def _counts(tally: _Tally, joined: pa.Table, spec: LabelSpec, invalid: int, duplicate: int) -> dict[str, int]:
    matched = np.zeros(tally.labels.num_rows, bool)
    matched[joined["label_id"].to_numpy()] = True
    late = tally.late & ~matched
    logged_later = tally.predicted & ~matched & ~late
    unseen = np.flatnonzero(~tally.predicted)
    keys = tally.labels["key"].take(unseen).to_pylist() if spec.sample_rate < 1 else []
    not_sampled = sum(not sampled(key, spec.sample_rate) for key in keys)
    return {"matched": int(matched.sum()), "duplicate": duplicate, "late": int(late.sum()),
            "unmatched": int(logged_later.sum()) + len(unseen) - not_sampled, "not_sampled": not_sampled,
            "invalid": invalid}


def _delays(joined: pa.Table) -> dict[str, float | None]:
    """Seconds from a label's first prediction (any version) to the label."""
    firsts = joined.group_by("label_id").aggregate([("ts", "min"), ("label_ts", "min")])
    delays = pc.subtract(firsts["label_ts_min"], firsts["ts_min"]).to_numpy()
    if not len(delays):
        return {"p50": None, "p90": None, "max": None}
    p50, p90 = np.quantile(delays, [0.5, 0.9])
    return {"p50": float(p50), "p90": float(p90), "max": float(delays.max())}
