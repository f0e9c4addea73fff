"""The always-valid comparison of a challenger with the champion: read after
every step, it keeps its false-alarm rate where repeated fixed-sample tests
do not, finds a clearly worse challenger, and its confidence sequence holds
the true difference at every look at once (pure, local)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kubeloop.monitoring.outcomes.sequential import Comparison, Stream, compare

ALPHA = 0.05
RUNS, LOOKS, BATCH = 2000, 20, 50
"""Each simulated rollout looks after every one of 20 batches of 50
observations per arm."""


def rollouts(champion_rate: float, challenger_rate: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cumulative errors per arm, [run, look], and observations per arm at each look."""
    rng = np.random.default_rng(seed)
    champion = rng.binomial(BATCH, champion_rate, (RUNS, LOOKS)).cumsum(axis=1)
    challenger = rng.binomial(BATCH, challenger_rate, (RUNS, LOOKS)).cumsum(axis=1)
    return champion, challenger, BATCH * np.arange(1, LOOKS + 1)


def looks(champion: np.ndarray, challenger: np.ndarray, n: np.ndarray) -> list[list[Comparison]]:
    """compare at every look of every run (0/1 errors: sum of squares = sum)."""
    return [[compare(Stream.from_sums(n[j], a[j], a[j]), Stream.from_sums(n[j], b[j], b[j])) for j in range(LOOKS)]
            for a, b in zip(champion, challenger, strict=True)]


def ever_worse(runs: list[list[Comparison]]) -> float:
    return float(np.mean([any(c.verdict == "worse" for c in run) for run in runs]))


def test_identical_models_are_rarely_called_worse_however_often_one_looks():
    """Both arms fail 10% of the time. A one-sided z-test at 5% read at
    each of the 20 looks calls the challenger worse in far more than 5% of
    rollouts; the always-valid test in at most 5%."""
    champion, challenger, n = rollouts(0.1, 0.1, seed=0)
    rate_a, rate_b = champion / n, challenger / n
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (rate_b - rate_a) / np.sqrt((rate_a * (1 - rate_a) + rate_b * (1 - rate_b)) / n)
    assert (z > 1.645).any(axis=1).mean() > 2 * ALPHA
    assert ever_worse(looks(champion, challenger, n)) <= ALPHA


def test_a_challenger_twice_as_bad_is_called_worse_and_the_sequence_holds_the_truth():
    """Errors 20% against 10%: called worse within the 20 looks in most
    rollouts, and the confidence sequence holds 0.1 at every look at once in
    at least 95% of rollouts (0 for identical models)."""
    for rate, truth in ((0.2, 0.1), (0.1, 0.0)):
        champion, challenger, n = rollouts(0.1, rate, seed=1)
        runs = looks(champion, challenger, n)
        covered = np.mean([all(c.low <= truth <= c.high for c in run) for run in runs])
        assert covered >= 1 - ALPHA
    worse = looks(*rollouts(0.1, 0.2, seed=2))
    assert ever_worse(worse) > 0.9
    assert np.mean([run[-1].verdict == "worse" for run in worse]) > 0.9


def test_a_stream_from_counters_is_the_stream_of_the_values():
    rng = np.random.default_rng(3)
    flags = rng.random(300) < 0.1
    counted = Stream.from_sums(300, int(flags.sum()), int(flags.sum()))
    assert (counted.n, counted.mean, counted.m2) == pytest.approx((300, Stream.of(flags).mean, Stream.of(flags).m2))
    assert math.isnan(Stream.of([1.0]).variance) and Stream.of([]) == Stream()


def test_verdicts_follow_the_margin_and_the_direction():
    """100,000 requests per arm, failing 10% against 12%: worse with no
    margin, not worse when 0.05 is tolerated, and the mirror when higher
    values are the better ones (success rates 0.90 against 0.88)."""
    champion, challenger = Stream.from_sums(100_000, 10_000, 10_000), Stream.from_sums(100_000, 12_000, 12_000)
    strict = compare(champion, challenger)
    assert strict.verdict == "worse" and strict.low > 0 and strict.p_value < 1e-6
    assert strict.difference == pytest.approx(0.02) and strict.low < 0.02 < strict.high
    assert compare(champion, challenger, margin=0.05).verdict == "not-worse"
    ok = Stream.from_sums(100_000, 90_000, 90_000)
    assert compare(ok, Stream.from_sums(100_000, 88_000, 88_000), higher_is_worse=False).verdict == "worse"
    assert compare(challenger, champion).verdict == "not-worse"  # a better challenger


def test_the_p_value_and_the_sequence_agree_and_tau_tunes_the_width():
    """p < alpha exactly when 0 lies outside the sequence; a tau near the
    effect narrows the sequence against a far smaller one."""
    rng = np.random.default_rng(4)
    a, b = Stream.of(rng.random(400) < 0.1), Stream.of(rng.random(400) < 0.15)
    for alpha in (0.01, 0.05, 0.2, 0.5):
        result = compare(a, b, alpha=alpha)
        assert (result.p_value < alpha) == (not result.low <= 0 <= result.high)
    tuned, tiny = compare(a, b, tau=0.05), compare(a, b, tau=0.001)
    assert tuned.high - tuned.low < 0.7 * (tiny.high - tiny.low)


def test_too_little_data_says_continue():
    for champion, challenger in ((Stream(), Stream.of([1.0, 0.0])), (Stream.of([0.0]), Stream.of([1.0])),
                                 (Stream.of([0.0] * 50), Stream.of([0.0] * 50))):
        result = compare(champion, challenger)
        assert (result.verdict, result.p_value, result.low, result.high) == ("continue", 1.0, -math.inf, math.inf)
    with pytest.raises(ValueError, match="alpha"):
        compare(Stream.of([0, 1]), Stream.of([0, 1]), alpha=1.5)
    with pytest.raises(ValueError, match="tau"):
        compare(Stream.of([0, 1]), Stream.of([0, 1]), tau=0.0)
