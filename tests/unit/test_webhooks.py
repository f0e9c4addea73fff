"""What the operator's webhooks accept (pure parts)."""

from __future__ import annotations

import json

from kubeloop.operator.webhooks import drift_alerts, follows, mlflow_signature


def test_only_firing_drift_alerts_with_a_target_count():
    payload = {"alerts": [
        {"status": "firing", "labels": {"alertname": "KubeloopDataDrift", "namespace": "ml", "inferenceservice": "f"},
         "annotations": {"share": "0.5"}, "startsAt": "2027-01-01T00:00:00Z", "fingerprint": "abc"},
        {"status": "resolved", "labels": {"alertname": "KubeloopDataDrift", "namespace": "ml", "inferenceservice": "f"}},
        {"status": "firing", "labels": {"alertname": "KubeloopHighLatencyP95", "service": "ml/f"}},
        {"status": "firing", "labels": {"alertname": "KubeloopDataDrift"}},
    ]}
    assert drift_alerts(payload) == [("ml", "f", {"alertname": "KubeloopDataDrift", "fingerprint": "abc",
                                                  "startsAt": "2027-01-01T00:00:00Z", "share": "0.5"})]


def test_a_firing_concept_drift_alert_is_recorded_with_its_metric_and_drop():
    """Local and cluster: a live metric that dropped asks for a retrain the way input drift does."""
    labels = {"alertname": "KubeloopConceptDrift", "namespace": "ml", "inferenceservice": "f", "model": "fraud",
              "version": "3", "role": "primary", "metric": "auc"}
    payload = {"alerts": [
        {"status": "firing", "labels": labels, "annotations": {"drop": "0.07"},
         "startsAt": "2027-01-01T00:00:00Z", "fingerprint": "def"},
        {"status": "resolved", "labels": labels, "annotations": {"drop": "0.01"}, "fingerprint": "def"},
        {"status": "firing", "labels": {**labels, "alertname": "KubeloopGroundTruthStale"}},
    ]}
    assert drift_alerts(payload) == [("ml", "f", {"alertname": "KubeloopConceptDrift", "fingerprint": "def",
                                                  "startsAt": "2027-01-01T00:00:00Z", "drop": "0.07",
                                                  "metric": "auc"})]


def test_followers_of_an_alias():
    spec = {"model": {"name": "fraud", "alias": "champion"}, "canary": {"alias": "challenger", "percent": 10}}
    assert follows(spec, "fraud", "champion") and follows(spec, "fraud", "challenger")
    assert not follows(spec, "fraud", "other") and not follows(spec, "other", "champion")


def test_signature_matches_mlflows_scheme():
    import base64
    import hashlib
    import hmac

    body = b'{"entity": "model_version_alias"}'
    expected = base64.b64encode(hmac.new(b"s3cret", b"id-1.1700000000." + body, hashlib.sha256).digest()).decode()
    assert mlflow_signature("s3cret", "id-1", "1700000000", body) == f"v1,{expected}"


class RecordingKube:
    def __init__(self):
        self.patches = []

    def merge_patch(self, api_version, kind, name, patch, namespace=None):  # noqa: ANN001
        self.patches.append((namespace, name, patch))


def webhooks(kube, namespaces: tuple[str, ...] = ()):
    from prometheus_client import CollectorRegistry

    from kubeloop.operator.webhooks import WebhookConfig, Webhooks

    return Webhooks(kube, WebhookConfig(lambda: "t0ken", lambda: "m1flow", namespaces), CollectorRegistry())


def post(kube, body: bytes, token: str = "t0ken", namespaces: tuple[str, ...] = ()):
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    async def go():
        async with TestClient(TestServer(webhooks(kube, namespaces).app())) as client:
            response = await client.post("/hooks/alertmanager", data=body,
                                         headers={"Authorization": f"Bearer {token}"})
            return response.status, await response.json()

    return asyncio.run(go())


def test_a_body_that_is_not_json_is_refused_with_400():
    kube = RecordingKube()
    assert post(kube, b"{not json") == (400, {"error": "the body is not JSON"})
    assert kube.patches == []


def test_a_drift_alert_is_recorded_on_its_inference_service():
    kube = RecordingKube()
    alert = {"status": "firing", "labels": {"alertname": "KubeloopDataDrift", "namespace": "ml",
                                            "inferenceservice": "f"}, "startsAt": "2027-01-01T00:00:00.36Z",
             "fingerprint": "abc"}
    assert post(kube, json.dumps({"alerts": [alert]}).encode(), token="wrong")[0] == 401
    assert post(kube, json.dumps({"alerts": [alert]}).encode()) == (200, {"recorded": 1})
    [(namespace, name, patch)] = kube.patches
    assert (namespace, name) == ("ml", "f")
    record = json.loads(patch["metadata"]["annotations"]["signals.kubeloop.dev/drift-alert"])
    assert (record["fingerprint"], record["alertname"]) == ("abc", "KubeloopDataDrift")


class FailingKube(RecordingKube):
    """An API server that answers with the given status (0: unreachable)."""

    def __init__(self, status: int):
        super().__init__()
        self.status = status

    def merge_patch(self, api_version, kind, name, patch, namespace=None):  # noqa: ANN001
        from kubeloop.kube import KubeError

        raise KubeError(self.status, "Failure", "cannot patch")


def drift(namespace: str = "ml", name: str = "f", **overrides) -> dict:
    alert = {"status": "firing", "labels": {"alertname": "KubeloopDataDrift", "namespace": namespace,
                                            "inferenceservice": name},
             "startsAt": "2027-01-01T00:00:00.36Z", "fingerprint": "abc"}
    return {**alert, **overrides}


def test_a_concept_drift_alert_is_recorded_on_its_inference_service():
    kube = RecordingKube()
    alert = drift(labels={"alertname": "KubeloopConceptDrift", "namespace": "ml", "inferenceservice": "f",
                          "metric": "auc"}, annotations={"drop": "0.07"})
    assert post(kube, json.dumps({"alerts": [alert]}).encode()) == (200, {"recorded": 1})
    [(namespace, name, patch)] = kube.patches
    record = json.loads(patch["metadata"]["annotations"]["signals.kubeloop.dev/drift-alert"])
    assert (namespace, name) == ("ml", "f")
    assert record == {"alertname": "KubeloopConceptDrift", "fingerprint": "abc",
                      "startsAt": "2027-01-01T00:00:00.36Z", "drop": "0.07", "metric": "auc"}


def test_an_alert_that_was_not_recorded_is_not_acknowledged():
    """Local: Alertmanager redelivers on 5xx only, so an unrecorded alert must not get 200."""
    body = json.dumps({"alerts": [drift()]}).encode()
    status, answer = post(FailingKube(0), body)
    assert status == 503 and "ml/f" in answer["error"]
    assert post(FailingKube(500), body)[0] == 503
    # An InferenceService that does not exist: redelivery cannot help, and Alertmanager logs the 4xx.
    status, answer = post(FailingKube(404), body)
    assert status == 404 and "ml/f" in answer["error"]


def test_malformed_alert_payloads_get_400_naming_the_field():
    """Local: each malformed payload gets 400 (never 500), and nothing is recorded."""
    kube = RecordingKube()
    cases = {
        "alerts": {"alerts": {"not": "a list"}},
        "alerts.0": {"alerts": [["a list where an alert belongs"]]},
        "labels": {"alerts": [drift(labels=["a", "list"])]},
        "annotations": {"alerts": [drift(annotations="text")]},
        "startsAt": {"alerts": [drift(startsAt="yesterday")]},
        "the body": [1, 2],
    }
    for field, payload in cases.items():
        status, answer = post(kube, json.dumps(payload).encode())
        assert status == 400, (field, status, answer)
        assert field in answer["error"], (field, answer)
    assert kube.patches == []


def test_a_non_ascii_authorization_header_gets_400():
    """Local: aiohttp hands such a header over as text that hmac cannot compare (a 500 before)."""
    status, answer = post(RecordingKube(), b"{}", token="t\u00f6ken")
    assert status == 400 and "Authorization" in answer["error"]


def test_an_alert_for_a_namespace_the_operator_does_not_watch_is_refused():
    """Local: the webhook does not write where the operator does not reconcile."""
    kube = RecordingKube()
    alerts = {"alerts": [drift("ml", "f"), drift("elsewhere", "g")]}
    status, answer = post(kube, json.dumps(alerts).encode(), namespaces=("ml",))
    assert status == 403 and "elsewhere" in answer["error"]
    assert kube.patches == []


def signed_post(kube, body: bytes, secret: str = "m1flow", stamp: str | None = None, delivery: str = "d-1",
                signature: str | None = None):
    import asyncio
    import time

    from aiohttp.test_utils import TestClient, TestServer

    stamp = str(int(time.time())) if stamp is None else stamp
    headers = {"X-MLflow-Delivery-Id": delivery, "X-MLflow-Timestamp": stamp,
               "X-MLflow-Signature": signature or mlflow_signature(secret, delivery, stamp, body)}

    async def go():
        async with TestClient(TestServer(webhooks(kube).app())) as client:
            response = await client.post("/hooks/mlflow", data=body, headers=headers)
            return response.status, await response.json()

    return asyncio.run(go())


class ListingKube(RecordingKube):
    def list(self, api_version, kind, namespace=None, label_selector=None):  # noqa: ANN001
        return [{"metadata": {"namespace": "ml", "name": "f"},
                 "spec": {"model": {"name": "fraud", "alias": "champion"}}}]


def test_mlflow_deliveries_are_signed_with_their_own_secret_not_the_bearer_token():
    """Local: whoever reads MLflow's webhook secret cannot pass as Alertmanager, and vice versa."""
    kube = ListingKube()
    body = json.dumps({"entity": "model_version_alias", "action": "created",
                       "data": {"name": "fraud", "alias": "champion", "version": "2"}}).encode()
    assert signed_post(kube, body, secret="t0ken")[0] == 401
    assert signed_post(kube, body) == (200, {"recorded": 1})
    assert post(kube, json.dumps({"alerts": [drift()]}).encode(), token="m1flow")[0] == 401


def test_malformed_mlflow_deliveries_get_400():
    """Local: a signed body whose stamp is not a number, or that is not a JSON object, gets 400."""
    kube = ListingKube()
    assert signed_post(kube, b"{}", stamp="soon")[0] == 400
    assert signed_post(kube, b"[1]")[0] == 400
    assert signed_post(kube, b"{not json")[0] == 400
    assert signed_post(kube, json.dumps({"entity": "model_version_alias", "data": ["x"]}).encode())[0] == 400
    assert signed_post(kube, b"{}", signature="v1,\u00e9")[0] == 400
    assert kube.patches == []


def test_rotated_secrets_are_read_again_without_a_restart(tmp_path):
    """Local: a Secret volume's file changes in place; the next request uses the new value."""
    from kubeloop.operator.webhooks import SecretFile

    path = tmp_path / "token"
    path.write_text("first\n")
    secret = SecretFile(path)
    assert secret.value() == "first"
    path.write_text("second-and-longer\n")
    assert secret.value() == "second-and-longer"
    path.unlink()
    assert secret.value() == "second-and-longer"  # a missing file mid-rotation keeps the last value
