"""MLflow tracking and registration with lineage.

A training run records its parameters, metrics, the data it saw (dataset
hash, feature views and their definition fingerprints, rows dropped by ttl),
the code (git sha) and the environment; the model is logged natively and as
TorchScript and ONNX, and registered as a new version whose tags carry the
same lineage. Registration is idempotent per pipeline run.
"""

from __future__ import annotations

import json
import platform
import tempfile
from importlib import metadata
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import torch
from mlflow import MlflowClient

from kubeloop.api.promotion import alias_for
from kubeloop.api.signature import TAG as SIGNATURE_TAG, ModelSignature
from kubeloop.api.training import TrainingJobSpec
from kubeloop.components.bottleneck import metrics_of
from kubeloop.components.data import DatasetInfo, pinned
from kubeloop.components.model import TaskModel, export_onnx, export_torchscript, factory_code, save_model
from kubeloop.registry import tags
from kubeloop.registry.mlflow import run_url

EXPORTED = "exported"
REFERENCE = "reference/train.parquet"
BOTTLENECK = "bottleneck"  # the folder of bottleneck.json and the profiler's trace.json.gz
VERDICT_TAG, ADVICE_TAG = "bottleneck.verdict", "bottleneck.advice"


def experiment_name(spec: TrainingJobSpec) -> str:
    return f"kubeloop/{spec.model_name}"


def environment() -> dict[str, str]:
    packages = ("torch", "numpy", "pandas", "feast", "mlflow", "kfp", "onnx", "scikit-learn", "kubeloop")
    env = {"python": platform.python_version(), "platform": platform.platform()}
    for name in packages:
        try:
            env[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return env


def _flatten(prefix: str, value, out: dict) -> dict:  # noqa: ANN001
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else k, v, out)
    else:
        out[prefix] = json.dumps(value) if isinstance(value, list) else value
    return out


def start_run(tracking_uri: str, spec: TrainingJobSpec, pipeline_run: str, owner: str, spec_hash: str,
              git_sha: str) -> str:
    """The parent MLflow run of a training pipeline run."""
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment(experiment_name(spec))
    wire = spec.to_wire()
    params = _flatten("", {k: wire[k] for k in ("hyperparameters", "evaluation", "distributed", "seed")}, {})
    params["features.featureViews"] = json.dumps(spec.features.feature_views)
    params["task"] = spec.task
    if spec.model is not None:
        params["model.factory"] = spec.model.factory
    run_tags = {tags.PIPELINE_RUN: pipeline_run, tags.OWNER: owner, "kubeloop.spec_hash": spec_hash,
            "mlflow.source.git.commit": git_sha, "git_sha": git_sha,
            **{f"env.{k}": v for k, v in environment().items()}}
    with mlflow.start_run(run_name=pipeline_run, tags=run_tags) as run:
        mlflow.log_params(params)
        return run.info.run_id


def log_trial(tracking_uri: str, parent_run_id: str, number: int, params: dict, metric: str, score: float) -> None:
    """One tuning trial as a run nested under the training run."""
    mlflow.set_tracking_uri(tracking_uri)
    parent = MlflowClient(tracking_uri).get_run(parent_run_id)
    client = MlflowClient(tracking_uri)
    child = client.create_run(parent.info.experiment_id, run_name=f"trial-{number}",
                              tags={"mlflow.parentRunId": parent_run_id, "kubeloop.trial": str(number)})
    for key, value in params.items():
        client.log_param(child.info.run_id, key, value)
    client.log_metric(child.info.run_id, metric, float(score))
    client.set_terminated(child.info.run_id)


def log_training(tracking_uri: str, run_id: str, dataset: DatasetInfo, history: list[dict], extra: dict) -> None:
    client = MlflowClient(tracking_uri)
    for record in history:
        for key, value in record.items():
            if key != "epoch" and value == value:  # NaN-free
                client.log_metric(run_id, f"train.{key}", float(value), step=record["epoch"])
    for key, value in {**extra, "dataset.hash": dataset.dataset_hash, "dataset.rows": dataset.rows,
                       "dataset.dropped_by_ttl": dataset.dropped_by_ttl,
                       "dataset.entity_rows": dataset.entity_rows}.items():
        client.set_tag(run_id, key, str(value))


def log_bottleneck(tracking_uri: str, run_id: str, report: dict, trace: Path | None) -> None:
    """Where the training loop's time went: the shares and rates as
    bottleneck.* metrics, the verdict and its advice as tags, the report
    (bottleneck.json) and the profiler's trace under bottleneck/."""
    client = MlflowClient(tracking_uri)
    for key, value in metrics_of(report).items():
        client.log_metric(run_id, key, float(value))
    client.set_tag(run_id, VERDICT_TAG, report["verdict"])
    client.set_tag(run_id, ADVICE_TAG, report["advice"])
    client.log_dict(run_id, report, f"{BOTTLENECK}/bottleneck.json")
    if trace is not None:
        client.log_artifact(run_id, str(trace), BOTTLENECK)


def bottleneck_of(tracking_uri: str, run_id: str) -> dict[str, str]:
    """The run's verdict and advice, for the step's output; empty when the
    run recorded none (a TrainJob's nodes, a run resumed after its last epoch)."""
    run_tags = MlflowClient(tracking_uri).get_run(run_id).data.tags
    if VERDICT_TAG not in run_tags:
        return {}
    return {"verdict": run_tags[VERDICT_TAG], "advice": run_tags.get(ADVICE_TAG, "")}


def log_reference(tracking_uri: str, run_id: str, features: pd.DataFrame, seed: int = 0) -> None:
    """The training split's input columns, for the drift job: sampled down
    to REFERENCE_ROWS (the job compares at most as many)."""
    if len(features) > tags.REFERENCE_ROWS:
        features = features.sample(tags.REFERENCE_ROWS, random_state=seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / Path(REFERENCE).name
        features.reset_index(drop=True).to_parquet(path, index=False)
        MlflowClient(tracking_uri).log_artifact(run_id, str(path), str(Path(REFERENCE).parent))


def _reference_tag(client: MlflowClient, run_id: str) -> dict[str, str]:
    logged = {a.path for a in client.list_artifacts(run_id, str(Path(REFERENCE).parent))}
    return {tags.REFERENCE: f"runs:/{run_id}/{REFERENCE}"} if REFERENCE in logged else {}


VALIDATION_DIR = "validation"


def _log_report(client: MlflowClient, run_id: str, report_json: str) -> str:
    """The report and the schema it inferred as the run's artifacts
    (validation/report.json, validation/data_schema.json); its summary."""
    report = json.loads(report_json)
    client.log_dict(run_id, report, f"{VALIDATION_DIR}/report.json")
    client.log_dict(run_id, report["schema"], f"{VALIDATION_DIR}/data_schema.json")
    summary = report["summary"]
    client.set_tag(run_id, tags.VALIDATION, summary)
    return summary


def log_validation(tracking_uri: str, run_id: str, report_json: str) -> None:
    """The validation step's report on the training run; register copies
    its summary onto the version."""
    _log_report(MlflowClient(tracking_uri), run_id, report_json)


def log_failed_validation(tracking_uri: str, spec: TrainingJobSpec, pipeline_run: str, owner: str,
                          report_json: str) -> str:
    """A run that fails at validation trains nothing, so no training run
    exists: the report goes on a failed run of the job's experiment, named
    after the pipeline run. Returns its id."""
    mlflow.set_tracking_uri(tracking_uri)
    experiment = mlflow.set_experiment(experiment_name(spec))
    client = MlflowClient(tracking_uri)
    run = client.create_run(experiment.experiment_id, run_name=pipeline_run,
                            tags={tags.PIPELINE_RUN: pipeline_run, tags.OWNER: owner})
    _log_report(client, run.info.run_id, report_json)
    client.set_terminated(run.info.run_id, "FAILED")
    return run.info.run_id


def champion_baseline(tracking_uri: str, champion) -> tuple[dict | None, pd.DataFrame | None]:  # noqa: ANN001 - registry ModelVersion
    """What a champion's training data looked like: the schema inferred from
    it (None for a version registered before kubeloop kept one) and its
    training sample (the drift job's reference; None if it has none)."""
    mlflow.set_tracking_uri(tracking_uri)
    schema = _artifact(champion.tags.get(tags.DATA_SCHEMA), mlflow.artifacts.load_dict)
    with tempfile.TemporaryDirectory() as tmp:
        reference = _artifact(champion.tags.get(tags.REFERENCE),
                              lambda uri: pd.read_parquet(mlflow.artifacts.download_artifacts(uri, dst_path=tmp)))
    return schema, reference


def _artifact(uri: str | None, read):  # noqa: ANN001, ANN202 - a reader of one artifact URI, and what it reads
    """What read makes of the artifact at uri; None without a uri or when it cannot be read."""
    if not uri:
        return None
    try:
        return read(uri)
    except (mlflow.exceptions.MlflowException, OSError):
        return None


def _validation_tags(client: MlflowClient, run_id: str) -> dict[str, str]:
    """The validation summary and the schema's location, from the run."""
    summary = client.get_run(run_id).data.tags.get(tags.VALIDATION)
    if summary is None:
        return {}
    return {tags.VALIDATION: summary, tags.DATA_SCHEMA: f"runs:/{run_id}/{VALIDATION_DIR}/data_schema.json"}


def log_evaluation(tracking_uri: str, run_id: str, metrics: dict[str, float], slices: dict[str, dict]) -> None:
    client = MlflowClient(tracking_uri)
    for key, value in metrics.items():
        if value == value:
            client.log_metric(run_id, f"holdout.{key}", float(value))
    if slices:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "slices.json"
            path.write_text(json.dumps(slices, indent=2, sort_keys=True))
            client.log_artifact(run_id, str(path), "evaluation")


def find_registered(tracking_uri: str, name: str, pipeline_run: str):  # noqa: ANN201 - mlflow ModelVersion
    client = MlflowClient(tracking_uri)
    try:
        versions = client.search_model_versions(f"name = '{name}' and tags.`{tags.PIPELINE_RUN}` = '{pipeline_run}'")
    except mlflow.exceptions.MlflowException:
        return None
    return versions[0] if versions else None


def signature_of(spec: TrainingJobSpec, dataset: DatasetInfo) -> ModelSignature:
    return ModelSignature(task=dataset.task, feature_columns=dataset.feature_columns, classes=dataset.classes,
                          threshold=spec.evaluation.threshold if dataset.task == "binary" else None,
                          feature_views=spec.features.feature_views, entities=dataset.entities,
                          request_columns=dataset.request_columns, label=dataset.label)


def register(tracking_uri: str, run_id: str, model: TaskModel, spec: TrainingJobSpec,
             dataset: DatasetInfo, metrics: dict[str, float], pipeline_run: str, owner: str,
             git_sha: str, champion: dict | None = None, lineage: dict | None = None) -> dict:
    """Log the model (native, TorchScript, ONNX) and register a version with
    its signature and lineage (and the tags in lineage); a version already
    registered by this pipeline run is returned instead."""
    client = MlflowClient(tracking_uri)
    existing = find_registered(tracking_uri, spec.model_name, pipeline_run)
    signature = signature_of(spec, dataset)
    if existing is None:
        mlflow.set_tracking_uri(tracking_uri)
        n_features = len(dataset.feature_columns)
        example = np.zeros((2, n_features), dtype=np.float32)
        with mlflow.start_run(run_id=run_id):
            info = mlflow.pytorch.log_model(
                model, name="model", input_example=example,
                pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
            )
            with tempfile.TemporaryDirectory() as tmp:
                folder = Path(tmp)
                # The factory, its arguments and the weights (no pickle), for
                # the optimiser to rebuild the network.
                save_model(model, folder)
                export_torchscript(model, n_features, folder / "model.pt")
                export_onnx(model, folder / "model.onnx")
                card = {"signature": json.loads(signature.to_json()), "metrics": metrics,
                        "factory": model.architecture.factory, "parameters": model.architecture.parameters}
                (folder / "model_card.json").write_text(json.dumps(card, indent=2, default=str))
                mlflow.log_artifacts(str(folder), EXPORTED)
        version_tags = {
            tags.PIPELINE_RUN: pipeline_run, tags.OWNER: owner, "git_sha": git_sha,
            "dataset_hash": dataset.dataset_hash, "feature_views": json.dumps(dataset.feature_views, sort_keys=True),
            "feature_columns": json.dumps(dataset.feature_columns), "label": dataset.label,
            "threshold": str(spec.evaluation.threshold), tags.TASK: dataset.task,
            SIGNATURE_TAG: signature.to_json(), tags.FEATURE_STORE: dataset.store,
            tags.FACTORY: model.architecture.factory,
            tags.FACTORY_CODE: factory_code(model.architecture.factory, model.architecture.path),
            tags.VIEW_HASHES: json.dumps(dataset.view_hashes, sort_keys=True),
            "run_id": run_id, "exported": f"runs:/{run_id}/{EXPORTED}",
            tags.TRAINING_SPEC: pinned(spec, dataset).model_dump_json(by_alias=True, exclude_none=True),
            **{f"{tags.METRIC_PREFIX}{k}": f"{v:.6f}" for k, v in metrics.items() if v == v and k not in ("rows", "positives")},
            **(_champion_tags(champion) if champion else {}),
            **_reference_tag(client, run_id),
            **_validation_tags(client, run_id),
            **(lineage or {}),
        }
        existing = mlflow.register_model(info.model_uri, spec.model_name, tags=version_tags)
    if spec.promotion and spec.promotion.register_as:
        client.set_registered_model_alias(spec.model_name, alias_for(spec.promotion.register_as), existing.version)
    return {"name": spec.model_name, "version": str(existing.version),
            "uri": f"models:/{spec.model_name}/{existing.version}", "run_url": run_url(tracking_uri, run_id)}


def _champion_tags(champion: dict) -> dict[str, str]:
    """The champion's scores on this version's evaluation set, for the
    not-worse-than-champion gate."""
    out = {f"{tags.CHAMPION_PREFIX}version": str(champion["version"])}
    out.update({f"{tags.CHAMPION_PREFIX}{k}": f"{v:.6f}" for k, v in champion["metrics"].items()
                if v == v and k not in ("rows", "positives")})
    return out
