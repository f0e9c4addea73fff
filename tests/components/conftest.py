"""Component tests: the real libraries (Feast, torch, MLflow) without the
control plane. One small feature repository serves the whole session."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kubeloop import processes
from kubeloop.api.training import TrainingJobSpec
from kubeloop.components.data import DatasetInfo, time_split
from kubeloop.dev import onlinestore
from kubeloop.featurestore.generate import Scenario, default_start
from tests.support.waiting import wait_for

VIEWS = ["card_activity", "merchant_risk", "card_profile", "transaction_context"]
SMALL_FEATURES = ["f0", "f1", "f2"]


@pytest.fixture(scope="session")
def feature_repo(tmp_path_factory):
    from kubeloop.featurestore.store import create_repository

    return create_repository(tmp_path_factory.mktemp("features") / "repo",
                             Scenario(start=default_start(30), days=30, cards=1200))


@pytest.fixture(scope="session")
def job_spec() -> TrainingJobSpec:
    return TrainingJobSpec.model_validate({
        "modelName": "fraud-test", "features": {"featureViews": VIEWS, "labels": {"source": "transactions", "column": "is_fraud"}},
        "hyperparameters": {"epochs": 3, "batchSize": 512, "learningRate": 0.003},
        "evaluation": {"sliceColumn": "channel", "threshold": 0.2},
    })


@pytest.fixture(scope="session")
def dataset(feature_repo, job_spec, tmp_path_factory):
    from kubeloop.components.data import build_dataset, load_split
    from kubeloop.featurestore.store import StoreLocation

    path = tmp_path_factory.mktemp("dataset") / "data.parquet"
    info = build_dataset(job_spec, StoreLocation(path=str(feature_repo)).to_json(), path)
    train, y_train = load_split(path, info, "train")
    holdout, y_holdout = load_split(path, info, "holdout")
    cols = info.feature_columns
    return {"info": info, "path": path,
            "x": train[cols].to_numpy(np.float32), "y": y_train,
            "x_holdout": holdout[cols].to_numpy(np.float32), "y_holdout": y_holdout,
            "slices": holdout["channel"].to_numpy()}


@pytest.fixture
def small_dataset(tmp_path) -> tuple[Path, DatasetInfo]:
    """A few hundred rows in the training data step's layout."""
    rows = 256
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(size=(rows, len(SMALL_FEATURES))).astype(np.float32), columns=SMALL_FEATURES)
    frame["fault"] = (frame["f0"] + rng.normal(0, 0.5, rows) > 0).astype(int)
    frame["event_timestamp"] = pd.date_range("2026-03-02", periods=rows, freq="h", tz="UTC")
    frame = time_split(frame, 0.2)
    path = tmp_path / "data.parquet"
    frame.to_parquet(path)
    holdout = int((frame["split"] == "holdout").sum())
    info = DatasetInfo(entity_rows=rows, dropped_by_ttl=0, rows=rows, train_rows=rows - holdout, holdout_rows=holdout,
                       positives=int(frame["fault"].sum()), dataset_hash="synthetic", feature_columns=SMALL_FEATURES,
                       label="fault", feature_views={}, slice_column=None, holdout_start="")
    return path, info


@pytest.fixture
def tracking(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the sqlite store keeps artifacts under ./mlruns
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture(scope="module")
def redis_address(tmp_path_factory):
    """Debian's redis-server on 127.0.0.1 only, launched with the argv the
    local platform launches it with (kubeloop.dev.onlinestore); its host:port."""
    root = tmp_path_factory.mktemp("redis")
    port = processes.free_port()
    server = processes.start("redis", onlinestore.build_redis_argv(onlinestore.redis_binary(), port, root,
                                                                   "127.0.0.1"), root / "logs")
    address = f"127.0.0.1:{port}"

    def answering() -> bool:
        if not server.running():
            raise AssertionError(f"redis-server exited:\n{processes.log_tail(server.log)}")
        return onlinestore.answering(address)

    try:
        wait_for(answering, timeout=30, interval=0.05, what="redis-server answering PING")
        yield address
    finally:
        processes.stop(server)
