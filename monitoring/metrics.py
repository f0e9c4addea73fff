"""Drift results as Prometheus gauges (Evidently has no Prometheus
integration any more; these are ours), read from the drift jobs' latest
results whenever Prometheus scrapes."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kubeloop.featurestore.base import FeatureStores
from kubeloop.featurestore.freshness import lag_seconds, max_lag_seconds, store_key


class DriftCollector(Collector):
    def __init__(self, results: Path):
        self.results = Path(results)

    def collect(self):  # noqa: ANN201 - prometheus_client protocol
        labels = ["namespace", "inferenceservice", "model", "version"]
        share = GaugeMetricFamily("kubeloop_drift_share", "Share of the model's input features that drifted "
                                  "in the latest window.", labels=labels)
        threshold = GaugeMetricFamily("kubeloop_drift_threshold", "Drift share at which the dataset counts as "
                                      "drifted (the InferenceService's driftShareThreshold).", labels=labels)
        detected = GaugeMetricFamily("kubeloop_drift_detected", "1 when the latest window drifted.", labels=labels)
        rows = GaugeMetricFamily("kubeloop_drift_rows_evaluated", "Logged requests in the latest window.",
                                 labels=labels)
        last = GaugeMetricFamily("kubeloop_drift_last_run_timestamp_seconds",
                                 "When the latest drift job finished.", labels=labels)
        score = GaugeMetricFamily("kubeloop_drift_feature_score", "Drift score per feature (the statistic or "
                                  "p-value of the test Evidently chose).", labels=[*labels, "feature", "method"])
        for path in sorted(self.results.glob("*/latest.json")):
            try:
                result = json.loads(path.read_text())
            except ValueError:
                continue
            if "service" not in result:
                continue
            namespace, name = result["service"].split("/", 1)
            values = [namespace, name, result["model"], str(result["version"])]
            rows.add_metric(values, result.get("rows", 0))
            last.add_metric(values, result["at"])
            threshold.add_metric(values, result.get("threshold", 0))
            if "share" in result:
                share.add_metric(values, result["share"])
                detected.add_metric(values, 1.0 if result["drifted"] else 0.0)
                for feature, value in result.get("scores", {}).items():
                    # A Job's compact result has no test names.
                    score.add_metric([*values, feature, result.get("methods", {}).get(feature, "")], value)
        yield from (share, threshold, detected, rows, last, score)


class FreshnessCollector(Collector):
    """How far each online store the operator materialises is behind, per
    view, computed at scrape time from the registry's record of the last
    materialised interval; and its runs by result."""

    def __init__(self, stores: FeatureStores, clock: Callable[[], float] = time.time):
        self.stores = stores
        self.clock = clock

    def collect(self):  # noqa: ANN201 - prometheus_client protocol
        labels = ["store", "project"]
        lag = GaugeMetricFamily("kubeloop_online_features_lag_seconds", "Seconds from the end of the view's last "
                                "materialised interval to now (+Inf: never materialised).", labels=[*labels, "view"])
        limit = GaugeMetricFamily("kubeloop_online_features_max_lag_seconds", "Lag at which the store counts as "
                                  "stale: three materialisation intervals.", labels=labels)
        runs = CounterMetricFamily("kubeloop_online_features_materializations", "Materialisation runs of the "
                                   "store since the operator started, by result.", labels=[*labels, "result"])
        now = self.clock()
        for state in self.stores.states():
            values = [store_key(state.need.store), state.project]
            limit.add_metric(values, max_lag_seconds(state.need.interval))
            runs.add_metric([*values, "succeeded"], state.runs - state.failed_runs)
            runs.add_metric([*values, "failed"], state.failed_runs)
            for view, end in sorted(state.ends.items()):
                lag.add_metric([*values, view], lag_seconds(now, end))
        yield from (lag, limit, runs)

