"""Live quality of served models: their logged outputs against the labels
that arrived later, per served version, with 95% intervals; and whether a
live figure fell short of the training-time one by more than the tolerated
drop, with confidence (what the concept-drift alert fires on).

The figures are kubeloop.components.evaluation's, so a live AUC and the AUC
the model was trained to are the same number. The intervals are analytic
where the metric is a share or a mean: Wilson's for accuracy, top-k
accuracy, positive rate, precision (a share of the predicted positives) and
recall (of the actual positives, or per class); the normal interval of the
mean per-row loss for log loss, Brier score and MAE, and RMSE as the square
root of the MSE's; DeLong's for AUC. The rest take a seeded percentile
bootstrap: F1 and macro F1 draw every resample's confusion matrix at once;
average precision, ECE and R^2 compute the metric once per resample. A
metric the rows cannot support (fewer than two rows; an AUC with one class
only; a precision without predicted positives) has the unbounded interval,
and NaN where evaluation has no figure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Real
from statistics import NormalDist
from typing import Any

import numpy as np
from scipy.stats import rankdata
from sklearn.metrics import average_precision_score, r2_score

from kubeloop.api.tasks import METRICS, PER_CLASS_PREFIX, PRIMARY, TASKS, improvement, produces
from kubeloop.components.evaluation import evaluate, expected_calibration_error
from kubeloop.components.intervals import CONFIDENCE, Estimate

Z = NormalDist().inv_cdf(0.5 + CONFIDENCE / 2)
MIN_ROWS = 2
RESAMPLES = 300
"""Bootstrap resamples: enough for the 2.5% and 97.5% percentiles to settle
within a small share of the interval's width."""
SEED = 0
"""The bootstrap's, so that the same rows always give the same interval."""
CLIP = 1e-7
"""Evaluation clips probabilities to [CLIP, 1 - CLIP] before its losses; the
per-row losses here do the same so that their mean is its figure."""
UNKNOWN = Estimate(math.nan, -math.inf, math.inf)

LOSS_MEANS = frozenset({"log_loss", "brier", "mae"})
SHARES_OF_ROWS = frozenset({"accuracy", "top_k_accuracy", "positive_rate"})
CONFUSION = frozenset({"f1", "macro_f1"})

# One metric of a resample, with the function evaluation computes it with
# (evaluating every metric per resample costs some 20 ms even on few rows).
ONE_METRIC = {
    "average_precision": lambda y, p: average_precision_score(y, p) if 0 < y.sum() < len(y) else math.nan,
    "ece": expected_calibration_error,
    "r2": r2_score,
}


@dataclass(frozen=True)
class LiveQuality:
    """The metrics of one served model over the rows whose labels arrived."""

    rows: int
    metrics: dict[str, Estimate]


@dataclass(frozen=True)
class _Rows:
    """Parsed rows of one served model and evaluation's figures over them."""

    task: str
    y: np.ndarray
    out: np.ndarray
    threshold: float
    classes: tuple[str, ...]
    values: dict[str, float]

    def probabilities(self) -> np.ndarray:
        """The outputs as evaluation scores them: probabilities clipped (and,
        for classes, renormalised); regression values as they are."""
        if self.task == "binary":
            return np.clip(self.out, CLIP, 1 - CLIP)
        if self.task == "multiclass":
            p = np.clip(self.out, CLIP, 1.0)
            return p / p.sum(axis=1, keepdims=True)
        return self.out

    def predicted(self) -> np.ndarray:
        """The predicted class per row (0/1 for binary)."""
        p = self.probabilities()
        return p.argmax(axis=1) if self.task == "multiclass" else (p >= self.threshold).astype(int)


def live_quality(task: str, outputs: Any, labels: Any, metrics: str | Sequence[str] | None = None,
                 threshold: float = 0.5, classes: Sequence[str] = ()) -> LiveQuality:
    """The metrics (default: the task's primary one) of outputs against
    labels, with 95% intervals. outputs: a probability per row (binary), a
    list of class probabilities per row (multiclass) or a value (regression);
    labels: 0/1 (bools, numbers or "0"/"1"), a class (a name in classes or
    an index; classes default to "0".."C-1"), or a number."""
    y, out, classes = _parse(task, outputs, labels, classes)
    return _quality(task, y, out, _metric_names(task, metrics, classes), threshold, classes)


def drop(task: str, metric: str, live: Estimate, trained: float) -> Estimate:
    """How far the live metric fell short of the training-time one, in the
    metric's own direction (positive: worse live), with the interval the
    live figure's gives."""
    if task not in TASKS or not produces(task, metric):
        raise ValueError(f"{task} has no metric {metric!r}; valid: {', '.join(METRICS.get(task, ()))}")
    low, high = sorted(-improvement(metric, end, trained) for end in (live.low, live.high))
    return Estimate(-improvement(metric, live.value, trained), low, high)


def _metric_names(task: str, metrics: str | Sequence[str] | None, classes: tuple[str, ...]) -> tuple[str, ...]:
    names = (PRIMARY[task],) if metrics is None else (metrics,) if isinstance(metrics, str) else tuple(metrics)
    valid = METRICS[task] + tuple(f"{PER_CLASS_PREFIX}{c}" for c in classes)
    for name in names:
        if name not in valid:
            raise ValueError(f"{task} has no metric {name!r}; valid: {', '.join(valid)}")
    return names


def _parse(task: str, outputs: Any, labels: Any, classes: Sequence[str]
           ) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Labels as evaluation takes them (0/1, class indices, floats), outputs
    as floats, and the class names (none unless multiclass)."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid: {', '.join(TASKS)}")
    out = _outputs(task, outputs, len(classes))
    if task == "multiclass":
        classes = tuple(classes) or tuple(str(i) for i in range(out.shape[1]))
        if len(classes) != out.shape[1]:
            raise ValueError(f"{len(classes)} classes but {out.shape[1]} probabilities per row")
        y = _class_indices(labels, classes)
    else:
        classes, y = (), _numbers(task, labels)
    if len(y) != len(out):
        raise ValueError(f"{len(out)} outputs but {len(y)} labels")
    return y, out, classes


def _column(values: Any) -> np.ndarray:
    # A Python list keeps each value's type (numpy would turn [True, "1"] into strings).
    return np.array(values, dtype=object) if isinstance(values, list | tuple) else np.asarray(values)


def _outputs(task: str, outputs: Any, width: int) -> np.ndarray:
    column = _column(outputs)
    if task == "multiclass" and column.dtype == object and column.ndim == 1 and len(column):
        column = np.stack([np.asarray(row, dtype=np.float64) for row in column])  # one list per row (pyarrow)
    out = column.astype(np.float64)
    if task != "multiclass":
        return out.reshape(-1)
    if out.ndim != 2:
        if out.size or not width:
            raise ValueError("multiclass outputs need one list of class probabilities per row")
        out = out.reshape(0, width)
    return out


def _numbers(task: str, labels: Any) -> np.ndarray:
    """Binary labels as 0/1 ints, regression labels as finite floats."""
    column = _column(labels).reshape(-1)
    try:
        y = column.astype(np.float64)
    except (TypeError, ValueError):
        y = np.array([_float_or_nan(v) for v in column.tolist()])
    fine = np.isin(y, (0.0, 1.0)) if task == "binary" else np.isfinite(y)
    if not fine.all():
        row = int(np.flatnonzero(~fine)[0])
        wanted = "0 or 1" if task == "binary" else "a number"
        raise ValueError(f"label {column[row]!r} (row {row}) is not {wanted}")
    return y.astype(int) if task == "binary" else y


def _float_or_nan(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _class_indices(labels: Any, classes: tuple[str, ...]) -> np.ndarray:
    """Class names, or integer indices, as indices into classes."""
    index = {c: i for i, c in enumerate(classes)}
    values = _column(labels).reshape(-1).tolist()
    code = {v: _class_index(v, index) for v in set(values)}
    y = np.fromiter((code[v] for v in values), dtype=int, count=len(values))
    if (y < 0).any():
        row = int(np.flatnonzero(y < 0)[0])
        raise ValueError(f"label {values[row]!r} (row {row}) is not one of the classes {', '.join(classes)} "
                         f"nor an index below {len(classes)}")
    return y


def _class_index(value: Any, index: dict[str, int]) -> int:
    if isinstance(value, str):
        return index.get(value, -1)
    if isinstance(value, Real) and not isinstance(value, bool) and float(value).is_integer():
        return int(value) if 0 <= value < len(index) else -1
    return -1


def _quality(task: str, y: np.ndarray, out: np.ndarray, names: tuple[str, ...], threshold: float,
             classes: tuple[str, ...]) -> LiveQuality:
    if len(y) < MIN_ROWS:
        return LiveQuality(len(y), dict.fromkeys(names, UNKNOWN))
    values = evaluate(task, y, out, threshold=threshold, classes=list(classes))
    rows = _Rows(task, y, out, threshold, classes, values)
    return LiveQuality(len(y), {name: _estimate(name, rows) for name in names})


def _estimate(metric: str, rows: _Rows) -> Estimate:
    value = rows.values[metric]
    if not math.isfinite(value):
        return UNKNOWN
    return Estimate(value, *_interval(metric, rows))


def _interval(metric: str, rows: _Rows) -> tuple[float, float]:
    value = rows.values[metric]
    if metric in LOSS_MEANS:
        return _normal(value, _row_losses(metric, rows))
    if metric == "rmse":
        low, high = _normal(value ** 2, _row_losses(metric, rows))
        return math.sqrt(max(low, 0.0)), math.sqrt(high)
    if metric == "auc":
        return _delong(value, rows)
    trials = _trials(metric, rows)
    if trials is not None:
        return _wilson(value, trials)
    return _bootstrap(metric, rows)


def _row_losses(metric: str, rows: _Rows) -> np.ndarray:
    """Each row's loss: their mean is the metric (for RMSE, its square)."""
    y, p = rows.y, rows.probabilities()
    if rows.task == "regression":
        return np.abs(y - p) if metric == "mae" else (y - p) ** 2
    if rows.task == "multiclass":
        return -np.log(p[np.arange(len(y)), y])
    return (p - y) ** 2 if metric == "brier" else -np.log(np.where(y == 1, p, 1 - p))


def _normal(value: float, losses: np.ndarray) -> tuple[float, float]:
    half = Z * float(losses.std(ddof=1)) / math.sqrt(len(losses))
    return value - half, value + half


def _trials(metric: str, rows: _Rows) -> int | None:
    """The count a share metric is a share of (None for other metrics)."""
    if metric in SHARES_OF_ROWS:
        return len(rows.y)
    if metric == "precision":
        return int(rows.predicted().sum())
    if metric == "recall":
        return int(rows.y.sum())
    if metric.startswith(PER_CLASS_PREFIX):
        return int((rows.y == rows.classes.index(metric.removeprefix(PER_CLASS_PREFIX))).sum())
    return None


def _wilson(share: float, trials: int) -> tuple[float, float]:
    if trials < 1:
        return -math.inf, math.inf
    z2n = Z * Z / trials
    centre = (share + z2n / 2) / (1 + z2n)
    half = Z / (1 + z2n) * math.sqrt(share * (1 - share) / trials + z2n / (4 * trials))
    return centre - half, centre + half


def _delong(value: float, rows: _Rows) -> tuple[float, float]:
    """DeLong's variance of the AUC: from each positive's share of negatives
    scored below it and each negative's share of positives above it."""
    p = rows.probabilities()
    positives, negatives = p[rows.y == 1], p[rows.y == 0]
    m, k = len(positives), len(negatives)
    if min(m, k) < 2:
        return -math.inf, math.inf
    ranks = rankdata(np.concatenate([positives, negatives]))
    beaten = (ranks[:m] - rankdata(positives)) / k
    beating = 1 - (ranks[m:] - rankdata(negatives)) / m
    half = Z * math.sqrt(beaten.var(ddof=1) / m + beating.var(ddof=1) / k)
    return max(value - half, 0.0), min(value + half, 1.0)


def _bootstrap(metric: str, rows: _Rows) -> tuple[float, float]:
    rng = np.random.default_rng(SEED)
    if metric in CONFUSION:
        draws = _confusion_draws(metric, rows, rng)
    else:
        statistic, y, p, n = ONE_METRIC[metric], rows.y, rows.probabilities(), len(rows.y)
        draws = np.array([statistic(y[i], p[i]) for i in (rng.integers(0, n, n) for _ in range(RESAMPLES))])
    finite = draws[np.isfinite(draws)]
    if len(finite) < len(draws) / 2:  # most resamples cannot support the metric
        return -math.inf, math.inf
    low, high = np.percentile(finite, [50 * (1 - CONFIDENCE), 50 * (1 + CONFIDENCE)])
    return float(low), float(high)


def _confusion_draws(metric: str, rows: _Rows, rng: np.random.Generator) -> np.ndarray:
    """F1 of the positive class, or macro F1, of every resample at once: a
    resample's confusion matrix is a multinomial draw over the observed
    one's cells. A class neither present nor predicted scores 0, as in
    evaluation."""
    k, n = max(len(rows.classes), 2), len(rows.y)
    cells = np.bincount(rows.y * k + rows.predicted(), minlength=k * k) / n
    counts = rng.multinomial(n, cells, size=RESAMPLES).reshape(RESAMPLES, k, k)
    hits = counts[:, np.arange(k), np.arange(k)]
    sizes = counts.sum(axis=1) + counts.sum(axis=2)  # predicted + actual, per class
    f1 = np.divide(2 * hits, sizes, out=np.zeros(hits.shape), where=sizes > 0)
    return f1[:, 1] if metric == "f1" else f1.mean(axis=1)
