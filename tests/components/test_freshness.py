"""The materialisation run the operator schedules, against a real Feast
repository (local provider: file offline store, sqlite online store):
what it materialises, the lag it reads back from the registry (as an
operator that restarted reads it), and a broken source failing only its own
view. Backend: local (Feast, no operator)."""

from __future__ import annotations

import time

from kubeloop.featurestore.freshness import StoreNeed
from kubeloop.featurestore.generate import Scenario, default_start
from kubeloop.featurestore.store import (
    StoreLocation, create_repository, materialize_views, materialized_until, open_store,
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
