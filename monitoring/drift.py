"""Data drift with Evidently (kubeloop.components.distributions): recent
requests against the training data. Evidently scores each column with the
test it chooses for the column's type and size; whether the dataset drifted
is ours to derive from the share, against the InferenceService's threshold.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from kubeloop.components.distributions import column_drift
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


def evaluate(reference: pd.DataFrame, current: pd.DataFrame, features: list[str], threshold: float,
             sample_rows: int | None = None, seed: int = 0, report: Path | None = None) -> DriftResult:
    """Run Evidently's DataDriftPreset on the features; sample_rows bounds the
    rows of each side (a uniform sample) for large windows."""
    started = time.perf_counter()
    ref = _sample(reference[features], sample_rows, seed)
    cur = _sample(current[features], sample_rows, seed + 1)
    found = column_drift(ref, cur, features, drift_share=threshold, report=report)
    share, scores, methods, flagged = found.share, found.scores, found.methods, found.drifted
    return DriftResult(share=share, drifted=share >= threshold, threshold=threshold, rows=len(current),
                       reference_rows=len(reference), scores=scores, features_drifted=sorted(flagged),
                       methods=methods, seconds=round(time.perf_counter() - started, 3),
                       sampled=sample_rows is not None and (len(current) > sample_rows or len(reference) > sample_rows),
                       at=time.time())


