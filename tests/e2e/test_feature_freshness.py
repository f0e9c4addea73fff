"""Fresh online features on the local backend: the operator materialises
the feature store an entity-request InferenceService reads, on the
service's schedule, with no manual `kubeloop features materialize`, so rows
that reach the offline store become servable; when materialisation fails
the service says so in FeaturesFresh and the platform's real Prometheus
raises KubeloopOnlineFeaturesStale from the operator's lag metric.

Local path. Backend: local (operator process, real tritonserver and router,
Feast sqlite online store and file offline store, MLflow, Prometheus)."""

from __future__ import annotations

import time

import pandas as pd
import pytest
import requests
from mlflow import MlflowClient

from kubeloop.api.constants import API_VERSION
from kubeloop.featurestore.generate import Scenario, default_start
from kubeloop.featurestore.store import create_repository
from kubeloop.featurestore.freshness import store_key
from kubeloop.registry.tags import FEATURE_STORE
from kubeloop.story.loop import operator_env
from tests.e2e.test_online_features import entity_request, infer
from tests.support.models import register_fraud_model
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e
NEW_CARD, NEW_MERCHANT = 10**9 + 7, 10**9 + 11


def add_row(repo, source: str, key: str, value: int, at: pd.Timestamp) -> None:
    """A new entity's row in a file source, as a feature pipeline appends it
    (written whole, then renamed in, so a reader never sees half a file)."""
    path = repo / "data" / f"{source}.parquet"
    frame = pd.read_parquet(path)
    row = frame.tail(1).copy()
    row[key] = value
    row["event_timestamp"] = at.tz_convert(frame["event_timestamp"].dt.tz) if frame["event_timestamp"].dt.tz \
        else at.tz_localize(None)
    staged = path.with_suffix(".staged")
    pd.concat([frame, row], ignore_index=True).to_parquet(staged, index=False)
    staged.replace(path)


def condition(kube, namespace: str, kind: str) -> dict:
    status = kube.get(API_VERSION, "InferenceService", "fraud", namespace).get("status", {})
    return next((c for c in status.get("conditions", []) if c["type"] == kind), {})


def firing(prometheus: str, store: str) -> list[dict]:
    alerts = requests.get(f"{prometheus}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    return [a for a in alerts if a["labels"].get("alertname") == "KubeloopOnlineFeaturesStale"
            and a["labels"].get("store") == store and a["state"] == "firing"]


@pytest.mark.timeout(600)
def test_the_operator_keeps_the_online_store_fresh_and_stale_data_raises_the_alert(
        platform, kube, namespace, start_operator, tmp_path):
    env = platform.env()
    uri = env["MLFLOW_TRACKING_URI"]
    # Never materialised by hand: the online store starts empty.
    repo = create_repository(tmp_path / "repo", Scenario(start=default_start(21), days=21, seed=5))
    model = f"{namespace}-fraud"
    version = register_fraud_model(uri, model, repo, tmp_path / "train")
    MlflowClient(uri).set_registered_model_alias(model, "champion", version)
    store = store_key(MlflowClient(uri).get_model_version(model, version).tags[FEATURE_STORE])

    op = start_operator([namespace], **operator_env(env, repo, tmp_path / "work", resync_seconds=1))
    op.wait_for_log("webhooks and /metrics on", timeout=60)
    kube.create({"apiVersion": API_VERSION, "kind": "InferenceService",
                 "metadata": {"name": "fraud", "namespace": namespace},
                 "spec": {"model": {"name": model, "alias": "champion"},
                          "features": {"missing": "reject", "materializeEvery": "2s"}}})
    url = wait_for(lambda: (s := kube.get(API_VERSION, "InferenceService", "fraud", namespace).get("status", {}))
                   .get("phase") == "Ready" and s["url"], timeout=300, interval=0.5, what="the service Ready")
    fresh = wait_for(lambda: condition(kube, namespace, "FeaturesFresh").get("status") == "True"
                     and condition(kube, namespace, "FeaturesFresh"), timeout=120, what="FeaturesFresh True")
    assert fresh["reason"] == "Materialized" and "every 2s" in fresh["message"]

    # A card and a merchant the stores have never seen: refused by policy...
    request = entity_request(pd.DataFrame([{"card_id": NEW_CARD, "merchant_id": NEW_MERCHANT, "amount": 42.5,
                                            "hour": 13, "channel": "online"}]))
    refused = infer(url, model, request)
    assert refused.status_code == 422 and f"card_id={NEW_CARD}" in refused.text
    # ...until their rows reach the offline store and the schedule carries them online.
    at = pd.Timestamp.now(tz="UTC") + pd.Timedelta(seconds=1)
    for source, key, value in (("card_activity", "card_id", NEW_CARD), ("card_profile", "card_id", NEW_CARD),
                               ("merchant_risk", "merchant_id", NEW_MERCHANT)):
        add_row(repo, source, key, value, at)
    added = time.monotonic()
    answered = wait_for(lambda: (r := infer(url, model, request)).status_code == 200 and r.json(), timeout=60,
                        interval=0.5, what="the new card served from the online store")
    assert 0.0 <= answered["outputs"][0]["data"][0] <= 1.0
    print(f"new offline rows served online after {time.monotonic() - added:.1f} s (materializeEvery 2s)")

    # The card_activity pipeline breaks: its source disappears. Materialisation
    # fails, the service says so, and its online features age into the alert.
    (repo / "data" / "card_activity.parquet").rename(repo / "data" / "card_activity.parquet.lost")
    broken = time.monotonic()
    failed = wait_for(lambda: condition(kube, namespace, "FeaturesFresh").get("status") == "False"
                      and condition(kube, namespace, "FeaturesFresh"), timeout=60, what="FeaturesFresh False")
    assert failed["reason"] == "MaterializationFailed" and "card_activity" in failed["message"]
    alerts = wait_for(lambda: firing(env["PROMETHEUS_URL"], store), timeout=150, interval=2,
                      what="KubeloopOnlineFeaturesStale firing in Prometheus")
    print(f"source lost -> KubeloopOnlineFeaturesStale firing: {time.monotonic() - broken:.0f} s "
          "(limit 6 s, for 1m, 5 s scrape and evaluation)")
    assert {a["labels"]["view"] for a in alerts} == {"card_activity"}
    assert alerts[0]["labels"]["project"] == "kubeloop_fraud"
    # The views that still materialise stay fresh; serving goes on (stale, as the alert says).
    assert infer(url, model, request).status_code == 200
