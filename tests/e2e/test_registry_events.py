"""An InferenceService follows its alias when it moves: told at once by
MLflow's registry webhook, or found by the periodic resync without it."""

from __future__ import annotations

import time

import pytest
import requests
from mlflow import MlflowClient

from kubeloop.api.constants import API_VERSION
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(autouse=True)
def no_webhook_left_behind(platform):
    """MLflow delivers to a registered webhook, retrying for most of a minute, even
    after this test's operator is gone: later tests' alias moves would wait on it."""
    yield
    client = MlflowClient(platform.env()["MLFLOW_TRACKING_URI"])
    for hook in client.list_webhooks():
        if hook.name == "kubeloop-operator":
            client.delete_webhook(hook.webhook_id)


@pytest.fixture
def model(platform, namespace):
    client = MlflowClient(platform.env()["MLFLOW_TRACKING_URI"])
    name = f"{namespace}-follow"
    client.create_registered_model(name)
    for i in (1, 2):
        client.create_model_version(name, source=f"s3://models/{name}/{i}")
    client.set_registered_model_alias(name, "champion", "1")
    return client, name


def isvc(namespace: str, model: str) -> dict:
    return {"apiVersion": API_VERSION, "kind": "InferenceService", "metadata": {"name": "follow", "namespace": namespace},
            "spec": {"model": {"name": model, "alias": "champion"}, "backend": "kubernetes",
                     "resources": {"cpu": "50m", "memory": "64Mi"}}}


def serving(kube, namespace) -> str | None:
    obj = kube.get(API_VERSION, "InferenceService", "follow", namespace)
    return obj.get("status", {}).get("modelVersion") if obj else None


def test_the_webhook_moves_the_service_without_waiting_for_a_resync(platform, kube, namespace, model,
                                                                     start_operator):
    client, name = model
    env = platform.env()
    op = start_operator([namespace], KUBELOOP_REGISTRY="mlflow", MLFLOW_TRACKING_URI=env["MLFLOW_TRACKING_URI"],
                        KUBELOOP_SERVING_BACKENDS="kubernetes", KUBELOOP_RESYNC_SECONDS="600",
                        KUBELOOP_WEBHOOK_PORT=env["KUBELOOP_WEBHOOK_PORT"],
                        KUBELOOP_WEBHOOK_TOKEN_FILE=env["KUBELOOP_WEBHOOK_TOKEN_FILE"],
                        KUBELOOP_MLFLOW_WEBHOOK_SECRET_FILE=env["KUBELOOP_MLFLOW_WEBHOOK_SECRET_FILE"],
                        KUBELOOP_MLFLOW_WEBHOOK_URL=env["KUBELOOP_MLFLOW_WEBHOOK_URL"])
    op.wait_for_log("Initial authentication has finished")
    kube.create(isvc(namespace, name))
    wait_for(lambda: serving(kube, namespace) == "1", timeout=120, what="serving version 1")
    client.set_registered_model_alias(name, "champion", "2")
    # Resyncs are 600 s apart: only the webhook can move it within a minute.
    wait_for(lambda: serving(kube, namespace) == "2", timeout=60, interval=0.2, what="following the alias")
    event = kube.get(API_VERSION, "InferenceService", "follow", namespace)["metadata"]["annotations"]
    assert event["signals.kubeloop.dev/registry-event"].startswith("champion=2@")
    deployment = kube.get("apps/v1", "Deployment", "follow-predictor", namespace)
    assert deployment["spec"]["template"]["metadata"]["labels"]["kubeloop.dev/model-version"] == "2"

    # A forged delivery is refused.
    forged = requests.post(f"http://127.0.0.1:{env['KUBELOOP_WEBHOOK_PORT']}/hooks/mlflow", json={
        "entity": "model_version_alias", "action": "created", "data": {"name": name, "alias": "champion"}},
        headers={"X-MLflow-Signature": "v1,forged", "X-MLflow-Timestamp": str(int(time.time()))}, timeout=5)
    assert forged.status_code == 401


def test_without_the_webhook_the_resync_finds_the_move(platform, kube, namespace, model, start_operator):
    client, name = model
    op = start_operator([namespace], KUBELOOP_REGISTRY="mlflow",
                        MLFLOW_TRACKING_URI=platform.env()["MLFLOW_TRACKING_URI"],
                        KUBELOOP_SERVING_BACKENDS="kubernetes", KUBELOOP_RESYNC_SECONDS="3")
    op.wait_for_log("Initial authentication has finished")
    kube.create(isvc(namespace, name))
    wait_for(lambda: serving(kube, namespace) == "1", timeout=120, what="serving version 1")
    client.set_registered_model_alias(name, "champion", "2")
    wait_for(lambda: serving(kube, namespace) == "2", timeout=20, what="the resync following the alias")
    assert "signals.kubeloop.dev/registry-event" not in (
        kube.get(API_VERSION, "InferenceService", "follow", namespace)["metadata"].get("annotations") or {})


def test_rotated_webhook_secrets_take_effect_without_a_restart(platform, kube, namespace, model, start_operator,
                                                               tmp_path):
    """Local platform: the operator re-reads Alertmanager's token and MLflow's signing
    secret when their files change (as a Secret volume does on rotation), and registers
    the MLflow webhook again with the new secret."""
    import secrets

    from tests.support.alerts import post_alert

    client, name = model
    env = platform.env()
    token, signing = tmp_path / "token", tmp_path / "signing"
    token.write_text("old-token")
    signing.write_text("old-signing-secret")
    port = env["KUBELOOP_WEBHOOK_PORT"]
    op = start_operator([namespace], KUBELOOP_REGISTRY="mlflow", MLFLOW_TRACKING_URI=env["MLFLOW_TRACKING_URI"],
                        KUBELOOP_SERVING_BACKENDS="kubernetes", KUBELOOP_RESYNC_SECONDS="600",
                        KUBELOOP_WEBHOOK_PORT=port, KUBELOOP_WEBHOOK_TOKEN_FILE=str(token),
                        KUBELOOP_MLFLOW_WEBHOOK_SECRET_FILE=str(signing),
                        KUBELOOP_MLFLOW_WEBHOOK_URL=env["KUBELOOP_MLFLOW_WEBHOOK_URL"])
    op.wait_for_log("MLflow webhook registered", timeout=60)
    kube.create(isvc(namespace, name))
    wait_for(lambda: serving(kube, namespace) == "1", timeout=120, what="serving version 1")
    alert = {"fingerprint": "rot", "startsAt": "2027-01-15T08:00:00Z",
             "labels": {"alertname": "KubeloopDataDrift", "namespace": namespace, "inferenceservice": "follow"}}
    url = f"http://127.0.0.1:{port}/hooks/alertmanager"
    assert post_alert(url, "old-token", alert).status_code == 200

    fresh = secrets.token_urlsafe(16)
    token.write_text(fresh)
    signing.write_text(secrets.token_urlsafe(16))
    assert post_alert(url, "old-token", alert).status_code == 401
    assert post_alert(url, fresh, alert).status_code == 200
    # MLflow now signs with the new secret: an alias move still reaches the operator at once.
    wait_for(lambda: op.log().count("MLflow webhook registered") >= 2, timeout=30, what="registered again")
    client.set_registered_model_alias(name, "champion", "2")
    # Resyncs are 600 s apart: only a delivery MLflow signed with the new secret moves it.
    wait_for(lambda: serving(kube, namespace) == "2", timeout=20, interval=0.2, what="following the alias")
