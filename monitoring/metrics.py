"""Drift and outcome results as Prometheus gauges (Evidently has no
Prometheus integration any more; these are ours), read from the drift and
outcome jobs' latest results whenever Prometheus scrapes."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
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


LABEL_REASONS = ("matched", "late", "duplicate", "unmatched", "not_sampled", "invalid")
"""What became of the ground-truth labels of a window (kubeloop.monitoring.outcomes.join.REASONS,
which pulls in pyarrow, absent from the operator's image): each is exported, a
reason with no labels as 0, so a share of them (late over matched) never
meets a missing series."""
DELAY_QUANTILES = {"p50": "0.5", "p90": "0.9", "max": "1"}


class OutcomeCollector(Collector):
    """Live quality from the outcome jobs' latest results: per version, the
    metric on labelled traffic and how far it dropped from training time (in
    the metric's own direction, positive worse, so the rules need not know
    which metrics are lower-is-better); per service, the labels and their
    delay. A skipped or failed run has no quality to report: only its time
    and, for a skipped run, its labels."""

    def __init__(self, results: Path):
        self.results = Path(results)

    def collect(self):  # noqa: ANN201 - prometheus_client protocol
        service = ["namespace", "inferenceservice", "model"]
        version = [*service, "version", "role"]
        metric = [*version, "metric"]
        live = GaugeMetricFamily("kubeloop_live_metric", "The version's metric on the labelled predictions of the "
                                 "latest window.", labels=metric)
        live_low = GaugeMetricFamily("kubeloop_live_metric_low", "Lower end of the live metric's 95% interval.",
                                     labels=metric)
        live_high = GaugeMetricFamily("kubeloop_live_metric_high", "Upper end of the live metric's 95% interval.",
                                      labels=metric)
        trained = GaugeMetricFamily("kubeloop_training_metric", "The version's metric at training time.",
                                    labels=metric)
        drop = GaugeMetricFamily("kubeloop_live_metric_drop", "How much worse the live metric is than at training "
                                 "time, in the metric's direction (positive: worse).", labels=metric)
        drop_low = GaugeMetricFamily("kubeloop_live_metric_drop_low", "The least drop the 95% interval allows.",
                                     labels=metric)
        rows = GaugeMetricFamily("kubeloop_live_labelled_rows", "Predictions of the version with a ground-truth "
                                 "label in the latest window.", labels=version)
        max_drop = GaugeMetricFamily("kubeloop_live_metric_max_drop", "Drop at which the serving version counts as "
                                     "degraded.", labels=[*service, "metric"])
        min_rows = GaugeMetricFamily("kubeloop_live_min_rows", "Labelled predictions a version needs before its "
                                     "drop counts.", labels=service)
        labels = GaugeMetricFamily("kubeloop_ground_truth_labels", "Ground-truth labels of the latest window, by "
                                   "what became of them.", labels=[*service, "reason"])
        pending = GaugeMetricFamily("kubeloop_ground_truth_pending_predictions", "Logged predictions of the window "
                                    "still waiting for their label.", labels=service)
        # A summary's quantiles (only summaries may carry a quantile label),
        # without the _sum and _count the job does not write.
        delay = Metric("kubeloop_ground_truth_delay_seconds", "Time from a prediction to its label, by quantile "
                       "(1: the longest).", "summary")
        last = GaugeMetricFamily("kubeloop_live_last_run_timestamp_seconds", "When the latest outcome job finished.",
                                 labels=service)
        for path in sorted(self.results.glob("*/latest.json")):
            try:
                result = json.loads(path.read_text())
            except ValueError:
                continue
            if not isinstance(result, dict) or "service" not in result:
                continue
            namespace, name = result["service"].split("/", 1)
            ours = [namespace, name, result["model"]]
            last.add_metric(ours, result["at"])
            counts = result.get("labels")
            if counts is not None:
                for reason in sorted(set(LABEL_REASONS) | set(counts)):
                    labels.add_metric([*ours, reason], counts.get(reason, 0))
            if "versions" not in result:
                continue
            named = [*ours, result["metric"]]
            max_drop.add_metric(named, result["max_drop"])
            min_rows.add_metric(ours, result["min_rows"])
            pending.add_metric(ours, result.get("pending", 0))
            delays = result.get("delay_seconds") or {}
            for key, quantile in DELAY_QUANTILES.items():
                if delays.get(key) is not None:
                    delay.add_sample(delay.name, dict(zip(service, ours, strict=True), quantile=quantile), delays[key])
            for number, scored in sorted(result["versions"].items()):
                which = [*ours, number, scored["role"]]
                rows.add_metric(which, scored.get("rows", 0))
                each = [*which, result["metric"]]
                # A version registered without the metric has no trained value
                # and so no drop; one without labelled rows yet has neither.
                _add(trained, each, scored.get("trained"))
                quality, dropped = scored.get("live") or {}, scored.get("drop") or {}
                _add(live, each, quality.get("value"))
                _add(live_low, each, quality.get("low"))
                _add(live_high, each, quality.get("high"))
                _add(drop, each, dropped.get("value"))
                _add(drop_low, each, dropped.get("low"))
        yield from (live, live_low, live_high, trained, drop, drop_low, rows, max_drop, min_rows, labels, pending,
                    delay, last)


def _add(family: GaugeMetricFamily, values: list[str], value: float | None) -> None:
    """A sample only where the job had a number: no sample reads as unknown, a 0 would read as no drop."""
    if value is not None:
        family.add_metric(values, value)


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

