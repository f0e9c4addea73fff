"""What the operator's webhooks accept (pure parts)."""

from __future__ import annotations

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
