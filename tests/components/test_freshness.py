"""The materialisation run the operator schedules, against a real Feast
repository (local provider: file offline store, sqlite online store):
what it materialises, the lag it reads back from the registry (as an
operator that restarted reads it), and a broken source failing only its own
view. Backend: local (Feast, no operator)."""

from __future__ import annotations

import time
from dataclasses import replace

import pandas as pd
from feast.feature_view import FeatureViewState
from feast.protos.feast.core.Registry_pb2 import Registry as RegistryProto

from kubeloop.featurestore.freshness import StoreNeed
from kubeloop.featurestore.generate import Scenario, default_start
from kubeloop.featurestore.store import (
    LabelRows, StoreLocation, create_repository, materialize_views, materialized_until, open_store, recent_period,
    training_data, write_period,
)

def test_a_run_materialises_the_views_behind_the_served_ones_and_a_broken_source_fails_only_its_view(tmp_path):
    repo = create_repository(tmp_path / "repo", Scenario(start=default_start(7), days=7, cards=50, merchants=10))
    need = StoreNeed(StoreLocation(path=str(repo)).to_json(), ("transaction_context", "card_profile"), 60)
    names = ["card_activity", "card_profile"]
    assert materialized_until(open_store(repo), [*names, "merchant_risk"]) == dict.fromkeys(
        [*names, "merchant_risk"])  # never materialised

    end = time.time()
    first = materialize_views(need, end)
    assert first.error is None and first.project == "kubeloop_fraud"
    # The on-demand view is served by the feature views it reads; each now ends where the run did.
    assert sorted(first.ends) == names
    assert all(abs(e - end) < 1e-3 for e in first.ends.values())
    # A new process (an operator after a restart) reads the same from the registry;
    # a view no served version reads is left alone.
    assert materialized_until(open_store(repo), names) == first.ends
    assert materialized_until(open_store(repo), ["merchant_risk"]) == {"merchant_risk": None}
    assert open_store(repo).get_online_features(
        features=["card_profile:credit_limit"], entity_rows=[{"card_id": 1}]).to_dict()["credit_limit"][0] is not None

    (repo / "data" / "card_activity.parquet").rename(repo / "data" / "card_activity.parquet.lost")
    second = materialize_views(need, end + 30)
    assert second.error is not None and second.error.startswith("card_activity: ")
    assert second.ends["card_activity"] == first.ends["card_activity"]
    assert abs(second.ends["card_profile"] - (end + 30)) < 1e-3


def test_a_recent_period_replaces_its_days_and_reaches_the_online_store_at_the_next_scheduled_run(tmp_path):
    """What the demo's drift injection relies on (backend: local, Feast only,
    no manual materialisation): the last days are replaced by a drifted
    world's, and its snapshots as of now, newer than the last run's end, are
    what the next incremental run serves. Its earlier snapshots are older
    than that end (Feast never loads them), and superseded anyway."""
    repo = create_repository(tmp_path / "repo", Scenario(start=default_start(10), days=10, cards=50, merchants=10))
    need = StoreNeed(StoreLocation(path=str(repo)).to_json(), ("card_activity",), 60)
    assert materialize_views(need, time.time()).error is None
    data = repo / "data"
    before = pd.read_parquet(data / "transactions.parquet")

    scenario = replace(recent_period(days=3, drift=1.0, seed=3), cards=50, merchants=10)
    counts = write_period(repo, scenario)
    after = pd.read_parquet(data / "transactions.parquet")
    start = pd.Timestamp(scenario.start)
    assert len(after[after["event_timestamp"] >= start]) == counts["transactions"]
    assert after[after["event_timestamp"] < start]["amount"].tolist() == \
        before[before["event_timestamp"] < start]["amount"].tolist()
    # The drifted world spends more: the replaced days are not the reference's.
    assert after[after["event_timestamp"] >= start]["amount"].mean() > \
        1.5 * before[before["event_timestamp"] >= start]["amount"].mean()
    snapshots = pd.read_parquet(data / "card_activity.parquet")
    latest = snapshots[snapshots["event_timestamp"] == pd.Timestamp(scenario.end)].set_index("card_id")
    assert len(latest) > 10

    def online(card: int) -> float:
        return open_store(repo).get_online_features(features=["card_activity:avg_amount_7d"],
                                                    entity_rows=[{"card_id": card}]).to_dict()["avg_amount_7d"][0]

    card = int(latest.index[0])
    assert online(card) != latest.loc[card, "avg_amount_7d"]
    assert materialize_views(need, time.time()).error is None
    assert online(card) == latest.loc[card, "avg_amount_7d"]


def test_a_view_marked_materializing_still_serves_online_and_point_in_time_reads(tmp_path):
    """A scheduled run marks its views MATERIALIZING in the registry while a
    training step and the router read them, and a run killed half way leaves
    the mark (CI's loop test once failed so: Feast 0.67 refuses such reads by
    default). Backend: local (Feast, no operator)."""
    repo = create_repository(tmp_path / "repo", Scenario(start=default_start(5), days=5, cards=40, merchants=10))
    need = StoreNeed(StoreLocation(path=str(repo)).to_json(), ("card_profile",), 60)
    assert materialize_views(need, time.time()).error is None
    open_store(repo).set_feature_view_state("card_profile", FeatureViewState.MATERIALIZING)
    store = open_store(repo)
    assert store.registry.get_feature_view("card_profile", store.project).state == FeatureViewState.MATERIALIZING

    online = store.get_online_features(features=["card_profile:credit_limit"], entity_rows=[{"card_id": 1}])
    assert online.to_dict()["credit_limit"][0] is not None
    data = training_data(repo, ["card_profile"], LabelRows(source="transactions", column="is_fraud"))
    assert data.frame["credit_limit"].notna().all() and len(data.frame) > 0


def test_a_reader_never_meets_a_half_written_registry(tmp_path):
    """CI's loop test once failed so: a training step opened the file
    registry while a scheduled run rewrote it in place, parsed an empty
    registry and found no feature views. Every write through kubeloop's
    stores now lands in a new file renamed over the registry, so the file a
    reader opened stays whole. Backend: local (Feast, no operator)."""
    repo = create_repository(tmp_path / "repo", Scenario(start=default_start(5), days=5, cards=40, merchants=10))
    registry = repo / "data" / "registry.db"
    need = StoreNeed(StoreLocation(path=str(repo)).to_json(), ("card_profile",), 60)
    with registry.open("rb") as reading:
        before = registry.stat().st_ino
        assert materialize_views(need, time.time()).error is None
        assert registry.stat().st_ino != before
        held = RegistryProto.FromString(reading.read())
    assert "card_profile" in {v.spec.name for v in held.feature_views}
    assert materialized_until(open_store(repo), ["card_profile"])["card_profile"] is not None
    assert sorted(p.name for p in registry.parent.glob(".registry.db.*")) == []
