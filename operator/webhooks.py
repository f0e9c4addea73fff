"""The operator's HTTP endpoints: Alertmanager's and MLflow's webhooks, and
/metrics for Prometheus.

Webhooks never act on their own: they record what they heard as an
annotation on the InferenceServices it concerns (the drift alert, the alias
that moved), which wakes the reconciler, and the reconciler decides. So a
redelivered webhook changes nothing, and nothing is lost if the operator
restarts between hearing and acting.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import time
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from kubeloop.api.constants import ANNOTATION_DRIFT_ALERT as DRIFT_ALERT_ANNOTATION
from kubeloop.api.constants import ANNOTATION_REGISTRY_EVENT as REGISTRY_EVENT_ANNOTATION
from kubeloop.api.resources import INFERENCE_SERVICE
from kubeloop.operator.kube import Kube

log = logging.getLogger("kubeloop.operator.webhooks")
DRIFT_ALERTS = ("KubeloopDataDrift",)
MAX_SKEW_SECONDS = 300


@dataclass(frozen=True)
class WebhookConfig:
    token: str
    """Bearer token Alertmanager sends, and the MLflow webhooks' signing secret."""
    namespaces: tuple[str, ...] = ()


def mlflow_signature(secret: str, delivery_id: str, timestamp: str, body: bytes) -> str:
    digest = hmac.new(secret.encode(), f"{delivery_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def drift_alerts(payload: dict) -> list[tuple[str, str, dict]]:
    """(namespace, inference service, alert record) for each firing drift alert (pure)."""
    out = []
    for alert in payload.get("alerts", []):
        labels = alert.get("labels", {})
        if alert.get("status") != "firing" or labels.get("alertname") not in DRIFT_ALERTS:
            continue
        if not labels.get("namespace") or not labels.get("inferenceservice"):
            continue
        record = {"fingerprint": alert.get("fingerprint", ""), "startsAt": alert.get("startsAt", ""),
                  "share": alert.get("annotations", {}).get("share", "")}
        out.append((labels["namespace"], labels["inferenceservice"], record))
    return out


def follows(spec: dict, model: str, alias: str) -> bool:
    """Whether an InferenceService spec refers to the model through the alias (pure)."""
    if spec.get("model", {}).get("name") != model:
        return False
    refs = [spec.get("model", {}), spec.get("canary") or {}, spec.get("shadow") or {}]
    return any(ref.get("alias") == alias for ref in refs)


class Webhooks:
    def __init__(self, kube: Kube, config: WebhookConfig, registry: CollectorRegistry):
        self.kube = kube
        self.config = config
        self.registry = registry
        self.received = Counter("kubeloop_webhook_requests_total", "Webhook requests by source and outcome.",
                                ["source", "outcome"], registry=registry)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/hooks/alertmanager", self.alertmanager)
        app.router.add_post("/hooks/mlflow", self.mlflow)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/healthz", lambda _: web.Response(text="ok"))
        return app

    async def alertmanager(self, request: web.Request) -> web.Response:
        expected = f"Bearer {self.config.token}"
        if not hmac.compare_digest(request.headers.get("Authorization", ""), expected):
            self.received.labels("alertmanager", "unauthorized").inc()
            return web.json_response({"error": "unauthorized"}, status=401)
        try:
            payload = await request.json()
        except ValueError:
            self.received.labels("alertmanager", "malformed").inc()
            return web.json_response({"error": "the body is not JSON"}, status=400)
        alerts = drift_alerts(payload) if isinstance(payload, dict) else []
        for namespace, name, record in alerts:
            await asyncio.to_thread(self._annotate, namespace, name, DRIFT_ALERT_ANNOTATION,
                                    json.dumps(record, sort_keys=True))
        self.received.labels("alertmanager", "accepted" if alerts else "ignored").inc()
        return web.json_response({"recorded": len(alerts)})

    async def mlflow(self, request: web.Request) -> web.Response:
        body = await request.read()
        delivery, stamp = request.headers.get("X-MLflow-Delivery-Id", ""), request.headers.get("X-MLflow-Timestamp", "0")
        signature = request.headers.get("X-MLflow-Signature", "")
        if not hmac.compare_digest(signature, mlflow_signature(self.config.token, delivery, stamp, body)):
            self.received.labels("mlflow", "unauthorized").inc()
            return web.json_response({"error": "bad signature"}, status=401)
        if abs(time.time() - int(stamp)) > MAX_SKEW_SECONDS:
            self.received.labels("mlflow", "stale").inc()
            return web.json_response({"error": "stale delivery"}, status=400)
        event = json.loads(body)
        data = event.get("data", {})
        if event.get("entity") != "model_version_alias":
            self.received.labels("mlflow", "ignored").inc()
            return web.json_response({"recorded": 0})
        touched = await asyncio.to_thread(self._wake_followers, data.get("name"), data.get("alias"),
                                          f"{data.get('alias')}={data.get('version', '')}@{stamp}")
        self.received.labels("mlflow", "accepted").inc()
        return web.json_response({"recorded": touched})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _annotate(self, namespace: str, name: str, key: str, value: str) -> None:
        patch = {"metadata": {"annotations": {key: value}}}
        try:
            self.kube.merge_patch(INFERENCE_SERVICE.api_version, INFERENCE_SERVICE.kind, name, patch, namespace)
        except Exception as exc:  # one missing object must not fail the whole delivery
            log.warning("cannot annotate %s/%s: %s", namespace, name, exc)

    def _wake_followers(self, model: str, alias: str, value: str) -> int:
        namespaces = self.config.namespaces or (None,)
        touched = 0
        for namespace in namespaces:
            for obj in self.kube.list(INFERENCE_SERVICE.api_version, INFERENCE_SERVICE.kind, namespace):
                if follows(obj.get("spec", {}), model, alias):
                    self._annotate(obj["metadata"]["namespace"], obj["metadata"]["name"],
                                   REGISTRY_EVENT_ANNOTATION, value)
                    touched += 1
        return touched


async def serve(webhooks: Webhooks, address: str, port: int) -> web.AppRunner:
    runner = web.AppRunner(webhooks.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, address, port).start()
    log.info("webhooks and /metrics on %s:%d", address, port)
    return runner


def ensure_mlflow_webhook(tracking_uri: str, url: str, secret: str, name: str = "kubeloop-operator") -> str:
    """Create (or bring up to date) the MLflow webhook that tells this
    operator about alias moves; returns its id."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    events = ["model_version_alias.created", "model_version_alias.deleted"]
    for hook in client.list_webhooks():
        if hook.name == name:
            client.update_webhook(hook.webhook_id, url=url, events=events, secret=secret, status="ACTIVE")
            return hook.webhook_id
    return client.create_webhook(name=name, url=url, events=events, secret=secret).webhook_id
