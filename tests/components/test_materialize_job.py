"""What a materialisation Job's Pod runs (python -m kubeloop.featurestore.job,
the cluster path's Pod side), here in this process against a real Feast
store published the way Pods open it: its registry and its Parquet sources
in a real S3 (SeaweedFS), read without s3fs (not on kubeloop's images).
The run comes from the environment as the operator's Job builder writes it,
and the result goes to the summary file as the operator reads it back.
The Job on the real node is tests/e2e/test_real_node.py."""

from __future__ import annotations

import time

import boto3
import yaml

from kubeloop.api.jobs import SUMMARY_BYTES
from kubeloop.dev import objectstore
from kubeloop.featurestore.freshness import Materialized, StoreNeed, job_request
from kubeloop.featurestore.generate import Scenario, default_start
from kubeloop.featurestore.job import ENV, main
from kubeloop.featurestore.store import StoreLocation, create_repository, open_store
from tests.components.test_objectstore import seaweed  # noqa: F401 - the fixture
from kubeloop.featurestore.publish import publish_sources


def test_the_job_materialises_a_store_whose_registry_and_sources_lie_in_object_storage(
        seaweed, tmp_path, monkeypatch):  # noqa: F811 - the fixture
    for name, value in objectstore.env(seaweed.endpoint, seaweed.credentials).items():
        monkeypatch.setenv(name, value)
    # boto3's default session keeps the credentials it first read (Feast's S3 registry and boto3.client use
    # it): one of this test's own, dropped afterwards, or later tests in this process reach their object
    # store with this one's keys (403).
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    repo = create_repository(tmp_path / "repo", Scenario(start=default_start(7), days=7, cards=50, merchants=10),
                             registry="s3://feast/published/registry.db")
    config = yaml.safe_load((repo / "feature_store.yaml").read_text())
    config["online_store"]["path"] = str(tmp_path / "online.db")  # where both this test and the "Pod" find it
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    publish_sources(repo, "s3://feast/published/data", seaweed.endpoint)
    text = (repo / "feature_store.yaml").read_text()
    store = StoreLocation(config=text).to_json()
    need = StoreNeed(store, ("transaction_context", "card_profile"), 60)

    end = time.time()
    monkeypatch.setenv(ENV, job_request(need, end))
    assert main(["--summary", str(tmp_path / "summary")]) == 0
    summary = (tmp_path / "summary").read_text()
    assert len(summary.encode()) <= SUMMARY_BYTES
    result = Materialized.from_summary(summary)
    assert result.error is None and result.project == "kubeloop_fraud"
    assert sorted(result.ends) == ["card_activity", "card_profile"]
    assert all(abs(e - end) < 1e-3 for e in result.ends.values())
    online = open_store(StoreLocation(config=text)).get_online_features(
        features=["card_profile:credit_limit"], entity_rows=[{"card_id": 1}]).to_dict()
    assert online["credit_limit"][0] is not None

    # A source gone from object storage fails its own view, says so, and exits 1;
    # the other view still moves on and every end comes back.
    boto3.client("s3").delete_object(Bucket="feast", Key="published/data/card_activity.parquet")
    monkeypatch.setenv(ENV, job_request(need, end + 30))
    assert main(["--summary", str(tmp_path / "summary")]) == 1
    failed = Materialized.from_summary((tmp_path / "summary").read_text())
    assert failed.error.startswith("card_activity: ")
    assert failed.ends["card_activity"] == result.ends["card_activity"]
    assert abs(failed.ends["card_profile"] - (end + 30)) < 1e-3
