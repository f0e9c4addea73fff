"""Component tests: the real libraries (Feast, torch, MLflow) without the
control plane. One small feature repository serves the whole session."""

from __future__ import annotations

import numpy as np
import pytest

from kubeloop.api.training import TrainingJobSpec
from kubeloop.featurestore.generate import Scenario, default_start

VIEWS = ["card_activity", "merchant_risk", "card_profile", "transaction_context"]


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
