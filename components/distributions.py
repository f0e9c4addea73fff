"""Per-column distribution drift with Evidently, the one place kubeloop
calls it: the drift job (recent requests against the training data) and the
data validation step (a new training set against the champion's) both read
it here.

Evidently 0.7 reports how many columns drifted (DriftedColumnsCount) and a
score per column (ValueDrift, with the statistical test it chose for the
column's type and size, or the one asked for, such as psi); whether a
column drifted is derived from its score and the test's threshold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd


@dataclass(frozen=True)
class ColumnDrift:
    share: float
    """Share of the compared columns that drifted."""
    scores: dict[str, float] = field(default_factory=dict)
    """The test's statistic or p-value per column."""
    methods: dict[str, str] = field(default_factory=dict)
    thresholds: dict[str, float] = field(default_factory=dict)
    drifted: list[str] = field(default_factory=list)
    """The columns whose test says drift, sorted."""


def drifted(method: str, score: float, threshold: float) -> bool:
    """p-value tests drift when the p-value is small, distances when large."""
    return score < threshold if "p_value" in method else score >= threshold


def column_drift(reference: pd.DataFrame, current: pd.DataFrame, columns: list[str], drift_share: float = 0.5,
                 method: str | None = None, threshold: float | None = None,
                 report: Path | None = None) -> ColumnDrift:
    """Evidently's DataDriftPreset on the columns: method (psi, ks, ...) and
    threshold omitted mean Evidently's choice per column type and size."""
    from evidently import Report
    from evidently.presets import DataDriftPreset

    snapshot = Report([DataDriftPreset(columns=columns, drift_share=drift_share, method=method,
                                       threshold=threshold)]).run(current_data=current[columns],
                                                                  reference_data=reference[columns])
    share, scores, methods, thresholds, flagged = 0.0, {}, {}, {}, []
    for metric in snapshot.dict()["metrics"]:
        config = metric["config"]
        if config["type"].endswith("DriftedColumnsCount"):
            share = float(metric["value"]["share"])
        elif config["type"].endswith("ValueDrift"):
            column, value = config["column"], float(metric["value"])
            scores[column], methods[column], thresholds[column] = value, config["method"], config["threshold"]
            if drifted(config["method"], value, config["threshold"]):
                flagged.append(column)
    if report is not None:
        snapshot.save_html(str(report))
    return ColumnDrift(share=share, scores=scores, methods=methods, thresholds=thresholds, drifted=sorted(flagged))
