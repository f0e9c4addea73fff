"""Entity requests for the fraud example, and the offline store's vectors
for the same transactions: what the online-features tests of both backends
compare."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kubeloop.api.signature import ModelSignature
from kubeloop.featurestore.store import feature_view, open_store, point_in_time
from kubeloop.story.traffic import entity_request

__all__ = ["SENT", "entity_request", "raw_request", "recent_with_offline_vectors"]

SENT = ["card_id", "merchant_id", "amount", "hour", "channel"]
"""What the payment system sends: the rest comes from the feature store."""


def raw_request(vectors: np.ndarray) -> dict:
    return {"inputs": [{"name": "features", "shape": list(vectors.shape), "datatype": "FP32",
                        "data": vectors.tolist()}]}


def recent_with_offline_vectors(repo: Path, signature: ModelSignature, rows: int = 32,
                                seed: int = 3) -> tuple[pd.DataFrame, np.ndarray]:
    """rows recent transactions as sent now, and the offline store's
    point-in-time vectors for the same entities now (in the model's column
    order); cards quiet for longer than card_activity's ttl have no offline
    row (Feast drops them), so only the others are kept."""
    transactions = pd.read_parquet(repo / "data" / "transactions.parquet")
    sent = transactions.sort_values("event_timestamp").tail(500).sample(rows, random_state=seed)[SENT]
    sent = sent.reset_index(drop=True)
    store = open_store(repo)
    entity_df = sent.assign(event_timestamp=pd.Timestamp.now(tz="UTC"), row=range(len(sent)))
    offline, _ = point_in_time(store, [feature_view(store, v) for v in signature.feature_views], entity_df)
    offline = offline.sort_values("row")
    kept = sent.iloc[offline["row"].to_numpy()].reset_index(drop=True)
    return kept, offline[signature.feature_columns].to_numpy(np.float32)
