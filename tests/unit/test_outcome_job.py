"""The outcome job over real files: a request log in the router's format and
Parquet labels in a folder, as the local backend's job process reads them
(local; the cluster's Job runs the same module on the runtime image)."""

from __future__ import annotations

import json
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kubeloop.monitoring.outcomes.job import run
from kubeloop.requestlog import FolderStore

NOW = time.time()  # the log folder is read by its files' times: now, not a fixed date


def world(tmp_path, rows: int = 3000, canary_worse: bool = True) -> None:
    """A champion (version 1) that ranks well, a canary (version 2) that ranks
    worse, and the champion's paired answers to the canary's requests."""
    rng = np.random.default_rng(0)
    y = (rng.random(rows) < 0.2).astype(int)
    good = np.clip(0.2 + 0.5 * (y - 0.2) + rng.normal(0, 0.15, rows), 0.01, 0.99)
    bad = np.clip(0.2 + (0.1 if canary_worse else 0.5) * (y - 0.2) + rng.normal(0, 0.15, rows), 0.01, 0.99)
    log, labels = [], []
    for i in range(rows):
        key, ts = f"k{i}", NOW - 300 + i * 0.05
        canary = i % 4 == 0
        log.append({"ts": ts, "key": key, "role": "canary" if canary else "primary", "version": "2" if canary else "1",
                    "features": [[0.0]], "outputs": [float(bad[i] if canary else good[i])]})
        if canary:
            log.append({"ts": ts, "key": key, "role": "paired", "version": "1", "outputs": [float(good[i])]})
        labels.append((key, int(y[i]), ts + 30))
    FolderStore(tmp_path / "log").write(log, NOW - 300)
    (tmp_path / "labels").mkdir()
    pq.write_table(pa.table({"payment": [k for k, _, _ in labels], "fraud": [v for _, v, _ in labels],
                             "known": [t for _, _, t in labels]}), tmp_path / "labels" / "day.parquet")
    job = {"service": "ml/fraud", "model": "fraud", "task": "binary", "metric": "auc",
           "request_log": str(tmp_path / "log"), "labels": str(tmp_path / "labels"),
           "ground_truth": {"key_column": "payment", "label_column": "fraud", "timestamp_column": "known",
                            "max_delay_seconds": 3600.0},
           "window_seconds": 600.0, "min_rows": 100, "max_drop": 0.05,
           "versions": {"1": {"role": "primary", "trained": 0.95}, "2": {"role": "canary", "trained": 0.95}},
           "pair": ["1", "2"], "tracking_uri": ""}
    (tmp_path / "job.json").write_text(json.dumps(job))


def test_each_version_is_judged_on_its_own_labelled_predictions_and_the_pair_on_the_same_requests(tmp_path):
    world(tmp_path)
    result = run(tmp_path, now=NOW)
    assert result["labels"]["matched"] == 3000 and sum(result["labels"].values()) == 3000
    champion, canary = result["versions"]["1"], result["versions"]["2"]
    assert (champion["rows"], canary["rows"]) == (2250, 750)
    assert champion["live"]["low"] <= champion["live"]["value"] <= champion["live"]["high"]
    assert canary["live"]["value"] < champion["live"]["value"]
    # The drop is measured against the registered metric, positive when worse.
    assert canary["drop"]["value"] == pytest.approx(0.95 - canary["live"]["value"], abs=1e-6)
    pairs = result["pairs"]["losses"]
    assert pairs["differences"]["n"] == pairs["champion"]["n"] == 750
    assert pairs["differences"]["mean"] == pytest.approx(pairs["challenger"]["mean"] - pairs["champion"]["mean"])
    assert pairs["differences"]["mean"] > 0, "the worse canary loses more on the same requests"
    assert json.loads((tmp_path / "latest.json").read_text()) == result


def test_labels_naming_a_column_the_files_do_not_have_fail_with_the_users_field(tmp_path):
    world(tmp_path)
    job = json.loads((tmp_path / "job.json").read_text())
    job["ground_truth"]["key_column"] = "request_id"
    (tmp_path / "job.json").write_text(json.dumps(job))
    with pytest.raises(ValueError, match=r"no column 'request_id' \(spec.monitoring.groundTruth.keyColumn\)"):
        run(tmp_path, now=NOW)


def test_a_label_arriving_in_the_window_for_a_prediction_just_before_it_is_matched_not_judged(tmp_path):
    """The window's first labels judge predictions made before it: read, so
    they count as matched and not as lost, but only the window's predictions
    are judged."""
    world(tmp_path)
    job = json.loads((tmp_path / "job.json").read_text())
    job["window_seconds"] = 200.0  # predictions span the last 300 s; their labels come 30 s later
    (tmp_path / "job.json").write_text(json.dumps(job))
    result = run(tmp_path, now=NOW)
    assert result["labels"]["unmatched"] == 0
    judged = result["versions"]["1"]["rows"] + result["versions"]["2"]["rows"]
    assert judged < result["labels"]["matched"] <= 3000
