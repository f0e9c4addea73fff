"""Latency quantiles that repeat, with confidence intervals (pure; numpy only).

Latencies are timed in rounds: each round times every variant in turn. A
quantile is read per round and the figure is the median of those: the
quantile of a typical round. On a shared machine a round can be disturbed
(the virtual CPU stalled, a burst of interrupts); pooled over all calls, a
few such rounds decided the p99 and it moved 10-25% between identical
measurements, while the median of rounds ignores any minority of them. Each
round's quantile is Hyndman and Fan's median-unbiased estimate, so the median
of rounds sits on the true quantile when rounds hold enough calls (for p99,
about 70 or more; with fewer a round's largest call is its p99 and the
figure reads low). The interval is the distribution-free one for a median:
order statistics of the round values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Estimate:
    """A statistic and its confidence interval, in the statistic's unit."""

    value: float
    low: float
    high: float

    def beats(self, other: "Estimate") -> bool:
        """Lower with confidence: the whole interval lies below the other's."""
        return self.high < other.low

    def overlaps(self, other: "Estimate") -> bool:
        return not (self.beats(other) or other.beats(self))

    @property
    def spread(self) -> float:
        """Interval width relative to the value (0.1 = 10%)."""
        return (self.high - self.low) / self.value if self.value else math.inf

    def __str__(self) -> str:
        return f"{self.value:.4g} [{self.low:.4g}, {self.high:.4g}]"


def order_statistic_ranks(n: int, q: float, confidence: float = CONFIDENCE) -> tuple[int, int]:
    """0-based ranks of the sorted sample that bracket the q-quantile with
    the given confidence: the count of calls below the true quantile is
    Binomial(n, q) (normal approximation, clipped to the sample)."""
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    centre, sd = n * q, math.sqrt(n * q * (1 - q))
    return max(0, math.floor(centre - z * sd) - 1), min(n - 1, math.ceil(centre + z * sd))


def quantile_interval(rounds: np.ndarray, q: float, confidence: float = CONFIDENCE) -> Estimate:
    """The q-quantile (0..1) of a typical round of samples shaped [rounds,
    calls per round], with its interval. One round alone gets the order
    statistics of its calls."""
    rounds = np.asarray(rounds, dtype=float)
    if rounds.ndim != 2 or rounds.size == 0:
        raise ValueError("samples must be shaped [rounds, calls per round] and not empty")
    if len(rounds) == 1:
        flat = np.sort(rounds[0])
        lo_rank, hi_rank = order_statistic_ranks(len(flat), q, confidence)
        return Estimate(float(np.quantile(flat, q, method="median_unbiased")), float(flat[lo_rank]), float(flat[hi_rank]))
    per_round = np.sort(np.quantile(rounds, q, axis=1, method="median_unbiased"))
    lo_rank, hi_rank = order_statistic_ranks(len(per_round), 0.5, confidence)
    return Estimate(float(np.median(per_round)), float(per_round[lo_rank]), float(per_round[hi_rank]))


def ratio(numerator: Estimate, denominator: Estimate) -> Estimate:
    """numerator / denominator with the widest ratio the two intervals allow
    (a speedup: the source's latency over a variant's)."""
    return Estimate(numerator.value / denominator.value, numerator.low / denominator.high,
                    numerator.high / denominator.low)


def summary(values: list[float]) -> tuple[float, float]:
    """Median and spread ((max - min) / median) of repeated figures."""
    median = float(np.median(values))
    return median, (max(values) - min(values)) / median if median else math.inf
