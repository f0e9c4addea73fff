"""The outcome jobs' results reach Prometheus as the gauges the outcome
alerts read: per version the live metric, its drop from training time and
the labelled rows; per service the thresholds, the labels by reason, the
pending predictions and the label delay. Skipped and failed runs report only
their time (and their labels); a broken result file is passed over
(pure, local)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from kubeloop.monitoring.metrics import OutcomeCollector

FULL = {
    "service": "ml/fraud", "model": "fraud", "at": 1764170000.0, "task": "binary", "metric": "auc",
    "max_drop": 0.05, "min_rows": 200, "window_seconds": 86400,
    "labels": {"matched": 900, "late": 3, "duplicate": 2, "unmatched": 1, "not_sampled": 50},
    "pending": 120, "delay_seconds": {"p50": 3600.0, "p90": 7200.0, "max": 9000.0},
    "versions": {
        "3": {"role": "primary", "rows": 800, "trained": 0.91, "live": {"value": 0.84, "low": 0.81, "high": 0.87},
              "drop": {"value": 0.07, "low": 0.04, "high": 0.10}},
        "4": {"role": "canary", "rows": 100, "trained": 0.93, "live": {"value": 0.92, "low": 0.88, "high": 0.96},
              "drop": {"value": 0.01, "low": -0.03, "high": 0.05}},
        # Just rolled out: no labelled predictions yet, so no metric either.
        "5": {"role": "paired", "rows": 0, "trained": 0.92},
        # Registered without the metric: live quality, but no drop to judge.
        "6": {"role": "shadow", "rows": 40, "trained": None, "live": {"value": 0.8, "low": 0.7, "high": 0.9}},
    },
    "report": "runs:/abc/outcomes/report.json",
}
SKIPPED = {"service": "ml/ads", "model": "ads", "at": 1764170100.0, "skipped": "no labels in the window",
           "labels": {"matched": 0, "late": 4}}
FAILED = {"service": "ml/churn", "model": "churn", "at": 1764170200.0, "error": "the label source is unreachable"}


def write(root: Path, folder: str, text: str) -> None:
    (root / folder).mkdir(parents=True)
    (root / folder / "latest.json").write_text(text)


@pytest.fixture
def registry(tmp_path: Path) -> CollectorRegistry:
    write(tmp_path, "ml-fraud", json.dumps(FULL))
    write(tmp_path, "ml-ads", json.dumps(SKIPPED))
    write(tmp_path, "ml-churn", json.dumps(FAILED))
    write(tmp_path, "ml-broken", '{"service": "ml/broken", "model": "bro')  # a job killed mid-write
    registry = CollectorRegistry()
    registry.register(OutcomeCollector(tmp_path))
    return registry


def fraud(**labels: str) -> dict[str, str]:
    return {"namespace": "ml", "inferenceservice": "fraud", "model": "fraud", **labels}


def test_each_version_reports_its_live_metric_its_drop_and_its_labelled_rows(registry):
    value = registry.get_sample_value
    primary = fraud(version="3", role="primary", metric="auc")
    assert value("kubeloop_live_metric", primary) == 0.84
    assert value("kubeloop_live_metric_low", primary) == 0.81
    assert value("kubeloop_live_metric_high", primary) == 0.87
    assert value("kubeloop_training_metric", primary) == 0.91
    assert value("kubeloop_live_metric_drop", primary) == 0.07
    assert value("kubeloop_live_metric_drop_low", primary) == 0.04
    assert value("kubeloop_live_labelled_rows", fraud(version="3", role="primary")) == 800
    canary = fraud(version="4", role="canary", metric="auc")
    assert value("kubeloop_live_metric_drop_low", canary) == -0.03  # may be better than at training
    assert value("kubeloop_live_labelled_rows", fraud(version="4", role="canary")) == 100


def test_a_version_without_labels_or_a_trained_metric_reports_what_it_has(registry):
    """No sample, rather than a 0 that would read as a version that did not drop."""
    paired = fraud(version="5", role="paired", metric="auc")
    assert registry.get_sample_value("kubeloop_live_labelled_rows", fraud(version="5", role="paired")) == 0
    assert registry.get_sample_value("kubeloop_training_metric", paired) == 0.92
    for name in ("kubeloop_live_metric", "kubeloop_live_metric_low", "kubeloop_live_metric_high",
                 "kubeloop_live_metric_drop", "kubeloop_live_metric_drop_low"):
        assert registry.get_sample_value(name, paired) is None, name
    shadow = fraud(version="6", role="shadow", metric="auc")
    assert registry.get_sample_value("kubeloop_live_metric", shadow) == 0.8
    for name in ("kubeloop_training_metric", "kubeloop_live_metric_drop", "kubeloop_live_metric_drop_low"):
        assert registry.get_sample_value(name, shadow) is None, name


def test_each_service_reports_its_thresholds_labels_and_delay(registry):
    value = registry.get_sample_value
    assert value("kubeloop_live_metric_max_drop", fraud(metric="auc")) == 0.05
    assert value("kubeloop_live_min_rows", fraud()) == 200
    assert value("kubeloop_ground_truth_pending_predictions", fraud()) == 120
    assert {reason: value("kubeloop_ground_truth_labels", fraud(reason=reason))
            for reason in ("matched", "late", "duplicate", "unmatched", "not_sampled")} == {
        "matched": 900, "late": 3, "duplicate": 2, "unmatched": 1, "not_sampled": 50}
    assert {quantile: value("kubeloop_ground_truth_delay_seconds", fraud(quantile=quantile))
            for quantile in ("0.5", "0.9", "1")} == {"0.5": 3600.0, "0.9": 7200.0, "1": 9000.0}
    assert value("kubeloop_live_last_run_timestamp_seconds", fraud()) == 1764170000.0


def test_skipped_and_failed_runs_report_their_time_and_their_labels_only(registry):
    ads = {"namespace": "ml", "inferenceservice": "ads", "model": "ads"}
    churn = {"namespace": "ml", "inferenceservice": "churn", "model": "churn"}
    assert registry.get_sample_value("kubeloop_live_last_run_timestamp_seconds", ads) == 1764170100.0
    assert registry.get_sample_value("kubeloop_live_last_run_timestamp_seconds", churn) == 1764170200.0
    # Every reason is exported, those the job did not count as 0.
    assert {reason: registry.get_sample_value("kubeloop_ground_truth_labels", {**ads, "reason": reason})
            for reason in ("matched", "late", "duplicate", "unmatched", "not_sampled")} == {
        "matched": 0, "late": 4, "duplicate": 0, "unmatched": 0, "not_sampled": 0}
    services = {(sample.labels["inferenceservice"], sample.name) for family in registry.collect()
                for sample in family.samples if sample.labels["inferenceservice"] != "fraud"}
    assert services == {("ads", "kubeloop_live_last_run_timestamp_seconds"), ("ads", "kubeloop_ground_truth_labels"),
                        ("churn", "kubeloop_live_last_run_timestamp_seconds")}


def test_a_result_that_is_not_json_is_passed_over(registry):
    reported = {sample.labels["inferenceservice"] for family in registry.collect() for sample in family.samples}
    assert reported == {"fraud", "ads", "churn"}


def test_no_results_yet_exposes_no_samples(tmp_path):
    registry = CollectorRegistry()
    registry.register(OutcomeCollector(tmp_path / "outcomes"))  # the folder the first job creates
    assert [sample for family in registry.collect() for sample in family.samples] == []
