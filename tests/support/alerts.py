"""What Alertmanager posts to a webhook receiver, for tests that play its part."""

from __future__ import annotations

import requests


def post_alert(url: str, token: str, alert: dict) -> requests.Response:
    """Post one firing alert (labels, annotations, startsAt, fingerprint) as Alertmanager does."""
    payload = {"version": "4", "status": "firing", "receiver": "kubeloop-operator", "alerts": [{
        "status": "firing", "labels": alert["labels"], "annotations": alert.get("annotations", {}),
        "startsAt": alert["startsAt"], "fingerprint": alert["fingerprint"]}]}
    return requests.post(url, json=payload, headers={"Authorization": f"Bearer {token}"}, timeout=10)
