"""Data validation before training, end to end on the local backend: the
operator runs the training pipeline with kfp's local runner against a
feature repository of the test's own, MLflow of the platform. These prove
the local path; the cluster (KFP) path runs the same validate step, proven
only by the IR tests."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml
from mlflow import MlflowClient

from kubeloop.featurestore.generate import Scenario, default_start
from kubeloop.featurestore.store import create_repository
from kubeloop.registry import tags
from tests.support.faults import condition, status_of, training_job
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e
COLUMN = "credit_limit"  # card_profile's: every joined row carries the card's value


def finished(kube, namespace: str, name: str, timeout: float = 420) -> dict:
    return wait_for(lambda: (s := status_of(kube, "TrainingJob", namespace, name)).get("phase")
                    in ("Succeeded", "Failed") and s, timeout=timeout, interval=1, what=f"{name} finished")


def test_a_warn_rule_is_recorded_on_the_version_and_a_corrupted_column_fails_the_next_run(
        platform, kube, kubectl, namespace, start_operator, tmp_path):
    """One training run: a warn-only rule registers the version (promoted to
    champion) with its finding; after the store's credit_limit is scaled
    1000x, a fail-mode job fails at the validate step naming the column
    against the champion's schema, and registers nothing."""
    env = platform.env()
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    repo = create_repository(tmp_path / "featurestore", Scenario(start=default_start(30), days=30, cards=800))
    op = start_operator([namespace], KUBELOOP_REGISTRY="mlflow", MLFLOW_TRACKING_URI=env["MLFLOW_TRACKING_URI"],
                        KUBELOOP_FEAST_REPO=str(repo), KUBELOOP_PIPELINE_BACKENDS="local",
                        KUBELOOP_PIPELINE_BACKEND="local")
    op.wait_for_log("Initial authentication has finished", timeout=60)

    warned = training_job(namespace, "warned", promotion={"promoteTo": "champion"},
                          validation={"mode": "warn", "rules": [{"column": COLUMN, "max": 10000}]})
    warned["spec"]["hyperparameters"]["epochs"] = 1
    model = warned["spec"]["modelName"]
    kubectl("apply", "-f", "-", input=yaml.safe_dump(warned))
    status = finished(kube, namespace, "warned")
    assert status["phase"] == "Succeeded", status
    version = client.get_model_version(model, status["model"]["version"])
    recorded = version.tags[tags.VALIDATION]
    assert recorded.startswith("warn: 1 finding: ") and f"column '{COLUMN}'" in recorded, recorded
    assert "outside [-inf, 10000]" in recorded
    wait_for(lambda: client.get_model_version_by_alias(model, "champion").version == version.version, timeout=60,
             what="the warned version promoted to champion")

    profile = repo / "data" / "card_profile.parquet"
    cards = pd.read_parquet(profile)
    cards[COLUMN] = cards[COLUMN] * 1000
    cards.to_parquet(profile, index=False)
    corrupted = training_job(namespace, "corrupted", validation={})
    corrupted["spec"].update(modelName=model, hyperparameters={**warned["spec"]["hyperparameters"]})
    corrupted["spec"].pop("promotion")
    kubectl("apply", "-f", "-", input=yaml.safe_dump(corrupted))
    failed = finished(kube, namespace, "corrupted", timeout=300)
    assert failed["phase"] == "Failed", failed
    message = condition(failed, "RunSucceeded")["message"]
    assert "step validate-data" in message and "data validation failed" in message, message
    assert f"column '{COLUMN}'" in message and "maxOutOfRangeShare" in message, message
    assert f"champion's (version {version.version})" in message, message
    assert len(client.search_model_versions(f"name = '{model}'")) == 1
