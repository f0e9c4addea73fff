"""Data drift with Evidently: recent requests against the training data.

Evidently 0.7 reports how many columns drifted (DriftedColumnsCount) and a
score per column (ValueDrift, with the statistical test it chose for the
column's type and size); whether the dataset drifted is ours to derive from
the share, against the InferenceService's threshold.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from kubeloop.requestlog import answered, request_records

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DriftResult:
    share: float
    """Share of the compared features that drifted."""
    drifted: bool
    """share >= threshold."""
    threshold: float
    rows: int
    """Current rows evaluated."""
    reference_rows: int
    scores: dict[str, float] = field(default_factory=dict)
    """Drift score per feature (the test's statistic or p-value)."""
    features_drifted: list[str] = field(default_factory=list)
    methods: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    sampled: bool = False
    at: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def load_requests(location: str, since: float, features: list[str]) -> pd.DataFrame:
    """Logged request rows (answers callers got, not mirrored copies)
    newer than since, one column per feature, from the request log's files
    of those hours (a folder or an s3:// prefix). Rows of another width (sent
    to a version with other inputs, before the served one) are left out, and
    the count said."""
    rows, other = [], 0
    for record in request_records(location, since):
        if record["ts"] >= since and answered(record) and record.get("features"):
            fitting = [row for row in record["features"] if len(row) == len(features)]
            other += len(record["features"]) - len(fitting)
            rows.extend(fitting)
    if other:
        log.warning("left out %d logged rows that do not have the %d features of the served version", other,
                    len(features))
    frame = pd.DataFrame(rows, columns=features) if rows else pd.DataFrame(columns=features)
    return frame.astype("float64")


def _sample(frame: pd.DataFrame, rows: int | None, seed: int) -> pd.DataFrame:
    if rows is None or len(frame) <= rows:
        return frame
    return frame.sample(n=rows, random_state=seed)


def _drifted(method: str, score: float, threshold: float) -> bool:
    """p-value tests drift when the p-value is small, distances when large."""
    return score < threshold if "p_value" in method else score >= threshold


def evaluate(reference: pd.DataFrame, current: pd.DataFrame, features: list[str], threshold: float,
             sample_rows: int | None = None, seed: int = 0, report: Path | None = None) -> DriftResult:
    """Run Evidently's DataDriftPreset on the features; sample_rows bounds the
    rows of each side (a uniform sample) for large windows."""
    from evidently import Report
    from evidently.presets import DataDriftPreset

    started = time.perf_counter()
    ref = _sample(reference[features], sample_rows, seed)
    cur = _sample(current[features], sample_rows, seed + 1)
    snapshot = Report([DataDriftPreset(columns=features, drift_share=threshold)]).run(
        current_data=cur, reference_data=ref)
    scores, methods, flagged = {}, {}, []
    share = 0.0
    for metric in snapshot.dict()["metrics"]:
        config = metric["config"]
        if config["type"].endswith("DriftedColumnsCount"):
            share = float(metric["value"]["share"])
        elif config["type"].endswith("ValueDrift"):
            column, value = config["column"], float(metric["value"])
            scores[column], methods[column] = value, config["method"]
            if _drifted(config["method"], value, config["threshold"]):
                flagged.append(column)
    if report is not None:
        snapshot.save_html(str(report))
    return DriftResult(share=share, drifted=share >= threshold, threshold=threshold, rows=len(current),
                       reference_rows=len(reference), scores=scores, features_drifted=sorted(flagged),
                       methods=methods, seconds=round(time.perf_counter() - started, 3),
                       sampled=sample_rows is not None and (len(current) > sample_rows or len(reference) > sample_rows),
                       at=time.time())


