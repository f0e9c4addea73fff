"""The validate step on real training data (Feast's point-in-time join
written to Parquet) against a real MLflow store (sqlite): the first run
records its schema, a later run is compared with the champion's, fail mode
raises naming the column and logs the report on a failed run, warn mode
carries the findings onto the registered version. These run the step bodies
the local backend's kfp runner runs (local path)."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

from kubeloop.components import steps
from kubeloop.components.validation import DataValidationError
from kubeloop.registry import tags


@pytest.fixture
def tracking(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the sqlite store keeps artifacts under ./mlruns
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def spec_with(job_spec, **fields) -> str:
    wire = job_spec.to_wire()
    return json.dumps({**wire, "hyperparameters": {**wire["hyperparameters"], "epochs": 1}, **fields})


def train_and_register(spec: str, path, info: str, tracking: str, run: str, tmp_path) -> str:
    report = steps.validate_step(spec, str(path), info, tracking, run, "ns/job")
    model_dir = str(tmp_path / f"model-{run}")
    run_id = steps.train_step(spec, str(path), info, model_dir, tracking, run, "ns/job", "h", "sha", report)
    evaluation = steps.evaluate_step(spec, str(path), info, model_dir, tracking, run_id)
    return steps.register_step(spec, info, model_dir, evaluation, tracking, run_id, run, "ns/job", "sha")["model"][
        "version"]


def test_a_corrupted_column_fails_against_the_champion_and_warn_mode_records_it(tracking, dataset, job_spec,
                                                                                tmp_path):
    client = MlflowClient(tracking)
    info = dataset["info"]
    first = train_and_register(spec_with(job_spec), dataset["path"], info.to_json(), tracking, "ns-job-1", tmp_path)
    version = client.get_model_version("fraud-test", first)
    # No spec.validation: nothing checked, the schema kept as the next job's baseline.
    assert version.tags[tags.VALIDATION] == "not configured"
    schema_uri = version.tags[tags.DATA_SCHEMA]
    assert schema_uri == f"runs:/{version.run_id}/validation/data_schema.json"
    schema = json.loads(Path(mlflow.artifacts.download_artifacts(schema_uri, dst_path=str(tmp_path))).read_text())
    column = next(c for c in info.feature_columns if schema["columns"][c]["max"] > 1)
    assert set(info.feature_columns) <= set(schema["columns"])
    client.set_registered_model_alias("fraud-test", "champion", first)

    corrupted = tmp_path / "corrupted.parquet"
    frame = pd.read_parquet(dataset["path"])
    frame[column] = frame[column] * 1000
    frame.to_parquet(corrupted, index=False)

    failing = spec_with(job_spec, validation={})
    with pytest.raises(DataValidationError) as raised:
        steps.validate_step(failing, str(corrupted), info.to_json(), tracking, "ns-job-2", "ns/job")
    message = str(raised.value)
    assert "\n" not in message and message.startswith("data validation failed, ")
    assert f"column '{column}'" in message and "maxOutOfRangeShare" in message
    assert f"column '{column}': PSI" in message
    failed = client.search_runs([client.get_experiment_by_name("kubeloop/fraud-test").experiment_id],
                                "tags.`kubeloop.pipeline_run` = 'ns-job-2'")
    assert failed[0].info.status == "FAILED" and failed[0].data.tags[tags.VALIDATION].startswith("fail: ")
    report = json.loads(Path(client.download_artifacts(failed[0].info.run_id, "validation/report.json",
                                                       str(tmp_path))).read_text())
    assert report["champion"]["version"] == first and report["champion"]["psi"][column] > 0.25
    # The champion's own data passes the comparison.
    steps.validate_step(failing, str(dataset["path"]), info.to_json(), tracking, "ns-job-3", "ns/job")

    warning = spec_with(job_spec, validation={"mode": "warn", "rules": [{"column": column, "max": 1.0}]})
    second = train_and_register(warning, corrupted, info.to_json(), tracking, "ns-job-4", tmp_path)
    recorded = client.get_model_version("fraud-test", second).tags[tags.VALIDATION]
    assert recorded.startswith("warn: ") and f"column '{column}'" in recorded and "outside [-inf, 1]" in recorded
    run = client.get_run(client.get_model_version("fraud-test", second).run_id)
    assert run.data.tags[tags.VALIDATION] == recorded
    assert {a.path for a in client.list_artifacts(run.info.run_id, "validation")} == {
        "validation/report.json", "validation/data_schema.json"}


def test_a_spec_rule_fails_the_first_run_without_a_champion(tracking, dataset, job_spec, tmp_path):
    """No champion: only spec.validation's rules apply; a null share over
    maxNullShare fails naming the column, rule and values."""
    info = dataset["info"]
    column = info.feature_columns[0]
    frame = pd.read_parquet(dataset["path"])
    frame.loc[frame.index[: int(len(frame) * 0.9)], column] = np.nan
    nulls = tmp_path / "nulls.parquet"
    frame.to_parquet(nulls, index=False)
    spec = spec_with(job_spec, validation={"rules": [{"column": column, "maxNullShare": 0.05}]})
    with pytest.raises(DataValidationError, match=rf"column '{column}': null share 0.9 is above maxNullShare 0.05"):
        steps.validate_step(spec, str(nulls), info.to_json(), tracking, "ns-job-5", "ns/job")
    passed = json.loads(steps.validate_step(spec, str(dataset["path"]), info.to_json(), tracking, "ns-job-6",
                                            "ns/job"))
    assert passed["passed"] and passed["summary"] == "passed" and passed["champion"] is None
