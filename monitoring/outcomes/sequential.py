"""An always-valid comparison of a challenger with the champion, which a
rollout may read after every step without raising its false-alarm rate.

Each arm is a stream of per-observation values (0/1 errors, per-row log
loss, squared errors, 0/1 "request failed"), kept as its count, mean and sum
of squared deviations, so that a stream can be built from counters. The
test is the mixture sequential probability ratio test for a difference of
means (Robbins' normal mixture; Johari, Pekelis and Walsh, "Always valid
inference: continuous monitoring of A/B tests", Operations Research 2022).
The difference of means d is about N(theta, V), V = s_champion^2 / n_champion
+ s_challenger^2 / n_challenger, with the variances estimated from the data;
mixing the likelihood ratio of theta against theta0 over theta ~ N(theta0,
tau^2) gives

    L(theta0) = sqrt(V / (V + tau^2)) * exp(tau^2 (d - theta0)^2 / (2 V (V + tau^2))),

a martingale under theta0, which by Ville's inequality ever reaches 1/alpha
with probability at most alpha, however often it is read. Hence the
always-valid p-value min(1, 1 / L(0)), and the confidence sequence
{theta0 : L(theta0) < 1/alpha}, the interval

    d +- sqrt(V (V + tau^2) / tau^2 * (2 ln(1/alpha) + ln((V + tau^2) / V))),

which holds the true difference at every look at once with probability at
least 1 - alpha. The guarantee is asymptotic (normal means, variances
estimated), as in the paper. Each look is computed from the streams alone:
a caller that keeps the smallest p-value, or the intersection of the
intervals, seen so far keeps the guarantee.

Reading "worse" off the two-sided sequence makes the one-sided decision
conservative: a challenger no worse than the margin is declared worse with
probability at most alpha, in practice nearer alpha / 2 or less.

tau, the mixing distribution's standard deviation, is the size of difference
the test is tuned to: the sequence is narrowest where tau^2 / V =
2 ln(1/alpha) + ln(1 + tau^2 / V), about 8.2 at alpha = 0.05. Its default
is a tenth of the spread of one challenger-minus-champion difference,
TAU * sqrt(s_champion^2 + s_challenger^2); with equal arms of n observations
V is that spread squared over n, so the sequence is narrowest near 820
observations per arm, within 5% of that width from 250 to 5,000 per arm
and 20% wider at 100.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal


TAU = 0.1
"""Default tau, in units of the spread of one challenger-minus-champion difference."""

Verdict = Literal["worse", "not-worse", "continue"]


@dataclass(frozen=True)
class Stream:
    """Per-observation values of one arm: count, mean and sum of squared
    deviations from the mean (m2)."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0

    @classmethod
    def of(cls, values: Any) -> Stream:
        """The stream of these values."""
        import numpy as np  # here: the operator's image, which compares streams, has no numpy

        x = np.asarray(values, dtype=np.float64).reshape(-1)
        if not len(x):
            return cls()
        mean = float(x.mean())
        return cls(len(x), mean, float(((x - mean) ** 2).sum()))

    @classmethod
    def from_sums(cls, n: int, total: float, squares: float) -> Stream:
        """The stream from counters: the count, sum and sum of squares of
        the values (for 0/1 values, such as failed requests, squares = total)."""
        if not n:
            return cls()
        mean = float(total) / n
        return cls(int(n), mean, max(float(squares) - float(total) * mean, 0.0))  # rounding can dip below 0

    @property
    def variance(self) -> float:
        """Sample variance of the values (NaN below two)."""
        return self.m2 / (self.n - 1) if self.n > 1 else math.nan


@dataclass(frozen=True)
class Comparison:
    """The challenger against the champion at one look."""

    difference: float
    """Challenger mean - champion mean."""
    low: float
    high: float
    """The always-valid confidence sequence for the difference, at 1 - alpha."""
    p_value: float
    """Always-valid p-value of no difference (two-sided)."""
    verdict: Verdict
    """"worse": the sequence lies wholly beyond margin on the bad side;
    "not-worse": wholly on the good side of margin; else "continue"."""


def compare(champion: Stream, challenger: Stream, alpha: float = 0.05, margin: float = 0.0,
            higher_is_worse: bool = True, tau: float | None = None) -> Comparison:
    """The mixture SPRT of challenger against champion (see the module's
    documentation): worse by more than margin (in the values' unit, in the
    bad direction: up when higher_is_worse), not worse, or not known yet.
    tau: the mixing standard deviation in the values' unit (default: TAU
    times the spread of one challenger-minus-champion difference). Until
    each arm has two values and some spread the answer is "continue"."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), not {alpha}")
    if tau is not None and not tau > 0:
        raise ValueError(f"tau must be positive, not {tau}")
    difference = challenger.mean - champion.mean if champion.n and challenger.n else math.nan
    variance = (champion.variance / champion.n + challenger.variance / challenger.n
                if min(champion.n, challenger.n) > 1 else math.nan)
    if not variance > 0:  # NaN below two values in an arm, 0 while neither varies
        return Comparison(difference, -math.inf, math.inf, 1.0, "continue")
    mixing = (tau if tau is not None else TAU * math.sqrt(champion.variance + challenger.variance)) ** 2
    half = _half_width(variance, mixing, alpha)
    low, high = difference - half, difference + half
    return Comparison(difference, low, high, math.exp(min(0.0, -_log_ratio(difference, variance, mixing))),
                      _verdict(low, high, margin, higher_is_worse))


def compare_paired(differences: Stream, alpha: float = 0.05, margin: float = 0.0,
                   higher_is_worse: bool = True, tau: float | None = None) -> Comparison:
    """compare() on paired observations: the stream of challenger - champion
    differences on the same units (the same requests). Against a champion arm
    of zeros without spread the mixture is the one-sample test of the mean
    difference; pairing takes out what the two share (how hard each request
    is), so it decides with far fewer observations than two independent arms."""
    return compare(Stream(n=differences.n), differences, alpha, margin, higher_is_worse, tau)


def _log_ratio(distance: float, variance: float, mixing: float) -> float:
    """ln L at a distance from the observed difference."""
    return 0.5 * math.log(variance / (variance + mixing)) + mixing * distance ** 2 / (2 * variance * (variance + mixing))


def _half_width(variance: float, mixing: float, alpha: float) -> float:
    """The distance at which ln L reaches ln(1/alpha)."""
    return math.sqrt(variance * (variance + mixing) / mixing
                     * (2 * math.log(1 / alpha) + math.log((variance + mixing) / variance)))


def _verdict(low: float, high: float, margin: float, higher_is_worse: bool) -> Verdict:
    # How much worse the challenger may be, as an interval: bad is positive.
    worse_low, worse_high = (low, high) if higher_is_worse else (-high, -low)
    if worse_low > margin:
        return "worse"
    if worse_high < margin:
        return "not-worse"
    return "continue"
