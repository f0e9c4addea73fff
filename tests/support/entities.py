"""Entity requests for the fraud example, the offline store's vectors for
the same transactions, and the router's count of missing online values:
what the online-features tests (the local backend's, the cluster's and the
Redis component test) compare."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import requests
from prometheus_client.parser import text_string_to_metric_families

from kubeloop.api.signature import ModelSignature
from kubeloop.featurestore.store import feature_view, open_store, point_in_time
from kubeloop.story.traffic import entity_request

__all__ = ["SENT", "answered_as_the_offline_vectors", "entity_request", "missing_count", "raw_request",
           "recent_with_offline_vectors"]

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


def missing_count(url: str, view: str, policy: str) -> float:
    """The router's count of entity-request rows whose view's value the
    online store lacked, under the policy, from its /metrics."""
    text = requests.get(f"{url}/metrics", timeout=5).text
    return sum(s.value for f in text_string_to_metric_families(text) if f.name == "kubeloop_online_features_missing"
               for s in f.samples if s.name.endswith("_total") and s.labels["view"] == view
               and s.labels["reason"] == "missing" and s.labels["policy"] == policy)


def answered_as_the_offline_vectors(infer: Callable[[dict], requests.Response], sent: pd.DataFrame,
                                    vectors: np.ndarray) -> np.ndarray:
    """Asserts that the entity request for sent and the raw-vector request
    of the offline vectors (infer: a v2 body -> the answer) are both
    answered, row for row alike, and not all the same; the answers."""
    by_entities, by_vector = infer(entity_request(sent)), infer(raw_request(vectors))
    assert by_entities.status_code == 200, by_entities.text
    assert by_vector.status_code == 200, by_vector.text
    served = np.array(by_entities.json()["outputs"][0]["data"], dtype=np.float64).ravel()
    expected = np.array(by_vector.json()["outputs"][0]["data"], dtype=np.float64).ravel()
    assert len(served) == len(sent) and len(set(np.round(served, 6))) > 1
    np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-6)
    return expected
