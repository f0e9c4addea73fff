"""Training data from Feast: point-in-time, time-split, nothing lost silently."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from kubeloop.api.training import TrainingJobSpec
from kubeloop.components.data import build_dataset
from tests.components.conftest import VIEWS


def test_rows_dropped_by_ttl_are_counted(dataset):
    info = dataset["info"]
    assert info.dropped_by_ttl > 0, "the scenario has dormant cards whose snapshots expire"
    assert info.rows + info.dropped_by_ttl == info.entity_rows
    assert info.train_rows + info.holdout_rows == info.rows


def test_hold_out_is_the_most_recent_fifth(dataset):
    frame = pd.read_parquet(dataset["path"])
    train, holdout = frame[frame.split == "train"], frame[frame.split == "holdout"]
    assert train.event_timestamp.max() <= holdout.event_timestamp.min()
    assert abs(len(holdout) / len(frame) - 0.2) < 0.01


def test_features_are_point_in_time(feature_repo, dataset):
    """No card_activity value may come from a snapshot taken after the transaction."""
    frame = pd.read_parquet(dataset["path"])
    snapshots = pd.read_parquet(feature_repo / "data" / "card_activity.parquet")
    first_snapshot = snapshots.event_timestamp.min()
    early = frame[frame.event_timestamp < first_snapshot]
    assert len(early) == 0 or (early.txn_count_7d == 0).all()


def test_dataset_hash_is_stable_and_sensitive(feature_repo, job_spec, dataset, tmp_path):
    again = build_dataset(job_spec, feature_repo, tmp_path / "again.parquet")
    assert again.dataset_hash == dataset["info"].dataset_hash
    wire = job_spec.to_wire()
    wire["features"]["window"] = {"start": again.holdout_start.replace(" ", "T")}
    narrower = build_dataset(TrainingJobSpec.model_validate(wire), feature_repo, tmp_path / "n.parquet")
    assert narrower.dataset_hash != again.dataset_hash and narrower.rows < again.rows


def test_unknown_feature_view_names_the_view(feature_repo, job_spec, tmp_path):
    spec = TrainingJobSpec.model_validate({**job_spec.to_wire(),
                                           "features": {"featureViews": [*VIEWS[:1], "does_not_exist"]}})
    with pytest.raises(ValueError, match="feature view 'does_not_exist' does not exist"):
        build_dataset(spec, feature_repo, tmp_path / "x.parquet")


def test_the_pinned_window_rebuilds_the_same_rows_after_newer_data_arrives(feature_repo, job_spec, tmp_path):
    """The optimiser and the drift job rebuild a version's data from its
    recorded spec; newer data must not leak into it."""
    import shutil

    from kubeloop.components.data import pinned
    from kubeloop.featurestore.generate import Scenario
    from kubeloop.featurestore.store import append_period

    repo = Path(shutil.copytree(feature_repo, tmp_path / "repo"))
    first = build_dataset(job_spec, repo, tmp_path / "first.parquet")
    recorded = TrainingJobSpec.model_validate_json(pinned(job_spec, first).model_dump_json(by_alias=True))
    last = pd.read_parquet(repo / "data" / "transactions.parquet").event_timestamp.max()
    append_period(repo, Scenario(start=(last + pd.Timedelta(seconds=1)).to_pydatetime(), days=3, cards=1200,
                                 drift=1.0, seed=3))
    assert build_dataset(recorded, repo, tmp_path / "again.parquet").dataset_hash == first.dataset_hash
    assert build_dataset(job_spec, repo, tmp_path / "open.parquet").rows > first.rows
