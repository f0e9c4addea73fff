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
    assert drift_alerts(payload) == [("ml", "f", {"fingerprint": "abc", "startsAt": "2027-01-01T00:00:00Z",
                                                  "share": "0.5"})]


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


def post(kube, body: bytes, token: str = "t0ken"):
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer
    from prometheus_client import CollectorRegistry

    from kubeloop.operator.webhooks import WebhookConfig, Webhooks

    async def go():
        async with TestClient(TestServer(Webhooks(kube, WebhookConfig("t0ken"), CollectorRegistry()).app())) as client:
            response = await client.post("/hooks/alertmanager", data=body,
                                         headers={"Authorization": f"Bearer {token}"})
            return response.status, await response.json()

    return asyncio.run(go())


def test_a_body_that_is_not_json_is_refused_with_400():
    kube = RecordingKube()
    assert post(kube, b"{not json") == (400, {"error": "the body is not JSON"})
    assert post(kube, b"[1, 2]") == (200, {"recorded": 0})
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
    assert json.loads(patch["metadata"]["annotations"]["signals.kubeloop.dev/drift-alert"])["fingerprint"] == "abc"
