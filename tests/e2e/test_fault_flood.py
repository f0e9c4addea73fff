"""A flood of webhook posts against the operator as a real process (local
platform; the webhook endpoint is the same on a cluster, but this test is
evidence for the local setup only).

Scale: 5,000 posts, 16 at a time: valid alerts for 5 InferenceServices, each
alert posted about 300 times (Alertmanager redelivers), malformed bodies and
headers, and wrong tokens, interleaved at random (seed printed)."""

from __future__ import annotations

import json
import random
import secrets
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from kubeloop.api.constants import API_VERSION, LABEL_RETRAIN_OF
from kubeloop.processes import free_port
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
POSTS = 5000
SERVICES = 5


def service(namespace: str, name: str) -> dict:
    return {"apiVersion": API_VERSION, "kind": "InferenceService", "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": {"name": "flood", "alias": "champion"}, "backend": "kubernetes",
                     "resources": {"cpu": "50m", "memory": "64Mi"},
                     "monitoring": {"schedule": "1h", "window": "1h"},
                     "retraining": {"cooldown": "1h", "template": {
                         "modelName": "flood", "backend": "noop",
                         "features": {"featureViews": ["card_activity"],
                                      "labels": {"source": "transactions", "column": "is_fraud"}}}}}}


def alert(namespace: str, name: str) -> dict:
    return {"status": "firing", "labels": {"alertname": "KubeloopDataDrift", "namespace": namespace,
                                           "inferenceservice": name},
            "annotations": {"share": "0.6"}, "startsAt": "2027-01-15T08:00:00.36Z", "fingerprint": f"fp-{name}"}


def posts(namespace: str, names: list[str], token: str, rng: random.Random) -> list[tuple[str, dict, bytes, int]]:
    """(kind, headers, body, expected status) for every post."""
    good = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    malformed = [
        b"{not json", b"[1, 2]", json.dumps({"alerts": {"a": 1}}).encode(),
        json.dumps({"alerts": [["list"]]}).encode(),
        json.dumps({"alerts": [{**alert(namespace, names[0]), "startsAt": "yesterday"}]}).encode(),
        json.dumps({"alerts": [{**alert(namespace, names[0]), "labels": ["x"]}]}).encode(),
    ]
    out = []
    for i in range(POSTS):
        draw = rng.random()
        if draw < 0.3:
            body = json.dumps({"alerts": [alert(namespace, names[i % len(names)])]}).encode()
            out.append(("valid", good, body, 200))
        elif draw < 0.55:
            out.append(("malformed", good, rng.choice(malformed), 400))
        elif draw < 0.6:
            bad_header = {**good, "Authorization": f"Bearer {token}\u00e9".encode("latin-1")}
            out.append(("malformed", bad_header, b"{}", 400))
        elif draw < 0.85:
            body = json.dumps({"alerts": [alert(namespace, names[0])]}).encode()
            out.append(("unauthenticated", {**good, "Authorization": "Bearer wrong"}, body, 401))
        else:
            body = json.dumps({"alerts": [alert(namespace, names[0])]}).encode()
            out.append(("unauthenticated", {"Content-Type": "application/json"}, body, 401))
    return out


def test_a_flood_of_webhook_posts(kube, namespace, start_operator, tmp_path):
    """Local: one retrain per alert key, every malformed post 400, every
    unauthenticated one 401, and the operator's memory flat."""
    seed = random.SystemRandom().randrange(2**32)
    print(f"webhook flood seed: {seed}")
    rng = random.Random(seed)
    token = secrets.token_urlsafe(24)
    token_file = tmp_path / "token"
    token_file.write_text(token)
    port = free_port()
    names = [f"svc-{i}" for i in range(SERVICES)]
    for name in names:
        kube.create(service(namespace, name))
    op = start_operator([namespace], KUBELOOP_WEBHOOK_PORT=str(port), KUBELOOP_WEBHOOK_TOKEN_FILE=str(token_file),
                        KUBELOOP_PIPELINE_BACKENDS="noop", KUBELOOP_PIPELINE_BACKEND="noop",
                        KUBELOOP_RESYNC_SECONDS="5")
    op.wait_for_log("webhooks and /metrics on", timeout=60)
    url = f"http://127.0.0.1:{port}/hooks/alertmanager"
    plan = posts(namespace, names, token, rng)
    session = requests.Session()
    session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=16))

    def send(item: tuple[str, dict, bytes, int]) -> tuple[str, int, int]:
        kind, headers, body, expected = item
        status = session.post(url, data=body, headers=headers, timeout=30).status_code
        # Alertmanager sends again what was not acknowledged; so does this test.
        while kind == "valid" and status == 503:
            status = session.post(url, data=body, headers=headers, timeout=30).status_code
        return kind, expected, status

    with ThreadPoolExecutor(16) as pool:
        warm = list(pool.map(send, plan[:500]))
        baseline = op.rss_mib()
        rest = list(pool.map(send, plan[500:]))
    wrong = [(kind, expected, status) for kind, expected, status in warm + rest if status != expected]
    assert wrong == [], wrong[:10]
    growth = op.rss_mib() - baseline
    print(f"operator memory after 500 posts {baseline:.0f} MiB, after {POSTS}: +{growth:.0f} MiB")
    assert growth < 64, f"the operator grew {growth:.0f} MiB over {POSTS - 500} posts"

    def handled(name: str) -> bool:
        status = (kube.get(API_VERSION, "InferenceService", name, namespace) or {}).get("status") or {}
        return any(key.startswith(f"fp-{name}@") for key in status.get("handledAlerts", []))

    wait_for(lambda: all(handled(n) for n in names), timeout=120, what="every alert handled")
    for name in names:
        jobs = kube.list(API_VERSION, "TrainingJob", namespace, f"{LABEL_RETRAIN_OF}={name}")
        assert len(jobs) == 1, (name, [j["metadata"]["name"] for j in jobs])
    assert op.running()
