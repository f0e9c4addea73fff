"""Held-out evaluation per task, and the same per slice of a sensitive or
business column: binary (ranking, thresholded and calibration metrics),
multiclass (accuracy, macro F1, log loss, top-k accuracy, recall per class)
and regression (RMSE, MAE, R^2). The metric names are those of
kubeloop.api.tasks.METRICS."""

from __future__ import annotations

import math

import numpy as np
from sklearn.metrics import (average_precision_score, brier_score_loss, f1_score, log_loss, mean_absolute_error,
                             mean_squared_error, r2_score, recall_score, roc_auc_score, top_k_accuracy_score)

from kubeloop.api.tasks import PER_CLASS_PREFIX


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


def evaluate_binary(y: np.ndarray, p: np.ndarray, threshold: float = 0.5) -> dict[str, float]:
    y = np.asarray(y).astype(int)
    p = np.clip(np.asarray(p, dtype=np.float64).reshape(-1), 1e-7, 1 - 1e-7)
    both = len(np.unique(y)) == 2
    metrics = {
        "auc": float(roc_auc_score(y, p)) if both else math.nan,
        "average_precision": float(average_precision_score(y, p)) if both else math.nan,
        "log_loss": float(log_loss(y, p, labels=[0, 1])),
        "brier": float(brier_score_loss(y, p)),
        "ece": expected_calibration_error(y, p),
        "accuracy": float(((p >= threshold) == y).mean()),
        "rows": float(len(y)),
        "positives": float(y.sum()),
    }
    metrics.update(threshold_metrics(y, p, threshold))
    return metrics


def evaluate_multiclass(y: np.ndarray, p: np.ndarray, classes: list[str], top_k: int = 3) -> dict[str, float]:
    """y holds class indices into classes; p is [n, C]."""
    y = np.asarray(y).astype(int)
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-7, 1.0)
    p = p / p.sum(axis=1, keepdims=True)
    labels = list(range(len(classes)))
    predicted = p.argmax(axis=1)
    recalls = recall_score(y, predicted, labels=labels, average=None, zero_division=0)
    present = np.isin(labels, y)
    metrics = {
        "accuracy": float((predicted == y).mean()),
        "macro_f1": float(f1_score(y, predicted, labels=labels, average="macro", zero_division=0)),
        "log_loss": float(log_loss(y, p, labels=labels)),
        "top_k_accuracy": float(top_k_accuracy_score(y, p, k=min(top_k, len(classes)), labels=labels))
        if len(classes) > 2 else float((predicted == y).mean()),
        "rows": float(len(y)),
    }
    # A class absent from these rows has no recall (NaN, not a perfect 0).
    metrics.update({f"{PER_CLASS_PREFIX}{c}": float(r) if here else math.nan
                    for c, r, here in zip(classes, recalls, present, strict=True)})
    return metrics


def evaluate_regression(y: np.ndarray, v: np.ndarray) -> dict[str, float]:
    y = np.asarray(y, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64).reshape(-1)
    return {
        "rmse": float(math.sqrt(mean_squared_error(y, v))),
        "mae": float(mean_absolute_error(y, v)),
        "r2": float(r2_score(y, v)) if len(y) > 1 else math.nan,
        "rows": float(len(y)),
    }


def evaluate(task: str, y: np.ndarray, outputs: np.ndarray, threshold: float = 0.5, classes: list[str] | None = None,
             top_k: int = 3) -> dict[str, float]:
    """The task's metrics of outputs (probabilities, class probabilities or
    values) against the labels (0/1, class indices, or values)."""
    if task == "multiclass":
        return evaluate_multiclass(y, outputs, classes or [str(i) for i in range(np.asarray(outputs).shape[1])],
                                   top_k)
    if task == "regression":
        return evaluate_regression(y, outputs)
    return evaluate_binary(y, outputs, threshold)


def evaluate_slices(task: str, y: np.ndarray, outputs: np.ndarray, groups: np.ndarray, **options
                    ) -> dict[str, dict[str, float]]:
    """Metrics per value of the slice column (metrics a slice cannot support,
    such as an AUC without both labels, are NaN)."""
    out = {}
    for value in sorted(set(groups.tolist()), key=str):
        mask = groups == value
        out[str(value)] = evaluate(task, y[mask], outputs[mask], **options)
    return out
