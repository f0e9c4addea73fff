"""Drift evaluation with Evidently, and the metrics and rules around it."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kubeloop.monitoring.drift import evaluate, load_requests
from kubeloop.monitoring.metrics import DriftCollector

FEATURES = [f"f{i}" for i in range(6)]
RULES = Path(__file__).resolve().parents[2] / "monitoring" / "rules"


def frame(rows: int, shift: float = 0.0, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    data = rng.normal(0, 1, (rows, len(FEATURES)))
    data[:, :3] += shift  # half the features move
    return pd.DataFrame(data, columns=FEATURES)


def test_a_shift_in_half_the_features_is_drift_and_none_is_not(tmp_path):
    reference = frame(5000, seed=1)
    same = evaluate(reference, frame(2000, seed=2), FEATURES, threshold=0.3)
    assert not same.drifted and same.share < 0.3
    moved = evaluate(reference, frame(2000, shift=1.0, seed=3), FEATURES, threshold=0.3, report=tmp_path / "r.html")
    assert moved.drifted and moved.share == pytest.approx(0.5)
    assert moved.features_drifted == ["f0", "f1", "f2"]
    assert set(moved.scores) == set(FEATURES) and (tmp_path / "r.html").stat().st_size > 10_000


def test_sampling_bounds_the_work_and_keeps_the_verdict():
    reference, current = frame(60_000, seed=4), frame(60_000, shift=0.5, seed=5)
    full = evaluate(reference, current, FEATURES, threshold=0.3)
    sampled = evaluate(reference, current, FEATURES, threshold=0.3, sample_rows=10_000)
    assert sampled.sampled and not full.sampled
    assert sampled.drifted == full.drifted and sampled.features_drifted == full.features_drifted


def test_the_request_log_is_read_by_window_without_mirrored_copies(tmp_path):
    """A shadow's copy and the champion's paired second opinion carry the
    same rows as the answer they copy: read, they would count it twice."""
    now = time.time()
    rows = [{"ts": now - 3600, "role": "primary", "features": [[9.0] * 6]},
            {"ts": now - 10, "role": "primary", "features": [[1.0] * 6, [2.0] * 6]},
            {"ts": now - 5, "role": "canary", "features": [[3.0] * 6]},
            {"ts": now - 5, "role": "shadow", "features": [[3.0] * 6], "outputs": [0.1]},
            {"ts": now - 5, "role": "paired", "features": [[3.0] * 6], "outputs": [0.2]},
            {"ts": now - 5, "role": "primary", "features": [[7.0] * 4]}]  # a version with other inputs
    # The router is mid-write: the last line has no newline yet.
    partial = json.dumps({"ts": now, "role": "primary", "features": [[4.0] * 6]})[:-7]
    (tmp_path / "requests-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + partial)
    current = load_requests(tmp_path, now - 60, FEATURES)
    assert current["f0"].tolist() == [1.0, 2.0, 3.0]


def test_drift_gauges_pass_promtool_check_metrics(tmp_path):
    folder = tmp_path / "ml-fraud"
    folder.mkdir()
    moved = evaluate(frame(2000, seed=1), frame(1000, shift=1.0, seed=2), FEATURES, threshold=0.3)
    result = {"service": "ml/fraud", "model": "fraud", "version": "3", **json.loads(moved.to_json()),
              "report": "runs:/x/drift/report.html"}
    (folder / "latest.json").write_text(json.dumps(result))
    registry = CollectorRegistry()
    registry.register(DriftCollector(tmp_path))
    text = generate_latest(registry).decode()
    assert 'kubeloop_drift_share{inferenceservice="fraud",model="fraud",namespace="ml",version="3"} 0.5' in text
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_alert_rules_are_valid_and_their_unit_tests_pass():
    check = subprocess.run(["promtool", "check", "rules", *map(str, RULES.glob("*.yaml"))], capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    tests = subprocess.run(["promtool", "test", "rules", *map(str, (RULES / "tests").glob("*.yaml"))],
                           capture_output=True, text=True)
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "SUCCESS" in tests.stdout


def test_router_and_webhook_metrics_pass_promtool_check_metrics():
    from kubeloop.operator.webhooks import WebhookConfig, Webhooks
    from kubeloop.front.router import Metrics

    router = Metrics()
    router.latency.labels("ml/fraud", "fraud", "3", "primary").observe(0.002)
    router.requests.labels("ml/fraud", "fraud", "3", "primary", "200").inc()
    router.scores.labels("ml/fraud", "fraud", "3").observe(0.04)
    router.shadow_comparisons.labels("ml/fraud", "fraud", "3", "4").inc()
    router.shadow_disagreements.labels("ml/fraud", "fraud", "3", "4").inc()
    router.traffic.labels("ml/fraud", "fraud", "3", "primary").set(0.8)
    operator = CollectorRegistry()
    router.shadow_skipped.labels("ml/fraud").inc()
    router.log_dropped.labels("ml/fraud").inc()
    router.log_errors.labels("ml/fraud").inc()
    router.log_removed.labels("ml/fraud").inc()
    config = WebhookConfig(lambda: "t", lambda: "s")
    Webhooks(kube=None, config=config, registry=operator).received.labels("mlflow", "accepted").inc()
    for registry in (router.registry, operator):
        text = generate_latest(registry).decode()
        lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        assert lint.returncode == 0, lint.stdout + lint.stderr


def _run_drift_job(tmp_path, monkeypatch, dataset, version_tags, log_reference: bool = False):  # noqa: ANN001
    """Register a version with these tags (and the training rows as its run's
    reference, if asked), log 600 of its training rows as requests, run the
    job in this process against a real MLflow (sqlite); the job's default
    Feast repository does not exist."""
    import mlflow
    import pandas as pd
    from mlflow import MlflowClient

    from kubeloop.components.registration import log_reference as log_ref
    from kubeloop.monitoring.job import run

    monkeypatch.chdir(tmp_path)  # the sqlite store keeps the job's report under ./mlruns
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    info = dataset["info"]
    mlflow.set_tracking_uri(tracking)
    mlflow.set_experiment("drift-source")  # not the experiment an earlier test's job left active
    with mlflow.start_run() as source_run:
        mlflow.log_param("source", "test")
    run_id = source_run.info.run_id
    if log_reference:
        log_ref(tracking, run_id, pd.DataFrame(dataset["x"], columns=info.feature_columns))
        version_tags = {**version_tags, "kubeloop.reference": f"runs:/{run_id}/reference/train.parquet"}
    client = MlflowClient(tracking)
    client.create_registered_model("fraud-drift")
    version = client.create_model_version("fraud-drift", f"runs:/{run_id}/model", run_id, tags=version_tags).version
    rows = dataset["x"][np.random.default_rng(0).choice(len(dataset["x"]), 600, replace=False)]
    log = tmp_path / "requests"
    log.mkdir()
    now = time.time()
    (log / "requests-1.jsonl").write_text("".join(
        json.dumps({"ts": now - 1, "role": "primary", "version": version, "features": rows[i:i + 50].tolist(),
                    "outputs": [0.1] * len(rows[i:i + 50])}) + "\n" for i in range(0, len(rows), 50)))
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "job.json").write_text(json.dumps({
        "service": "ml/fraud", "model": "fraud-drift", "version": version, "tracking_uri": tracking,
        "feast_repo": str(tmp_path / "no-such-repository"),
        "feature_store": version_tags.get("kubeloop.feature_store", ""), "request_log": str(log),
        "window_seconds": 3600, "threshold": 0.5, "features": [], "columns": info.feature_columns,
        "min_rows": 100}))
    result = run(folder)
    assert result["rows"] == 600
    assert set(result["scores"]) == set(info.feature_columns) and result["drifted"] is False, result
    assert (folder / f"reference-fraud-drift-{version}.parquet").exists()
    return result


def test_the_drift_job_compares_requests_with_the_training_data_of_the_versions_own_store(
        feature_repo, job_spec, dataset, tmp_path, monkeypatch):
    """Local backend's drift job, a version without a logged reference: the
    reference is rebuilt from the store the version's tag names, over the
    columns job.json names, and logged rows of that same training data do
    not drift."""
    from kubeloop.components.data import pinned
    from kubeloop.featurestore.store import StoreLocation
    from kubeloop.registry import tags

    info = dataset["info"]
    result = _run_drift_job(tmp_path, monkeypatch, dataset, {
        tags.TRAINING_SPEC: pinned(job_spec, info).model_dump_json(by_alias=True, exclude_none=True),
        tags.FEATURE_STORE: StoreLocation(path=str(feature_repo)).to_json()})
    assert result["reference_rows"] == info.train_rows


def test_the_drift_job_reads_the_reference_the_training_run_logged_without_a_feature_store(
        dataset, tmp_path, monkeypatch):
    """The drift job as a Pod on a cluster runs it (no feature store folder
    there): the version's kubeloop.reference names the training sample its
    run logged, and the job reads that from the registry; the version names
    no feature store at all, so a rebuild would fail."""
    result = _run_drift_job(tmp_path, monkeypatch, dataset, {}, log_reference=True)
    assert result["reference_rows"] == len(dataset["x"])
