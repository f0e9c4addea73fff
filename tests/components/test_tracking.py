"""The pipeline's steps against a real MLflow store (sqlite): tuning trials
as nested runs, lineage tags, idempotent registration."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

from kubeloop.api.training import TrainingJobSpec
from kubeloop.components import steps
from kubeloop.components.data import build_dataset
from kubeloop.featurestore.store import StoreLocation


def test_tuning_logs_nested_trials_and_registration_is_idempotent(tracking, dataset, job_spec, tmp_path):
    spec = json.dumps({**job_spec.to_wire(), "tuning": {"trials": 3, "algorithm": "random", "parameters": {
        "learningRate": {"min": 0.0005, "max": 0.01, "log": True}, "dropout": {"choices": [0.0, 0.2]}}},
        "promotion": {"registerAs": "Staging"}})
    info = dataset["info"].to_json()
    model_dir = str(tmp_path / "model")
    run_id = steps.train_step(spec, str(dataset["path"]), info, model_dir, tracking, "ns-job-1", "ns/job", "h",
                              "deadbeef")
    client = MlflowClient(tracking)
    run = client.get_run(run_id)
    children = client.search_runs([run.info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'")
    assert len(children) == 3
    assert {c.data.tags["kubeloop.trial"] for c in children} == {"0", "1", "2"}
    assert all("auc" in c.data.metrics and "learningRate" in c.data.params for c in children)
    best = json.loads(run.data.tags["train.best_hyperparameters"])
    best_trial = max(children, key=lambda c: c.data.metrics["auc"])
    assert best["learningRate"] == pytest.approx(float(best_trial.data.params["learningRate"]))
    assert run.data.tags["dataloader.tuned"] == "True" and run.data.tags["train.precision"] == "fp32"

    evaluation = steps.evaluate_step(spec, str(dataset["path"]), info, model_dir, tracking, run_id)
    assert set(json.loads(evaluation)["slices"]) == {"in_store", "online", "contactless"}
    first = steps.register_step(spec, info, model_dir, evaluation, tracking, run_id, "ns-job-1", "ns/job", "deadbeef")
    again = steps.register_step(spec, info, model_dir, evaluation, tracking, run_id, "ns-job-1", "ns/job", "deadbeef")
    assert first["model"] == again["model"] and first["model"]["version"] == "1"
    assert first["bottleneck"] == {"verdict": run.data.tags["bottleneck.verdict"],
                                   "advice": run.data.tags["bottleneck.advice"]}
    version = client.get_model_version("fraud-test", "1")
    assert version.tags["git_sha"] == "deadbeef" and version.tags["dataset_hash"] == dataset["info"].dataset_hash
    # The legacy stage name is mapped onto its alias.
    assert str(client.get_model_version_by_alias("fraud-test", "challenger").version) == "1"
    artifacts = {a.path for a in client.list_artifacts(run_id, "exported")}
    assert artifacts == {"exported/model.onnx", "exported/model.pt", "exported/model_card.json", "exported/state.pt"}


def test_a_label_column_kept_out_of_the_model_slices_its_evaluation(tracking, feature_repo, dataset, job_spec,
                                                                      tmp_path):
    """The usual slice, a region (or a sensitive attribute) the labelled rows
    carry and the model must not see: evaluated per value, never an input."""
    rows = pd.read_parquet(feature_repo / "data" / "transactions.parquet")
    rows["region"] = np.where(rows["card_id"] % 2 == 0, "north", "south")
    rows.to_parquet(tmp_path / "labels.parquet")
    wire = job_spec.to_wire()
    wire["features"]["labels"] = {"path": str(tmp_path / "labels.parquet"), "column": "is_fraud",
                                  "timestampColumn": "event_timestamp"}
    wire["evaluation"]["sliceColumn"] = "region"
    path = tmp_path / "data.parquet"
    info = build_dataset(TrainingJobSpec.model_validate(wire), StoreLocation(path=str(feature_repo)).to_json(), path)
    assert info.slice_column == "region"
    assert info.feature_columns == dataset["info"].feature_columns
    assert info.dataset_hash == dataset["info"].dataset_hash

    spec, model_dir = json.dumps(wire), str(tmp_path / "model")
    run_id = steps.train_step(spec, str(path), info.to_json(), model_dir, tracking, "ns-job-2", "ns/job", "h",
                              "deadbeef")
    evaluation = json.loads(steps.evaluate_step(spec, str(path), info.to_json(), model_dir, tracking, run_id))
    slices = evaluation["slices"]
    assert set(slices) == {"north", "south"}
    assert sum(s["rows"] for s in slices.values()) == evaluation["metrics"]["rows"]
    assert all(np.isfinite(s["auc"]) for s in slices.values())
