"""Late labels joined to logged predictions: every label counted by exactly
one reason, the earliest of duplicates kept, each (version, role) of a
request judged, the request log streamed in batches without changing the
answer; logs written by the router's own writer, labels as Parquet files
(pure, local)."""

from __future__ import annotations

import io
import itertools

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kubeloop.monitoring.outcomes.join import LabelSpec, join_labels, prediction_batches, read_labels
from kubeloop.requestlog import FolderStore, ObjectStore, sampled

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
DAY = 86400.0
SPEC = LabelSpec()


def record(key: str, ts: float, outputs: list, role: str = "primary", version: str = "3") -> dict:
    """A record as the router logs it (a shadow's has no features)."""
    row = {"ts": ts, "key": key, "role": role, "version": version, "outputs": outputs}
    if role != "shadow":
        row["features"] = [[0.5, 1.25, -3.0]] * len(outputs)
    return row


def write_log(folder, records: list[dict]) -> None:
    store = FolderStore(folder)
    for row in records:
        store.write([row], now=row["ts"])


def write_labels(path, keys: list[str], labels: list, at: list[float], **extra) -> None:
    pq.write_table(pa.table({"request_id": keys, "label": labels, "label_timestamp": at, **extra}), path)


def join(tmp_path, spec: LabelSpec = SPEC, now: float = T0 + 30 * DAY, batch_rows: int = 1000):
    return join_labels(prediction_batches(tmp_path / "log", batch_rows=batch_rows),
                       read_labels(tmp_path / "labels.parquet", spec), spec, now=now)


def test_a_label_within_the_max_delay_joins_its_prediction(tmp_path):
    write_log(tmp_path / "log", [record("a", T0, [0.9]), record("b", T0 + 1, [0.2])])
    write_labels(tmp_path / "labels.parquet", ["a"], [1], [T0 + 3600])
    result = join(tmp_path)
    assert result.counts["matched"] == 1 and result.predictions == 2
    assert result.joined.to_pylist() == [{"key": "a", "row": 0, "version": "3", "role": "primary", "ts": T0,
                                          "output": 0.9, "label": 1, "label_ts": T0 + 3600}]
    assert result.delays == {"p50": 3600.0, "p90": 3600.0, "max": 3600.0}


def test_a_label_later_than_the_max_delay_is_late_and_not_used(tmp_path):
    write_log(tmp_path / "log", [record("a", T0, [0.9]), record("b", T0, [0.1])])
    write_labels(tmp_path / "labels.parquet", ["a", "b"], [1, 0], [T0 + 8 * DAY, T0 + 6 * DAY])
    result = join(tmp_path)
    assert result.counts["late"] == 1 and result.counts["matched"] == 1
    assert result.joined["key"].to_pylist() == ["b"]


def test_of_duplicate_labels_the_earliest_arriving_is_kept(tmp_path):
    write_log(tmp_path / "log", [record("a", T0, [0.9])])
    write_labels(tmp_path / "labels.parquet", ["a", "a", "a"], [1, 0, 1], [T0 + 300, T0 + 100, T0 + 200])
    result = join(tmp_path)
    assert result.counts["duplicate"] == 2 and result.counts["matched"] == 1
    assert result.joined.select(["label", "label_ts"]).to_pylist() == [{"label": 0, "label_ts": T0 + 100}]


def keys_sampled(rate: float, kept: bool, count: int) -> list[str]:
    """Keys the log keeps at this rate (or, kept=False, does not)."""
    keys = (f"k{i}" for i in itertools.count())
    return list(itertools.islice((k for k in keys if sampled(k, rate) == kept), count))


def test_labels_without_a_prediction_are_told_apart_by_the_logs_sampling(tmp_path):
    """A key the log would have kept is unmatched (a prediction got lost);
    one it would not have kept is not_sampled. A label that became known
    before the only prediction of its key cannot judge it: unmatched."""
    keys = keys_sampled(0.5, True, 1) + keys_sampled(0.5, False, 2) + ["later"]
    write_log(tmp_path / "log", [record("later", T0 + 100, [0.4])])
    write_labels(tmp_path / "labels.parquet", keys, [1, 0, 1, 1], [T0, T0, T0, T0 + 50])
    result = join(tmp_path, LabelSpec(sample_rate=0.5))
    assert result.counts["unmatched"] == 2 and result.counts["not_sampled"] == 2
    assert result.counts["matched"] == 0 and result.joined.num_rows == 0
    assert join(tmp_path, LabelSpec(sample_rate=1.0)).counts["not_sampled"] == 0


def test_multi_row_requests_join_by_the_row_column_or_row_zero_without_it(tmp_path):
    write_log(tmp_path / "log", [record("a", T0, [0.1, 0.2, 0.3])])
    write_labels(tmp_path / "labels.parquet", ["a", "a"], [0, 1], [T0 + 10, T0 + 10], row=[2, 1])
    result = join(tmp_path)
    assert result.predictions == 3 and result.counts["matched"] == 2
    assert sorted(result.joined.select(["row", "output", "label"]).to_pylist(), key=lambda r: r["row"]) == [
        {"row": 1, "output": 0.2, "label": 1}, {"row": 2, "output": 0.3, "label": 0}]
    write_labels(tmp_path / "labels.parquet", ["a"], [1], [T0 + 10])
    assert join(tmp_path).joined.select(["row", "output"]).to_pylist() == [{"row": 0, "output": 0.1}]


def test_multiclass_outputs_stay_lists_of_class_probabilities(tmp_path):
    write_log(tmp_path / "log", [record("a", T0, [[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])])
    write_labels(tmp_path / "labels.parquet", ["a"], ["cat"], [T0 + 10], row=[1])
    result = join(tmp_path)
    assert result.joined.schema.field("output").type == pa.list_(pa.float64())
    assert result.joined.select(["row", "output", "label"]).to_pylist() == [
        {"row": 1, "output": [0.1, 0.1, 0.8], "label": "cat"}]


def test_a_shadow_and_the_primary_are_both_judged_on_the_same_label(tmp_path):
    """A retried request keeps the answer its version gave last before the label."""
    write_log(tmp_path / "log", [record("a", T0, [0.9]), record("a", T0 + 0.01, [0.4], role="shadow", version="4"),
                                 record("a", T0 + 5, [0.8]), record("a", T0 + 50, [0.7])])
    write_labels(tmp_path / "labels.parquet", ["a"], [1], [T0 + 10])
    result = join(tmp_path)
    assert result.counts["matched"] == 1 and result.predictions == 4
    assert sorted(result.joined.select(["version", "role", "output"]).to_pylist(), key=lambda r: r["role"]) == [
        {"version": "3", "role": "primary", "output": 0.8}, {"version": "4", "role": "shadow", "output": 0.4}]


def test_labels_missing_a_column_are_refused_naming_the_users_column_and_field(tmp_path):
    pq.write_table(pa.table({"id": ["a"], "label": [1], "label_timestamp": [T0]}), tmp_path / "labels.parquet")
    with pytest.raises(ValueError) as refused:
        read_labels(tmp_path / "labels.parquet")
    message = str(refused.value)
    assert "'request_id'" in message and "spec.monitoring.groundTruth.keyColumn" in message
    assert "columns are: id, label, label_timestamp" in message
    with pytest.raises(ValueError, match="'outcome'.*labelColumn"):
        read_labels(tmp_path / "labels.parquet", LabelSpec(key_column="id", label_column="outcome"))


def test_labels_are_read_from_a_folder_with_timestamps_of_any_unit(tmp_path):
    folder = tmp_path / "labels" / "dt=2026-01-02"
    folder.mkdir(parents=True)
    at = pa.array([int((T0 + DAY) * 1e6)], pa.timestamp("us", tz="UTC"))
    write_labels(folder / "part-0.parquet", [7], [True], at)
    write_labels(folder / "part-1.parquet", ["old"], [False], [T0 - DAY])
    labels = read_labels(tmp_path / "labels", since=T0)
    assert labels.to_pylist() == [{"key": "7", "row": 0, "label": True, "label_ts": T0 + DAY}]


def test_every_label_is_counted_by_exactly_one_reason(tmp_path):
    (kept,), (dropped,) = keys_sampled(0.8, True, 1), keys_sampled(0.8, False, 1)
    write_log(tmp_path / "log", [record(f"p{i}", T0 + i, [0.5]) for i in range(6)])
    keys = ["p0", "p0", "p1", "p2", kept, dropped, None, "p3"]
    at = [T0 + 60, T0 + 90, T0 + 8 * DAY, T0 + 1, T0, T0, T0, None]
    write_labels(tmp_path / "labels.parquet", keys, [1] * len(keys), at)
    counts = join(tmp_path, LabelSpec(sample_rate=0.8)).counts
    assert counts == {"matched": 1, "duplicate": 1, "late": 1, "unmatched": 2, "not_sampled": 1, "invalid": 2}
    assert sum(counts.values()) == len(keys)


def test_a_join_over_many_small_batches_equals_one_over_a_single_batch(tmp_path):
    rng = np.random.default_rng(4)
    records = [record(f"k{rng.integers(60)}", T0 + i * 600, rng.random(int(rng.integers(1, 4))).round(3).tolist(),
                      role=str(rng.choice(["primary", "canary", "shadow"])), version=str(rng.integers(3, 5)))
               for i in range(300)]
    write_log(tmp_path / "log", records)
    keys = [f"k{k}" for k in rng.integers(70, size=120)]
    write_labels(tmp_path / "labels.parquet", keys, rng.integers(2, size=120).tolist(),
                 (T0 + rng.random(120) * 4 * DAY).tolist(), row=rng.integers(3, size=120).tolist())
    spec = LabelSpec(max_delay_seconds=DAY)
    now = T0 + 2.5 * DAY
    small = join(tmp_path, spec, now, batch_rows=7)
    whole = join(tmp_path, spec, now, batch_rows=10**6)
    assert len(list(prediction_batches(tmp_path / "log", batch_rows=7))) > 40
    order = [("key", "ascending"), ("row", "ascending"), ("role", "ascending")]
    assert small.joined.sort_by(order).equals(whole.joined.sort_by(order)) and small.joined.num_rows > 10
    assert (small.counts, small.pending, small.delays, small.predictions) == (
        whole.counts, whole.pending, whole.delays, whole.predictions)
    assert small.counts["matched"] and small.counts["late"] and small.pending


def test_pending_counts_unlabelled_predictions_whose_labels_may_still_come(tmp_path):
    write_log(tmp_path / "log", [record("old", T0, [0.1]), record("labelled", T0 + 5 * DAY, [0.2]),
                                 record("recent", T0 + 6 * DAY, [0.3]), record("recent2", T0 + 7 * DAY, [0.4, 0.5])])
    write_labels(tmp_path / "labels.parquet", ["labelled"], [0], [T0 + 5.5 * DAY])
    result = join(tmp_path, now=T0 + 8 * DAY)
    assert result.pending == 3  # recent, and both rows of recent2; old's week has passed


def test_a_line_still_being_written_and_records_outside_the_window_are_left_out(tmp_path):
    write_log(tmp_path / "log", [record("a", T0, [0.1]), record("b", T0 + 60, [0.2]), record("c", T0 + 120, [0.3])])
    (log,) = (tmp_path / "log").glob("*.jsonl")
    with open(log, "ab") as partial:
        partial.write(b'{"ts": 1767225780.0, "key": "d", "ro')
    batches = list(prediction_batches(tmp_path / "log", since=T0 + 30, until=T0 + 120))
    assert pa.Table.from_batches(batches)["key"].to_pylist() == ["b"]


class FakeS3:
    """The three calls the readers make of boto3's S3 client, over a dict."""

    def __init__(self):
        self.objects: dict[str, bytes] = {}
        self.fetched: list[str] = []

    def put_object(self, Bucket, Key, Body, **_):
        self.objects[Key] = Body

    def get_paginator(self, _name):
        return self

    def paginate(self, Bucket, Prefix, StartAfter=""):
        yield {"Contents": [{"Key": k} for k in sorted(self.objects) if k.startswith(Prefix) and k > StartAfter]}

    def get_object(self, Bucket, Key):
        self.fetched.append(Key)
        return {"Body": io.BytesIO(self.objects[Key])}


def test_an_object_store_log_joins_labels_from_the_same_store(monkeypatch):
    """The router's ObjectStore layout (a flush an object, keys by hour) and
    labels under another prefix; a listing that starts at the window's hour."""
    s3 = FakeS3()
    monkeypatch.setattr("boto3.client", lambda *_, **__: s3)
    writer = ObjectStore("s3://logs/ml-fraud", client=s3)
    writer.write([record("old", T0 - DAY, [0.3])], now=T0 - DAY)
    writer.write([record("a", T0, [0.9]), record("b", T0 + 1, [0.1])], now=T0 + 1)
    labels = io.BytesIO()
    pq.write_table(pa.table({"request_id": ["a", "old"], "label": [1, 0], "label_timestamp": [T0 + 60] * 2}), labels)
    s3.objects["ground-truth/2026/01/01.parquet"] = labels.getvalue()
    s3.objects["ground-truth-old/x.parquet"] = b"not this prefix"
    result = join_labels(prediction_batches("s3://logs/ml-fraud", since=T0 - 10),
                         read_labels("s3://logs/ground-truth"), now=T0 + DAY)
    assert result.predictions == 2 and result.joined["key"].to_pylist() == ["a"]
    assert result.counts["unmatched"] == 1  # "old" was not read: before the window
    assert not any("dt=2025-12-31/hour=00" in key for key in s3.fetched)
