"""The Feast repository of the card-transaction fraud use case: entities,
sources, feature views with ttl, and an on-demand feature view.

Source paths are relative to the repository folder (Feast resolves them
against it), so one set of definitions serves every copy of the repository.
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pandas as pd
from feast import Entity, FeatureView, Field, FileSource, RequestSource, ValueType
from feast.on_demand_feature_view import on_demand_feature_view
from feast.types import Float32, Float64, Int64, String

card = Entity(name="card", join_keys=["card_id"], value_type=ValueType.INT64,
              description="A payment card.")
merchant = Entity(name="merchant", join_keys=["merchant_id"], value_type=ValueType.INT64,
                  description="A merchant accepting card payments.")


def _source(name: str) -> FileSource:
    return FileSource(name=name, path=f"data/{name}.parquet", timestamp_field="event_timestamp")


transactions = _source("transactions")
"""Labelled transactions: the entity rows of training (card_id, merchant_id,
amount, hour, channel, is_fraud at event_timestamp)."""

card_activity = FeatureView(
    name="card_activity",
    entities=[card],
    # Snapshots are daily; one older than two days means the card went quiet
    # and its aggregates no longer describe it.
    ttl=timedelta(days=2),
    schema=[
        Field(name="txn_count_7d", dtype=Int64),
        Field(name="avg_amount_7d", dtype=Float32),
        Field(name="max_amount_7d", dtype=Float32),
        Field(name="distinct_merchants_7d", dtype=Int64),
        Field(name="online_share_7d", dtype=Float32),
    ],
    source=_source("card_activity"),
    description="Seven-day spending aggregates per card, computed daily.",
    tags={"owner": "fraud-team", "cadence": "daily"},
)

merchant_risk = FeatureView(
    name="merchant_risk",
    entities=[merchant],
    ttl=timedelta(days=10),
    schema=[
        Field(name="fraud_rate_30d", dtype=Float32),
        Field(name="avg_ticket_30d", dtype=Float32),
        Field(name="txn_count_30d", dtype=Int64),
        Field(name="category_risk", dtype=Float32),
    ],
    source=_source("merchant_risk"),
    description="Thirty-day fraud and ticket statistics per merchant, computed weekly.",
    tags={"owner": "fraud-team", "cadence": "weekly"},
)

card_profile = FeatureView(
    name="card_profile",
    entities=[card],
    ttl=timedelta(days=3650),
    schema=[
        Field(name="credit_limit", dtype=Float32),
        Field(name="account_age_days", dtype=Int64),
        Field(name="is_credit", dtype=Int64),
    ],
    source=_source("card_profile"),
    description="Slowly changing card attributes.",
    tags={"owner": "fraud-team"},
)

transaction_request = RequestSource(
    name="transaction_request",
    schema=[Field(name="amount", dtype=Float64), Field(name="hour", dtype=Int64),
            Field(name="channel", dtype=String)],
    description="What the payment request itself carries.",
)


@on_demand_feature_view(
    sources=[card_activity, card_profile, transaction_request],
    schema=[
        Field(name="log_amount", dtype=Float64),
        Field(name="amount_to_avg_ratio", dtype=Float64),
        Field(name="amount_to_limit", dtype=Float64),
        Field(name="is_night", dtype=Int64),
        Field(name="is_online", dtype=Int64),
        Field(name="is_contactless", dtype=Int64),
    ],
    mode="pandas",
    description="The request's amount and time set against the card's history.",
)
def transaction_context(inputs: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame(index=inputs.index)
    amount = inputs["amount"].astype("float64")
    out["log_amount"] = np.log1p(amount)
    out["amount_to_avg_ratio"] = amount / (inputs["avg_amount_7d"].astype("float64").fillna(0) + 1.0)
    out["amount_to_limit"] = amount / (inputs["credit_limit"].astype("float64").fillna(0) + 1.0)
    hour = inputs["hour"].astype("int64")
    out["is_night"] = ((hour < 6) | (hour >= 23)).astype("int64")
    out["is_online"] = (inputs["channel"] == "online").astype("int64")
    out["is_contactless"] = (inputs["channel"] == "contactless").astype("int64")
    return out


ENTITIES = [card, merchant]
DATA_SOURCES = [transactions]
FEATURE_VIEWS = [card_activity, merchant_risk, card_profile]
ON_DEMAND_FEATURE_VIEWS = [transaction_context]
