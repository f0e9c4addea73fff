"""Entity requests on the local backend: the fraud InferenceService answers a
request that carries only the raw transaction (card, merchant, amount, hour,
channel) by reading the rest from the materialised Feast online store, with
the probability the raw-vector request built from the offline store for the
same entities at the same time gets, over HTTP and over gRPC; an unknown
card follows the stated policy (training default or 422), counted by view;
the skew check finds the logged vectors equal to the offline store's.

Backend: local (real tritonserver, router, Feast file offline store, MLflow),
with Feast's sqlite online store. The same with Redis as the online store is
a component test (tests/components/test_serving_tasks.py): the router and
tritonserver as the local backend starts them, without the platform."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from mlflow import MlflowClient
from tritonclient.utils import triton_to_np_dtype

from kubeloop.api.constants import API_VERSION
from kubeloop.api.signature import ModelSignature
from kubeloop.featurestore.generate import Scenario, default_start
from kubeloop.featurestore.store import create_repository
from kubeloop.requestlog import request_records
from tests.support.entities import (SENT, answered_as_the_offline_vectors, entity_request, missing_count,
                                    recent_with_offline_vectors)
from tests.support.models import register_fraud_model
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e
UNKNOWN_CARD = 10**9


def infer(url: str, model: str, body: dict) -> requests.Response:
    return requests.post(f"{url}/v2/models/{model}/infer", json=body, timeout=30)


def grpc_infer(address: str, model: str, body: dict) -> np.ndarray:
    """A v2 request's tensors sent with tritonclient.grpc; its first output."""
    tensors = []
    for tensor in body["inputs"]:
        values = np.array([str(v).encode() for v in tensor["data"]], dtype=np.object_) \
            if tensor["datatype"] == "BYTES" else np.array(tensor["data"], dtype=triton_to_np_dtype(tensor["datatype"]))
        tensors.append(grpcclient.InferInput(tensor["name"], tensor["shape"], tensor["datatype"]))
        tensors[-1].set_data_from_numpy(values)
    result = grpcclient.InferenceServerClient(address).infer(model, tensors, client_timeout=30)
    return result.as_numpy(result.get_response().outputs[0].name)


@pytest.fixture
def fraud(platform, namespace, tmp_path):
    """A feature repository whose data ends today, its online store sqlite,
    materialised with the `kubeloop features materialize` command, and the
    example's fraud model trained on it and registered as champion."""
    uri = platform.env()["MLFLOW_TRACKING_URI"]
    repo = create_repository(tmp_path / "repo", Scenario(start=default_start(21), days=21, seed=5))
    subprocess.run([sys.executable, "-m", "kubeloop.cli", "features", "materialize", "--repo", str(repo)],
                   check=True, timeout=300)
    assert (repo / "data" / "online.db").exists()
    model = f"{namespace}-fraud"
    version = register_fraud_model(uri, model, repo, tmp_path / "train")
    MlflowClient(uri).set_registered_model_alias(model, "champion", version)
    return repo, model, version


def test_entity_requests_answer_as_the_offline_vector_and_unknown_cards_follow_the_policy(
        platform, kube, namespace, start_operator, fraud, tmp_path):
    repo, model, version = fraud
    uri = platform.env()["MLFLOW_TRACKING_URI"]
    log_dir = tmp_path / "requests"
    op = start_operator([namespace], KUBELOOP_REGISTRY="mlflow", MLFLOW_TRACKING_URI=uri,
                        KUBELOOP_SERVING_BACKENDS="local", KUBELOOP_SERVING_BACKEND="local",
                        KUBELOOP_REQUEST_LOG=str(log_dir))
    op.wait_for_log("Initial authentication has finished")
    kube.create({"apiVersion": API_VERSION, "kind": "InferenceService",
                 "metadata": {"name": "fraud", "namespace": namespace},
                 "spec": {"model": {"name": model, "alias": "champion"}, "features": {"missing": "default"}}})
    status = wait_for(lambda: (s := kube.get(API_VERSION, "InferenceService", "fraud", namespace).get("status", {}))
                      .get("phase") == "Ready" and s, timeout=300, interval=0.5, what="the service Ready")
    url = status["url"]

    # 32 recent transactions as the payment system sends them, now; the
    # offline store's point-in-time vectors for the same entities now.
    signature = ModelSignature.from_tags(MlflowClient(uri).get_model_version(model, version).tags)
    assert sorted(signature.entities + signature.request_columns) == sorted(SENT)
    sent, vectors = recent_with_offline_vectors(repo, signature)
    assert len(sent) >= 16, f"only {len(sent)} of 32 transactions have fresh features"

    expected = answered_as_the_offline_vectors(lambda body: infer(url, model, body), sent, vectors)
    one = infer(url, model, entity_request(sent.iloc[:1]))
    assert one.json()["outputs"][0]["data"][0] == pytest.approx(expected[0], rel=1e-5, abs=1e-6)
    # The same entity request over gRPC (raw tensors, the channel as BYTES): the same answers.
    np.testing.assert_allclose(grpc_infer(status["grpcAddress"], model, entity_request(sent)).ravel(), expected,
                               rtol=1e-5, atol=1e-6)

    # A request without a request-time column is refused, naming it.
    incomplete = entity_request(sent.iloc[:1])
    incomplete["inputs"] = [t for t in incomplete["inputs"] if t["name"] != "hour"]
    refused = infer(url, model, incomplete)
    assert refused.status_code == 400 and "hour" in refused.json()["error"]

    # The request log holds the assembled vectors; the skew check finds them
    # equal to the offline store's point-in-time values.
    wait_for(lambda: sum(len(r["features"]) for r in request_records(_log_folder(log_dir)) if r.get("request"))
             == 2 * len(sent) + 1, timeout=15, what="the entity requests in the request log")
    logged = [r for r in request_records(_log_folder(log_dir)) if r.get("request")]
    assert logged[0]["request"]["card_id"][:3] == sent["card_id"].tolist()[:3]
    assert np.allclose(np.array(logged[0]["features"], dtype=np.float32), vectors, rtol=1e-6)
    skew = subprocess.run([sys.executable, "-m", "kubeloop.cli", "serving", "skew", str(_log_folder(log_dir)),
                           "--model", model, "--tracking-uri", uri], capture_output=True, text=True, timeout=300)
    assert skew.returncode == 0, skew.stdout + skew.stderr
    assert f"{2 * len(sent) + 1} rows compared, 0 differ" in skew.stdout

    # An unknown card, policy default: answered with the training default in
    # place of its card views' features, and counted by view.
    stranger = sent.iloc[:1].assign(card_id=UNKNOWN_CARD)
    answered = infer(url, model, entity_request(stranger))
    assert answered.status_code == 200, answered.text
    assert missing_count(url, "card_activity", "default") == 1 and missing_count(url, "card_profile", "default") == 1
    assert missing_count(url, "merchant_risk", "default") == 0

    # Policy reject: 422 naming the card; known cards are still answered.
    live = kube.get(API_VERSION, "InferenceService", "fraud", namespace)
    live["spec"]["features"] = {"missing": "reject"}
    kube.apply({**live, "metadata": {k: live["metadata"][k] for k in ("name", "namespace")}}, field_manager="test")
    # (A Response is falsy when its status is 4xx: wait for its text.)
    rejected = wait_for(lambda: (r := infer(url, model, entity_request(stranger))).status_code == 422 and r.text,
                        timeout=30, interval=0.5, what="the reject policy in force")
    assert f"card_id={UNKNOWN_CARD} is not in the online store" in json.loads(rejected)["error"]
    assert missing_count(url, "card_activity", "reject") >= 1
    assert infer(url, model, entity_request(sent)).status_code == 200


def _log_folder(root):
    folders = {f.parent for f in root.rglob("*.jsonl")}
    return next(iter(folders)) if folders else root
