"""Confidence intervals of latency quantiles (pure, local)."""

from __future__ import annotations

import numpy as np
import pytest

from kubeloop.components.intervals import Estimate, order_statistic_ranks, quantile_interval, ratio, summary


def test_order_statistic_ranks_bracket_the_quantile():
    """For n=1000 and the median the 95% ranks sit about 31 either side of 500."""
    low, high = order_statistic_ranks(1000, 0.5)
    assert 465 <= low < 500 < high <= 535
    low, high = order_statistic_ranks(1000, 0.99)
    assert low < 990 < high <= 999
    assert order_statistic_ranks(10, 0.99) == (order_statistic_ranks(10, 0.99)[0], 9)  # clipped to the sample


def test_the_interval_covers_the_true_quantile_most_of_the_time():
    """Exponential latencies: the true p99 is ln(100); a 95% interval must
    contain it in (about) 95% of independent samples, and a p50 interval too."""
    true = {0.5: np.log(2), 0.99: np.log(100)}
    hits = {0.5: 0, 0.99: 0}
    trials = 120
    for seed in range(trials):
        samples = np.random.default_rng(seed).exponential(size=(20, 100))
        for q in hits:
            est = quantile_interval(samples, q)
            hits[q] += est.low <= true[q] <= est.high
            assert est.low <= est.value <= est.high
    assert hits[0.5] / trials >= 0.9 and hits[0.99] / trials >= 0.9


def test_a_minority_of_disturbed_rounds_moves_neither_figure_nor_interval():
    """Four rounds in twenty with a slow stretch in their tail (a stalled
    virtual CPU): pooled over every call the p99 is the stall's; the
    typical round's p99, and its interval, stay where the other sixteen put it."""
    rng = np.random.default_rng(1)
    steady = rng.normal(1.0, 0.01, size=(20, 200))
    disturbed = steady.copy()
    disturbed[:4, :20] += 0.5
    assert np.quantile(disturbed, 0.99) > 1.4
    calm, shaken = quantile_interval(steady, 0.99), quantile_interval(disturbed, 0.99)
    assert shaken.high < 1.1 and abs(shaken.value - calm.value) < 0.01


def test_a_shift_in_most_rounds_shows_in_the_interval():
    """When most rounds are slower the figure follows, and rounds that
    disagree widen the interval beyond what one pooled round's calls give."""
    rng = np.random.default_rng(2)
    shifted = rng.normal(1.0, 0.01, size=(20, 200))
    shifted[:8] += 0.05
    shifted[8:12] += 0.2
    one_round = quantile_interval(shifted.reshape(1, -1), 0.5)
    blocked = quantile_interval(shifted, 0.5)
    assert blocked.value > 1.04
    assert blocked.high - blocked.low > 3 * (one_round.high - one_round.low)


def test_bad_samples_are_refused():
    with pytest.raises(ValueError, match="rounds, calls per round"):
        quantile_interval(np.array([1.0, 2.0]), 0.5)


def test_beats_overlaps_and_ratio():
    fast, slow, near = Estimate(1.0, 0.9, 1.1), Estimate(2.0, 1.8, 2.2), Estimate(1.15, 1.05, 1.3)
    assert fast.beats(slow) and not slow.beats(fast) and not fast.overlaps(slow)
    assert fast.overlaps(near) and not fast.beats(near)
    speedup = ratio(slow, fast)
    assert speedup.value == pytest.approx(2.0)
    assert speedup.low == pytest.approx(1.8 / 1.1) and speedup.high == pytest.approx(2.2 / 0.9)
    assert str(fast) == "1 [0.9, 1.1]"


def test_summary_is_median_and_relative_range():
    median, spread = summary([1.0, 1.1, 0.9, 1.0, 1.05])
    assert median == pytest.approx(1.0) and spread == pytest.approx(0.2)
