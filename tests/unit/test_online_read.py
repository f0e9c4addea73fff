"""Which Feast views the serving path's lean read covers
(kubeloop.front.onlineread.uncovered), with Feast's own view objects and no
store: backend-independent; what it reads is proven against Feast's
get_online_features in tests/components/test_online_read.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from feast import Entity, FeatureView, Field, FileSource, RequestSource, ValueType
from feast.on_demand_feature_view import on_demand_feature_view
from feast.types import Float64, Int64

from kubeloop.front.onlineread import uncovered

CARD = Entity(name="card", join_keys=["card_id"], value_type=ValueType.INT64)
SOURCE = FileSource(name="activity", path="data/activity.parquet", timestamp_field="event_timestamp")
ACTIVITY = FeatureView(name="card_activity", entities=[CARD], ttl=timedelta(days=2), source=SOURCE,
                       schema=[Field(name="avg_amount_7d", dtype=Float64), Field(name="card_id", dtype=Int64)])
REQUEST = RequestSource(name="request", schema=[Field(name="amount", dtype=Float64)])


def _ratio(mode: str = "python", **options):  # noqa: ANN202 - a feast OnDemandFeatureView
    @on_demand_feature_view(sources=[ACTIVITY, REQUEST], schema=[Field(name="ratio", dtype=Float64)], mode=mode,
                            **options)
    def ratio(inputs):  # noqa: ANN001, ANN202
        if mode == "pandas":
            import pandas as pd

            return pd.DataFrame({"ratio": inputs["amount"] / (inputs["avg_amount_7d"].fillna(0) + 1)})
        return {"ratio": [a / ((v or 0) + 1) for a, v in zip(inputs["amount"], inputs["avg_amount_7d"], strict=True)]}

    return ratio


def test_stored_views_by_their_keys_and_python_on_demand_views_over_them_are_covered():
    assert uncovered([ACTIVITY], {}) is None
    assert uncovered([ACTIVITY, _ratio()], {"card_activity": ACTIVITY}) is None


@pytest.mark.parametrize("views, sources, words", [
    ([ACTIVITY.with_name("renamed")], {}, "card_activity: aliased projection"),
    ([ACTIVITY.with_join_key_map({"card_id": "payer_id"})], {}, "aliased projection"),
    ([_ratio("pandas")], {"card_activity": ACTIVITY}, "ratio: mode pandas"),
    ([_ratio(singleton=True)], {"card_activity": ACTIVITY}, "mode python singleton"),
    ([_ratio(write_to_online_store=True)], {"card_activity": ACTIVITY}, "stored online"),
    ([_ratio()], {}, "source views card_activity not found"),
])
def test_anything_else_is_read_through_get_online_features_naming_the_view_and_why(views, sources, words):
    assert words in uncovered(views, sources)
