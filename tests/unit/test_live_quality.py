"""Live quality of served models from late labels: evaluation's figures with
95% intervals that cover, per served version, and the drop the concept-drift
alert fires on (pure, local)."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pyarrow as pa
import pytest

from kubeloop.api.tasks import METRICS, PRIMARY
from kubeloop.components.evaluation import evaluate
from kubeloop.components.intervals import Estimate
from kubeloop.monitoring.outcomes.quality import drop, live_quality

CLASSES = ("cat", "dog", "fox", "owl")


def binary_rows(seed: int, n: int = 500) -> tuple[np.ndarray, np.ndarray]:
    """Labels and fair-to-good probabilities."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    return y, np.clip(0.35 * y + 0.65 * rng.random(n), 0.0, 1.0)


def multiclass_rows(seed: int, n: int = 500) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, len(CLASSES), n)
    p = rng.dirichlet(np.ones(len(CLASSES)), n)
    p[np.arange(n), y] += 0.4
    return y, p / p.sum(axis=1, keepdims=True)


def regression_rows(seed: int, n: int = 500, sigma: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.normal(10.0, 3.0, n)
    return y, y + rng.normal(0.0, sigma, n)


ROWS = {"binary": binary_rows(0), "multiclass": multiclass_rows(1), "regression": regression_rows(2)}


@pytest.mark.parametrize("task", ["binary", "multiclass", "regression"])
def test_every_metric_is_evaluations_figure_inside_its_interval(task):
    """The primary metric by default, and each metric of the task when
    named, carry evaluation's value; each interval holds it."""
    y, out = ROWS[task]
    classes = list(CLASSES) if task == "multiclass" else None
    expected = evaluate(task, y, out, classes=classes)
    primary = live_quality(task, out, y, classes=CLASSES if classes else ())
    assert list(primary.metrics) == [PRIMARY[task]] and primary.rows == len(y)
    assert primary.metrics[PRIMARY[task]].value == pytest.approx(expected[PRIMARY[task]])
    named = list(METRICS[task]) + (["recall.fox"] if classes else [])
    every = live_quality(task, out, y, metrics=named, classes=CLASSES if classes else ())
    for metric, estimate in every.metrics.items():
        assert estimate.value == pytest.approx(expected[metric]), metric
        assert estimate.low <= estimate.value <= estimate.high, metric
        assert estimate.high - estimate.low < 0.3 * max(abs(estimate.value), 1.0), metric


def coverage(estimates: list[Estimate], truth: float) -> float:
    return float(np.mean([e.low <= truth <= e.high for e in estimates]))


RUNS = 300


def test_the_accuracy_interval_covers_a_known_accuracy():
    """Predictions right with probability 0.8: Wilson's 95% interval over
    500 rows holds 0.8 in about 95% of samples."""
    estimates = []
    for seed in range(RUNS):
        rng = np.random.default_rng(seed)
        y = rng.integers(0, 2, 500)
        right = rng.random(500) < 0.8
        estimates.append(live_quality("binary", np.where(right == (y == 1), 0.8, 0.2), y,
                                      metrics="accuracy").metrics["accuracy"])
    assert 0.92 <= coverage(estimates, 0.8) <= 0.98


def test_the_auc_interval_covers_a_binormal_auc():
    """Scores N(0, 1) for negatives and N(1, 1) for positives: the AUC is
    Phi(1 / sqrt 2); DeLong's interval holds it in about 95% of samples."""
    truth = NormalDist().cdf(1 / math.sqrt(2))
    estimates = []
    for seed in range(RUNS):
        rng = np.random.default_rng(seed)
        y = (rng.random(500) < 0.3).astype(int)
        score = rng.normal(y.astype(float), 1.0)
        estimates.append(live_quality("binary", 1 / (1 + np.exp(-score)), y).metrics["auc"])
    assert 0.92 <= coverage(estimates, truth) <= 0.98


def test_the_rmse_interval_covers_the_noise_sigma():
    estimates = [live_quality("regression", *reversed(regression_rows(seed))).metrics["rmse"]
                 for seed in range(RUNS)]
    assert 0.92 <= coverage(estimates, 2.0) <= 0.98


def test_labels_and_outputs_are_read_in_every_form():
    """0/1 as bools, floats or strings; classes by name or index; class
    probabilities as a pyarrow list column."""
    y, p = ROWS["binary"]
    expected = live_quality("binary", p, y, metrics="f1")
    assert live_quality("binary", p, y == 1, metrics="f1") == expected
    assert live_quality("binary", p.tolist(), [str(v) for v in y], metrics="f1") == expected
    assert live_quality("binary", pa.array(p), pa.array(y.astype(float)), metrics="f1") == expected
    y, p = ROWS["multiclass"]
    expected = live_quality("multiclass", p, y, classes=CLASSES)
    assert live_quality("multiclass", pa.array(p.tolist()), [CLASSES[i] for i in y], classes=CLASSES) == expected
    assert live_quality("multiclass", p, [str(i) for i in y]) == expected  # classes "0".."3" by default


def test_unreadable_labels_and_unknown_metrics_are_named():
    y, p = ROWS["binary"]
    with pytest.raises(ValueError, match=r"label 'yes' \(row 2\) is not 0 or 1"):
        live_quality("binary", p[:3], [0, 1, "yes"])
    with pytest.raises(ValueError, match="label 2 "):
        live_quality("binary", p[:2], [1, 2])
    with pytest.raises(ValueError, match="label 'bird' .* not one of the classes cat, dog, fox, owl"):
        live_quality("multiclass", ROWS["multiclass"][1][:2], ["cat", "bird"], classes=CLASSES)
    with pytest.raises(ValueError, match="label None"):
        live_quality("regression", [1.0, 2.0], [1.5, None])
    with pytest.raises(ValueError, match="no metric 'f2'; valid: auc, average_precision"):
        live_quality("binary", p, y, metrics=["auc", "f2"])
    with pytest.raises(ValueError, match="500 outputs but 499 labels"):
        live_quality("binary", p, y[1:])
    with pytest.raises(ValueError, match="unknown task 'ranking'"):
        live_quality("ranking", p, y)


def test_rows_that_cannot_support_a_metric_give_nan_not_an_error():
    """One row, no rows, or one class only: NaN with the unbounded interval."""
    for estimate in (live_quality("binary", [0.7], [1]).metrics["auc"],
                     live_quality("regression", [], []).metrics["rmse"],
                     live_quality("binary", [0.2, 0.9, 0.6], [1, 1, 1], metrics=["auc", "f1"]).metrics["auc"]):
        assert math.isnan(estimate.value) and (estimate.low, estimate.high) == (-math.inf, math.inf)


def test_the_bootstrap_is_seeded_and_narrows_with_rows():
    """F1 and average precision take a bootstrap: the same rows give the
    same interval, and four times the rows about half its width."""
    few, many = binary_rows(5, 300), binary_rows(6, 1200)
    first = live_quality("binary", few[1], few[0], metrics=["f1", "average_precision"])
    assert live_quality("binary", few[1], few[0], metrics=["f1", "average_precision"]) == first
    more = live_quality("binary", many[1], many[0], metrics=["f1", "average_precision"])
    for metric in ("f1", "average_precision"):
        ratio = (more.metrics[metric].high - more.metrics[metric].low) / (
            first.metrics[metric].high - first.metrics[metric].low)
        assert 0.35 < ratio < 0.7, metric


def test_a_drop_is_measured_in_the_metrics_own_direction():
    """Log loss 0.30 at training (lower is better): a live 0.45 [0.40, 0.50] is 0.15 worse."""
    fallen = drop("binary", "log_loss", Estimate(0.45, 0.40, 0.50), 0.30)
    assert (fallen.value, fallen.low, fallen.high) == pytest.approx((0.15, 0.10, 0.20))
    fallen = drop("binary", "auc", Estimate(0.70, 0.66, 0.74), 0.85)
    assert (fallen.value, fallen.low, fallen.high) == pytest.approx((0.15, 0.11, 0.19))
    with pytest.raises(ValueError, match="no metric 'rmse'"):
        drop("binary", "rmse", Estimate(1.0, 0.9, 1.1), 1.0)
