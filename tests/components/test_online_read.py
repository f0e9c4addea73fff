"""The serving path's lean online read (kubeloop.front.onlineread) against
Feast's own get_online_features on a real Feast repository (the example's
fraud views, materialised into Feast's sqlite online store): the same values,
found flags and event times for every row, for signatures naming stored and
on-demand views, one on-demand view alone (its sources read though the
signature does not name them), unknown and repeated entities, each both
ways the lean read reaches a store (one round trip for every view, and the
online store's own online_read a view at a time), on Feast's sqlite store
and on Redis (Debian's redis-server on loopback). Backend: local (Feast in
process, no platform); test_serving_tasks reads Redis through the router."""

from __future__ import annotations

import time

import pandas as pd
import pytest

from kubeloop.featurestore.generate import Scenario, default_start
from kubeloop.featurestore.store import StoreLocation, create_repository, materialize
from kubeloop.front.features import FeatureSpec, OnlineStore, assemble_joined

SENT = ("card_id", "merchant_id", "amount", "hour", "channel")
UNKNOWN_CARD = 987_654_321


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = create_repository(tmp_path_factory.mktemp("online-read") / "repo",
                             Scenario(start=default_start(7), days=7, cards=60, merchants=12, seed=3))
    materialize(repo)
    return repo


@pytest.fixture(scope="module")
def redis_repo(tmp_path_factory, redis_address):
    """The same kind of repository, materialised into Debian's redis-server only."""
    repo = create_repository(tmp_path_factory.mktemp("online-read-redis") / "repo",
                             Scenario(start=default_start(7), days=7, cards=60, merchants=12, seed=3),
                             redis_address=redis_address)
    materialize(repo)
    return repo


def _store(repo, views: tuple[str, ...], columns: tuple[str, ...] = ()) -> OnlineStore:
    location = StoreLocation(path=str(repo)).to_json()
    return OnlineStore(FeatureSpec(location, views, ("card_id", "merchant_id"), ("amount", "hour", "channel"),
                                   columns))


def _rows(repo, n: int, seed: int) -> dict[str, list]:
    transactions = pd.read_parquet(repo / "data" / "transactions.parquet", columns=list(SENT))
    picked = transactions.sample(n=n, random_state=seed, replace=True)
    rows = {c: picked[c].tolist() for c in SENT}
    rows["card_id"][0] = UNKNOWN_CARD
    if n > 2:
        rows["card_id"][-1] = rows["card_id"][1]  # a repeated card, with another merchant and amount
    return rows


@pytest.mark.parametrize("path", ["one sqlite query", "feast's online_read"])
@pytest.mark.parametrize("views", [("card_activity", "merchant_risk", "card_profile", "transaction_context"),
                                   ("transaction_context",), ("merchant_risk", "card_activity")])
def test_the_lean_read_answers_what_feasts_get_online_features_answers(repo, views, path):
    """Both ways the lean read reaches the store: one query over Feast's
    sqlite tables (kubeloop.front.storeread, chosen for a sqlite store),
    and the online store's own online_read (every other store, Redis's
    among them), here made to read the same sqlite store."""
    store = _store(repo, views)
    assert store.direct is not None, "the example's views are all ones the lean read covers"
    assert store.direct.batched is not None, "Feast's sqlite store is read in one query"
    if path == "feast's online_read":
        store.direct.batched = None
    features = {ref.split(":")[1] for ref in store.refs}
    for n, seed in ((1, 0), (7, 1), (32, 2)):
        rows = _rows(repo, n, seed)
        ours, feasts = store.read(rows), store.read_through_feast(rows)
        assert set(ours.values) == features
        assert ours.values == {name: feasts.values[name] for name in features}
        assert ours.found == feasts.found and ours.timestamps == feasts.timestamps
        assert all(not ours.found[v][0] for v in ours.found if v.startswith("card")), "the unknown card"
        assert all(any(found) for found in ours.found.values()) or n == 1, "known entities are found"


def test_values_change_with_the_store_not_a_cache(repo, tmp_path):
    """The same rows read after the view's values are removed answer none:
    each read goes to the online store."""
    import sqlite3

    store = _store(repo, ("merchant_risk",))
    rows = _rows(repo, 8, 4)
    assert any(store.read(rows).found["merchant_risk"])
    database = repo / "data" / "online.db"
    backup = tmp_path / "online.db"
    backup.write_bytes(database.read_bytes())
    try:
        with sqlite3.connect(database) as connection:
            (table,) = [t for (t,) in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")
                        if t.endswith("merchant_risk")]
            connection.execute(f'DELETE FROM "{table}"')
        assert not any(store.read(rows).found["merchant_risk"])
        assert store.read(rows).found == store.read_through_feast(rows).found
    finally:
        database.write_bytes(backup.read_bytes())


def test_an_on_demand_view_gets_its_sources_by_short_and_full_names_as_transform_dict_gives_them():
    """The lean read calls a python-mode view's own function with the inputs
    Feast's transform_dict builds (it skips transform_dict for its
    typeguard checks' cost): one function reading `view__feature` names,
    one reading short ones, the same answers both ways (real Feast views)."""
    from feast import Entity, FeatureView, Field, FileSource, RequestSource, ValueType
    from feast.on_demand_feature_view import on_demand_feature_view
    from feast.types import Float64

    from kubeloop.front.onlineread import transform_inputs, transform_names

    card = Entity(name="card", join_keys=["card_id"], value_type=ValueType.INT64)
    activity = FeatureView(name="activity", entities=[card], schema=[Field(name="avg", dtype=Float64)],
                           source=FileSource(path="activity.parquet", timestamp_field="ts"))
    request = RequestSource(name="request", schema=[Field(name="amount", dtype=Float64)])

    @on_demand_feature_view(sources=[activity, request], schema=[Field(name="by_full", dtype=Float64)],
                            mode="python")
    def by_full(inputs: dict) -> dict:
        return {"by_full": [a / b for a, b in zip(inputs["amount"], inputs["activity__avg"], strict=True)]}

    @on_demand_feature_view(sources=[activity, request], schema=[Field(name="by_short", dtype=Float64)],
                            mode="python")
    def by_short(inputs: dict) -> dict:
        return {"by_short": [a - b for a, b in zip(inputs["amount"], inputs["avg"], strict=True)]}

    rows, read = {"card_id": [1, 2], "amount": [10.0, 3.0]}, {"activity": {"avg": [2.0, 4.0]}}
    for view, name, expected in ((by_full, "by_full", [5.0, 0.75]), (by_short, "by_short", [8.0, -1.0])):
        ours = view.feature_transformation.transform(transform_inputs(transform_names(view), rows, read))
        feasts = view.transform_dict({**rows, **read["activity"]})
        assert ours[name] == feasts[name] == expected


@pytest.mark.parametrize("path", ["one pipeline", "feast's online_read"])
def test_the_lean_read_of_redis_answers_what_feasts_get_online_features_answers(redis_repo, path):
    """Feast's Redis store: every view's HMGETs in one pipeline through the
    store's own client (kubeloop.front.storeread), and a view at a time
    through its online_read, answer what get_online_features answers."""
    from kubeloop.front.storeread import RedisViews

    store = _store(redis_repo, ("card_activity", "merchant_risk", "card_profile", "transaction_context"))
    assert isinstance(store.direct.batched, RedisViews)
    if path == "feast's online_read":
        store.direct.batched = None
    for n, seed in ((1, 0), (7, 1), (32, 2)):
        rows = _rows(redis_repo, n, seed)
        ours, feasts = store.read(rows), store.read_through_feast(rows)
        assert ours.values == {name: feasts.values[name] for name in ours.values}
        assert ours.found == feasts.found and ours.timestamps == feasts.timestamps
        assert not ours.found["card_activity"][0], "the unknown card"
        assert any(ours.found["card_activity"]) or n == 1


def test_a_joined_reads_answers_are_each_requests_own_and_say_how_many_it_carried(repo):
    """Local: three requests read as one from Feast's sqlite store; each gets
    the vectors (and problems) its rows get read alone."""
    views = ("card_activity", "merchant_risk", "card_profile", "transaction_context")
    store = _store(repo, views, tuple(f for v in _store(repo, views).views for f in v.features))
    requests = [_rows(repo, n, seed) for n, seed in ((1, 5), (3, 6), (2, 7))]
    answers = assemble_joined(store, requests, "default")
    assert [a.joined for a in answers] == [3, 3, 3]
    for rows, answer in zip(requests, answers, strict=True):
        alone = store.assemble(rows, time.time(), "default")
        assert (answer.vectors, answer.problems) == (alone.vectors, alone.problems)
    assert any(answer.problems for answer in answers), "the unknown card of each request"
    assert assemble_joined(store, requests[:1], "default")[0].joined == 1


def test_values_materialised_after_the_reader_opened_are_read(tmp_path):
    """The one-query reader keeps its read-only connection: what Feast
    writes through its own after the reader's first read is in the next."""
    repo = create_repository(tmp_path / "repo", Scenario(start=default_start(3), days=3, cards=10, merchants=4,
                                                         seed=8))
    store = _store(repo, ("merchant_risk",))
    rows = _rows(repo, 4, 9)
    assert not any(store.read(rows).found["merchant_risk"]), "applied, not yet materialised"
    materialize(repo)
    assert any(store.read(rows).found["merchant_risk"])
    assert store.read(rows).found == store.read_through_feast(rows).found


def test_a_repository_whose_path_holds_uri_characters_is_read(tmp_path):
    """The read-only connection names the database by a file URI: a user's
    folder with spaces, '%', '#' or '?' in its name must still be read."""
    repo = create_repository(tmp_path / "team a #1 50% ?" / "repo",
                             Scenario(start=default_start(3), days=3, cards=10, merchants=4, seed=8))
    materialize(repo)
    store = _store(repo, ("merchant_risk",))
    assert store.direct.batched is not None
    rows = _rows(repo, 4, 9)
    ours, feasts = store.read(rows), store.read_through_feast(rows)
    assert any(ours.found["merchant_risk"]) and ours.found == feasts.found
    assert ours.values == {name: feasts.values[name] for name in ours.values}
