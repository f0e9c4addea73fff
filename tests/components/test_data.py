"""Training data from Feast: point-in-time, time-split, nothing lost silently."""

from __future__ import annotations

import copy
import shutil
import tempfile
from pathlib import Path

import pandas as pd
import pytest
import yaml

from kubeloop.api.training import TrainingJobSpec
from kubeloop.components.data import build_dataset
from kubeloop.featurestore.store import StoreLocation
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


def at(repo) -> str:
    return StoreLocation(path=str(repo)).to_json()


def test_features_are_point_in_time(feature_repo, dataset):
    """No card_activity value may come from a snapshot taken after the transaction."""
    frame = pd.read_parquet(dataset["path"])
    snapshots = pd.read_parquet(feature_repo / "data" / "card_activity.parquet")
    first_snapshot = snapshots.event_timestamp.min()
    early = frame[frame.event_timestamp < first_snapshot]
    # The file keeps a feature with no value as NaN (load_split makes it 0).
    assert len(early) == 0 or (early.txn_count_7d.isna() | (early.txn_count_7d == 0)).all()


def test_dataset_hash_is_stable_and_sensitive(feature_repo, job_spec, dataset, tmp_path):
    again = build_dataset(job_spec, at(feature_repo), tmp_path / "again.parquet")
    assert again.dataset_hash == dataset["info"].dataset_hash
    wire = job_spec.to_wire()
    wire["features"]["window"] = {"start": again.holdout_start.replace(" ", "T")}
    narrower = build_dataset(TrainingJobSpec.model_validate(wire), at(feature_repo), tmp_path / "n.parquet")
    assert narrower.dataset_hash != again.dataset_hash and narrower.rows < again.rows


def test_unknown_feature_view_names_the_view(feature_repo, job_spec, tmp_path):
    spec = TrainingJobSpec.model_validate({**job_spec.to_wire(),
                                           "features": {"featureViews": [*VIEWS[:1], "does_not_exist"], "labels": {"source": "transactions", "column": "is_fraud"}}})
    with pytest.raises(ValueError, match="spec.features.featureViews: 'does_not_exist' is not a feature view"):
        build_dataset(spec, at(feature_repo), tmp_path / "x.parquet")


def test_the_pinned_window_rebuilds_the_same_rows_after_newer_data_arrives(feature_repo, job_spec, tmp_path):
    """The optimiser and the drift job rebuild a version's data from its
    recorded spec; newer data must not leak into it."""
    from kubeloop.components.data import pinned
    from kubeloop.featurestore.generate import Scenario
    from kubeloop.featurestore.store import write_period

    repo = Path(shutil.copytree(feature_repo, tmp_path / "repo"))
    first = build_dataset(job_spec, at(repo), tmp_path / "first.parquet")
    recorded = TrainingJobSpec.model_validate_json(pinned(job_spec, first).model_dump_json(by_alias=True))
    last = pd.read_parquet(repo / "data" / "transactions.parquet").event_timestamp.max()
    write_period(repo, Scenario(start=(last + pd.Timedelta(seconds=1)).to_pydatetime(), days=3, cards=1200,
                                 drift=1.0, seed=3))
    assert build_dataset(recorded, at(repo), tmp_path / "again.parquet").dataset_hash == first.dataset_hash
    assert build_dataset(job_spec, at(repo), tmp_path / "open.parquet").rows > first.rows


def test_kubeloop_applies_definitions_only_to_its_own_example(feature_repo, tmp_path):
    """A team's repository (another Feast project) is never written by `kubeloop features apply`."""
    from kubeloop.featurestore.store import apply

    repo = Path(shutil.copytree(feature_repo, tmp_path / "team"))
    config = repo / "feature_store.yaml"
    config.write_text(config.read_text().replace("project: kubeloop_fraud", "project: team_churn"))
    registry = (repo / "data" / "registry.db").read_bytes()
    with pytest.raises(ValueError, match="Feast project team_churn, not the card-transactions example"):
        apply(repo)
    assert (repo / "data" / "registry.db").read_bytes() == registry


def test_labels_from_a_file_with_its_own_timestamp_column(feature_repo, job_spec, dataset, tmp_path):
    """labels.path and labels.timestampColumn: the same rows as the data source they were copied from."""
    rows = pd.read_parquet(feature_repo / "data" / "transactions.parquet").rename(
        columns={"event_timestamp": "happened_at"})
    rows.to_parquet(tmp_path / "labels.parquet")
    wire = job_spec.to_wire()
    wire["features"]["labels"] = {"path": str(tmp_path / "labels.parquet"), "column": "is_fraud",
                                  "timestampColumn": "happened_at"}
    from_file = build_dataset(TrainingJobSpec.model_validate(wire), at(feature_repo), tmp_path / "f.parquet")
    assert from_file.dataset_hash == dataset["info"].dataset_hash
    assert from_file.entities == ["card_id", "merchant_id"] and from_file.request_columns == ["amount", "hour",
                                                                                             "channel"]


def test_a_missing_label_column_is_named(feature_repo, job_spec, tmp_path):
    wire = job_spec.to_wire()
    wire["features"]["labels"] = {"source": "transactions", "column": "is_chargeback"}
    with pytest.raises(ValueError, match="spec.features.labels: the label source transactions has no column "
                                         "is_chargeback"):
        build_dataset(TrainingJobSpec.model_validate(wire), at(feature_repo), tmp_path / "x.parquet")


def test_an_empty_window_is_named(feature_repo, job_spec, tmp_path):
    wire = job_spec.to_wire()
    wire["features"]["window"] = {"start": "1990-01-01T00:00:00Z", "end": "1990-02-01T00:00:00Z"}
    with pytest.raises(ValueError, match="spec.features.window: the label source transactions has no rows"):
        build_dataset(TrainingJobSpec.model_validate(wire), at(feature_repo), tmp_path / "x.parquet")


def test_a_slice_column_in_neither_the_labels_nor_the_features_fails_before_the_join(
        feature_repo, job_spec, tmp_path, monkeypatch):
    def no_join(*args, **kwargs):
        raise AssertionError("the point-in-time join ran")

    monkeypatch.setattr("kubeloop.featurestore.store.point_in_time", no_join)
    wire = job_spec.to_wire()
    wire["evaluation"]["sliceColumn"] = "region"
    with pytest.raises(ValueError, match="spec.evaluation.sliceColumn 'region' is neither a column of the label "
                                         "source transactions nor a feature") as raised:
        build_dataset(TrainingJobSpec.model_validate(wire), at(feature_repo), tmp_path / "x.parquet")
    assert "transaction_id" in str(raised.value) and "avg_amount_7d" in str(raised.value)


def published(repo: Path) -> str:
    """The repository as a Feast operator publishes it: feature_store.yaml
    text whose registry is absolute, its sources as the registry holds them."""
    config = yaml.safe_load((repo / "feature_store.yaml").read_text())
    config["registry"] = str(repo / "data" / "registry.db")
    config["online_store"]["path"] = str(repo / "data" / "online.db")
    return StoreLocation(config=yaml.safe_dump(config)).to_json()


def apply_absolute_sources(repo: Path) -> None:
    from feast import FileSource

    from kubeloop.featurestore import definitions
    from kubeloop.featurestore.store import open_store

    def absolute(source: FileSource) -> FileSource:
        return FileSource(name=source.name, path=str(repo / source.path), timestamp_field=source.timestamp_field)

    views = []
    for view in definitions.FEATURE_VIEWS:
        views.append(copy.copy(view))
        views[-1].batch_source = absolute(view.batch_source)
    open_store(repo).apply([*definitions.ENTITIES, *map(absolute, definitions.DATA_SOURCES), *views,
                            *definitions.ON_DEMAND_FEATURE_VIEWS])


def test_a_published_store_with_relative_source_paths_is_refused_naming_them_and_the_fix(
        feature_repo, job_spec, dataset, tmp_path):
    """Relative paths resolve only in the repository the sources were applied
    from; read through published text they would point into kubeloop's own
    temporary folder, and Feast would fail deep in the join naming it."""
    repo = Path(shutil.copytree(feature_repo, tmp_path / "repo"))
    with pytest.raises(ValueError) as raised:
        build_dataset(job_spec, published(repo), tmp_path / "x.parquet")
    message = str(raised.value)
    assert message.startswith("spec.features.store: the published feature store (project kubeloop_fraud)")
    for name in ("transactions", "card_activity", "merchant_risk", "card_profile"):
        assert f"'{name}' (data/{name}.parquet)" in message
    assert "s3://bucket/file.parquet" in message and "`feast apply` again" in message
    assert tempfile.gettempdir() not in message and raised.value.__context__ is None

    apply_absolute_sources(repo)
    assert build_dataset(job_spec, published(repo), tmp_path / "y.parquet").dataset_hash == \
        dataset["info"].dataset_hash
