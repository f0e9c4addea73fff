"""Register small but real models (trained, exported, tagged) without
running a pipeline, for tests that need something to serve."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kubeloop.api.training import TrainingJobSpec
from kubeloop.components.data import SPLIT, DatasetInfo
from kubeloop.components.registration import log_reference, register, start_run
from kubeloop.components.training import TrainSettings, train

N_FEATURES = 18


def synthetic(rows: int = 4000, seed: int = 0, shift: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(shift, 1.0, (rows, N_FEATURES)).astype(np.float32)
    logit = 1.5 * x[:, 0] - 1.0 * x[:, 1] + 0.5 * x[:, 2] - 2.0
    y = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return x, y


def synthetic_dataset(path: Path, rows: int = 4000, holdout: int = 1000) -> DatasetInfo:
    """synthetic()'s rows as the training-data step writes them (a parquet
    with the split column) at path; returns its DatasetInfo."""
    x, y = synthetic(rows)
    columns = [f"f{i}" for i in range(N_FEATURES)]
    frame = pd.DataFrame(x, columns=columns).assign(y=y.astype(int))
    frame[SPLIT] = ["train"] * (rows - holdout) + ["holdout"] * holdout
    frame.to_parquet(path)
    return DatasetInfo(entity_rows=rows, dropped_by_ttl=0, rows=rows, train_rows=rows - holdout, holdout_rows=holdout,
                       positives=int(y.sum()), dataset_hash="synthetic-0", feature_columns=columns, label="y",
                       feature_views={}, slice_column=None, holdout_start="")


def register_model(tracking_uri: str, name: str, seed: int = 0, pipeline_run: str | None = None,
                   contrary: bool = False) -> str:
    """Train for a second on synthetic data and register; returns the version.
    contrary: trained on the opposite labels (a challenger that decides
    otherwise on almost every request)."""
    x, y = synthetic(seed=seed)
    if contrary:
        y = 1 - y
    model = train(x, y, None, None, TrainSettings(epochs=2, batch_size=256, seed=seed)).model
    spec = TrainingJobSpec.model_validate({"modelName": name, "features": {"featureViews": ["synthetic"], "labels": {"source": "transactions", "column": "is_fraud"}}})
    info = DatasetInfo(entity_rows=len(y), dropped_by_ttl=0, rows=len(y), train_rows=len(y), holdout_rows=0,
                       positives=int(y.sum()), dataset_hash=f"synthetic-{seed}",
                       feature_columns=[f"f{i}" for i in range(N_FEATURES)], label="y", feature_views={},
                       slice_column=None, holdout_start="")
    run = pipeline_run or f"test-{name}-{seed}"
    run_id = start_run(tracking_uri, spec, run, "tests/models", "h", "test")
    log_reference(tracking_uri, run_id, pd.DataFrame(x, columns=info.feature_columns), seed=seed)
    return register(tracking_uri, run_id, model, spec, info, {"auc": 0.8}, run, "tests/models", "test")["version"]


def register_broken(tracking_uri: str, name: str) -> str:
    """A version whose ONNX file is garbage: Triton cannot load it."""
    import tempfile

    from mlflow import MlflowClient

    version = register_model(tracking_uri, name, seed=99, pipeline_run=f"broken-{name}")
    client = MlflowClient(tracking_uri)
    run_id = client.get_model_version(name, version).run_id
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.onnx"
        path.write_bytes(b"not an onnx model")
        client.log_artifact(run_id, str(path), "exported")
    return version


def register_fraud_model(tracking_uri: str, name: str, repo: Path, work: Path, epochs: int = 2) -> str:
    """Train the example TrainingJob's fraud detector on a Feast repository's
    point-in-time data (as the pipeline's steps do, without the pipeline) and
    register it with its signature and feature store; returns the version."""
    import yaml

    from kubeloop.components.data import build_dataset, load_split
    from kubeloop.featurestore.store import StoreLocation

    example = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "trainingjob.yaml").read_text())
    spec = TrainingJobSpec.model_validate({**example["spec"], "modelName": name})
    work.mkdir(parents=True, exist_ok=True)
    info = build_dataset(spec, StoreLocation(path=str(repo)).to_json(), work / "dataset.parquet")
    frame, y = load_split(work / "dataset.parquet", info, "train")
    x = frame[info.feature_columns].to_numpy(np.float32)
    model = train(x, y, None, None, TrainSettings(epochs=epochs, batch_size=512, seed=0)).model
    run = f"test-{name}-fraud"
    run_id = start_run(tracking_uri, spec, run, "tests/models", "h", "test")
    return register(tracking_uri, run_id, model, spec, info, {"auc": 0.8}, run, "tests/models", "test")["version"]
