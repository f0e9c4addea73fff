"""What the serving front measured of two versions over a rollout step,
read from Prometheus as an Argo Rollouts analysis would: requests and
failures per version, their p99 latency, and the paired comparisons (the
champion's answers to requests the challenger answered).

The front's counters are per router process; increase() over the step's
window sums them across router replicas and survives their restarts."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import requests


MIN_RANGE = 10
"""Seconds: the shortest range a query reads (two of Prometheus's scrapes)."""


class AnalysisUnavailable(Exception):
    """Prometheus could not be asked (down, or refused the query): try again."""


@dataclass(frozen=True)
class TrafficSample:
    """One version pair's traffic in a window."""

    requests: dict[str, float] = field(default_factory=dict)
    """Version -> requests answered to callers (not mirrored copies)."""
    errors: dict[str, float] = field(default_factory=dict)
    """Version -> those answered with a 5xx status."""
    p99: dict[str, float] = field(default_factory=dict)
    """Version -> 99th percentile latency over the latency window, seconds
    (absent without requests there)."""
    timed: dict[str, float] = field(default_factory=dict)
    """Version -> requests answered in the latency window (the window less
    its first settle seconds)."""
    comparisons: float = 0.0
    """Paired requests: answered by the challenger and also by the champion."""
    disagreements: float = 0.0
    """Paired requests the two decided differently."""


def queries(service: str, champion: str, challenger: str, window: int, latency_window: int | None = None,
            ) -> dict[str, str]:
    """The PromQL of a sample (pure). Roles primary and canary only: the
    champion's paired answers and a shadow's copies are no caller's.
    latency_window: the trailing part of the window that p99 and timed
    read; None leaves them out."""
    callers = f'service="{service}", role=~"primary|canary", version=~"{champion}|{challenger}"'
    pair = f'service="{service}", primary="{champion}", canary="{challenger}"'
    duration = "kubeloop_inference_request_duration_seconds"
    latency = {} if latency_window is None else {
        "p99": f"histogram_quantile(0.99, sum by (le, version) (increase({duration}_bucket{{{callers}}}"
               f"[{latency_window}s])))",
        "timed": f"sum by (version) (increase({duration}_count{{{callers}}}[{latency_window}s]))",
    }
    return latency | {
        "requests": f"sum by (version) (increase(kubeloop_inference_requests_total{{{callers}}}[{window}s]))",
        "errors": f'sum by (version) (increase(kubeloop_inference_requests_total{{{callers}, code=~"5.."}}'
                  f"[{window}s]))",
        "comparisons": f"sum(increase(kubeloop_canary_comparisons_total{{{pair}}}[{window}s]))",
        "disagreements": f"sum(increase(kubeloop_canary_disagreements_total{{{pair}}}[{window}s]))",
    }


class PrometheusTraffic:
    """Samples read from a Prometheus server's query API."""

    def __init__(self, url: str, timeout: float = 5.0):
        self.url = url.rstrip("/")
        self.timeout = timeout

    def sample(self, service: str, champion: str, challenger: str, window: float, settle: float = 0.0,
               ) -> TrafficSample:
        """settle: the window's first seconds that latency does not read."""
        # Prometheus wants a whole-second range of at least two scrapes.
        latency_window = math.floor(window - settle)
        text = queries(service, champion, challenger, max(MIN_RANGE, math.ceil(window)),
                       latency_window if latency_window >= MIN_RANGE else None)
        by_version = {name: self._by_version(text[name]) if name in text else {}
                      for name in ("requests", "errors", "p99", "timed")}
        return TrafficSample(requests=by_version["requests"], errors=by_version["errors"],
                             p99={v: q for v, q in by_version["p99"].items() if math.isfinite(q)},
                             timed=by_version["timed"],
                             comparisons=self._scalar(text["comparisons"]),
                             disagreements=self._scalar(text["disagreements"]))

    def _query(self, promql: str) -> list[dict]:
        try:
            answer = requests.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=self.timeout)
            answer.raise_for_status()
            return answer.json()["data"]["result"]
        except (requests.RequestException, ValueError, KeyError) as exc:
            raise AnalysisUnavailable(f"Prometheus at {self.url} did not answer {promql!r}: {exc}") from exc

    def _by_version(self, promql: str) -> dict[str, float]:
        return {r["metric"].get("version", ""): float(r["value"][1]) for r in self._query(promql)}

    def _scalar(self, promql: str) -> float:
        result = self._query(promql)
        return float(result[0]["value"][1]) if result else 0.0
