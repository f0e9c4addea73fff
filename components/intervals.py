"""Confidence intervals for latency quantiles (pure; numpy only).

Latencies are timed in rounds: each round times every variant in turn, so a
moment of noise (another process on the core, a frequency step) falls on all
of them alike. A quantile's interval resamples whole rounds (a block
bootstrap), so what changes between rounds widens it; it is joined with the
distribution-free order-statistic interval, which the bootstrap undercuts for
a tail quantile of few calls.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 400


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


def quantile_interval(rounds: np.ndarray, q: float, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                      seed: int = 0) -> Estimate:
    """The q-quantile (0..1) of samples shaped [rounds, calls per round] with
    its interval: the round bootstrap's joined with the order statistics'."""
    rounds = np.asarray(rounds, dtype=float)
    if rounds.ndim != 2 or rounds.size == 0:
        raise ValueError("samples must be shaped [rounds, calls per round] and not empty")
    flat = np.sort(rounds.ravel())
    lo_rank, hi_rank = order_statistic_ranks(len(flat), q, confidence)
    low, high = float(flat[lo_rank]), float(flat[hi_rank])
    if len(rounds) > 1:
        picks = np.random.default_rng(seed).integers(0, len(rounds), size=(resamples, len(rounds)))
        boot = np.quantile(rounds[picks].reshape(resamples, -1), q, axis=1)
        tails = np.quantile(boot, [(1 - confidence) / 2, (1 + confidence) / 2])
        low, high = min(low, float(tails[0])), max(high, float(tails[1]))
    return Estimate(float(np.quantile(flat, q)), low, high)


def ratio(numerator: Estimate, denominator: Estimate) -> Estimate:
    """numerator / denominator with the widest ratio the two intervals allow
    (a speedup: the source's latency over a variant's)."""
    return Estimate(numerator.value / denominator.value, numerator.low / denominator.high,
                    numerator.high / denominator.low)


def summary(values: list[float]) -> tuple[float, float]:
    """Median and spread ((max - min) / median) of repeated figures."""
    median = float(np.median(values))
    return median, (max(values) - min(values)) / median if median else math.inf
