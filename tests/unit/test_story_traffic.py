"""The demo's callers, their pure parts (unit level; the requests are
answered by a real router and Triton in tests/e2e/test_loop.py and
tests/e2e/test_online_features.py)."""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
import pandas as pd

from kubeloop.api.signature import ModelSignature
from kubeloop.story.traffic import entity_request, sent_columns, vector_request


def test_an_entity_request_carries_one_typed_tensor_per_column_sent():
    frame = pd.DataFrame({"card_id": [7, 8], "amount": [12.5, 80.0], "channel": ["online", "in_store"]})
    request = entity_request(frame)
    assert [(t["name"], t["datatype"], t["shape"], t["data"]) for t in request["inputs"]] == [
        ("card_id", "INT64", [2], [7, 8]), ("amount", "FP64", [2], [12.5, 80.0]),
        ("channel", "BYTES", [2], ["online", "in_store"])]
    assert vector_request(np.ones((3, 2), np.float32))["inputs"][0] | {"data": None} == {
        "name": "features", "shape": [3, 2], "datatype": "FP32", "data": None}


def test_callers_send_the_signatures_keys_and_request_columns_of_the_window_only(tmp_path):
    (tmp_path / "data").mkdir()
    times = pd.to_datetime(["2026-11-01", "2026-11-10", "2026-11-20"], utc=True)
    pd.DataFrame({"card_id": [1, 2, 3], "merchant_id": [4, 5, 6], "amount": [1.0, 2.0, 3.0], "hour": [1, 2, 3],
                  "channel": ["online"] * 3, "is_fraud": [0, 1, 0], "avg_amount_7d": [9.0] * 3,
                  "event_timestamp": times}).to_parquet(tmp_path / "data" / "transactions.parquet")
    signature = ModelSignature(task="binary", feature_columns=["avg_amount_7d"], feature_views=["v"],
                               entities=["card_id", "merchant_id"], request_columns=["amount", "hour", "channel"])
    sent = sent_columns(tmp_path, signature, datetime(2026, 11, 5, tzinfo=timezone.utc),
                        datetime(2026, 11, 15, tzinfo=timezone.utc))
    assert list(sent.columns) == ["card_id", "merchant_id", "amount", "hour", "channel"]
    assert sent["card_id"].tolist() == [2]
