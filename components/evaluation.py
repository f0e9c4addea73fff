"""Held-out evaluation: ranking, thresholded and calibration metrics, and
the same per slice of a sensitive or business column."""

from __future__ import annotations

import math

import numpy as np
from sklearn.metrics import average_precision_score, brier_score_loss, log_loss, roc_auc_score


def expected_calibration_error(y: np.ndarray, p: np.ndarray, bins: int = 10) -> float:
    """Mean |observed rate - predicted probability| over equal-width bins,
    weighted by the share of rows in each bin."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.digitize(p, edges[1:-1]), 0, bins - 1)
    total = 0.0
    for b in range(bins):
        mask = which == b
        if mask.any():
            total += mask.mean() * abs(y[mask].mean() - p[mask].mean())
    return float(total)


def threshold_metrics(y: np.ndarray, p: np.ndarray, threshold: float) -> dict[str, float]:
    predicted = p >= threshold
    tp = int((predicted & (y == 1)).sum())
    fp = int((predicted & (y == 0)).sum())
    fn = int((~predicted & (y == 1)).sum())
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "positive_rate": float(predicted.mean())}


def evaluate(y: np.ndarray, p: np.ndarray, threshold: float) -> dict[str, float]:
    y = np.asarray(y).astype(int)
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-7, 1 - 1e-7)
    both = len(np.unique(y)) == 2
    metrics = {
        "auc": float(roc_auc_score(y, p)) if both else math.nan,
        "average_precision": float(average_precision_score(y, p)) if both else math.nan,
        "log_loss": float(log_loss(y, p, labels=[0, 1])),
        "brier": float(brier_score_loss(y, p)),
        "ece": expected_calibration_error(y, p),
        "rows": float(len(y)),
        "positives": float(y.sum()),
    }
    metrics.update(threshold_metrics(y, p, threshold))
    return metrics


def evaluate_slices(y: np.ndarray, p: np.ndarray, groups: np.ndarray, threshold: float) -> dict[str, dict[str, float]]:
    """Metrics per value of the slice column (values with no positives or no
    negatives get no AUC)."""
    out = {}
    for value in sorted(set(groups.tolist()), key=str):
        mask = groups == value
        out[str(value)] = evaluate(y[mask], p[mask], threshold)
    return out
