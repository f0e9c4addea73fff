"""The operator's HTTP endpoints: Alertmanager's and MLflow's webhooks, and
/metrics for Prometheus.

Webhooks never act on their own: they record what they heard as an
annotation on the InferenceServices it concerns (the drift alert, whether
its inputs drifted or its live quality dropped; the alias that moved),
which wakes the reconciler, and the reconciler decides. So a redelivered
webhook changes nothing, and nothing is lost if the operator restarts
between hearing and acting.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from kubeloop.api.constants import ANNOTATION_DRIFT_ALERT as DRIFT_ALERT_ANNOTATION
from kubeloop.api.constants import ANNOTATION_REGISTRY_EVENT as REGISTRY_EVENT_ANNOTATION
from kubeloop.api.resources import INFERENCE_SERVICE
from kubeloop.api.times import instant
from kubeloop.kube import Kube, KubeError

log = logging.getLogger("kubeloop.operator.webhooks")
DRIFT_ALERTS = ("KubeloopDataDrift", "KubeloopConceptDrift")
"""Alerts that ask for a retrain: the inputs drifted (data drift), or the
serving version's live metric dropped below its training-time one (concept
drift)."""
MAX_SKEW_SECONDS = 300


class SecretFile:
    """A secret mounted as a file (a Secret volume), read again whenever the
    file changes: rotating the Secret needs no restart."""

    def __init__(self, path: Path | None):
        self.path = path
        self._seen: tuple | None = None
        self._value = ""

    def value(self) -> str:
        if self.path is None:
            return ""
        try:
            info = os.stat(self.path)  # follows the ..data link a Secret volume swaps
            seen = (info.st_ino, info.st_mtime_ns, info.st_size)
            if seen != self._seen:
                self._value, self._seen = self.path.read_text().strip(), seen
        except FileNotFoundError:
            pass  # between the unlink and the new link of a rotation: the last value holds
        return self._value


@dataclass(frozen=True)
class WebhookConfig:
    token: Callable[[], str]
    """The bearer token Alertmanager sends (read on every call)."""
    mlflow_secret: Callable[[], str]
    """The MLflow webhooks' signing secret: another secret, so reading MLflow's
    webhook configuration does not let anyone post drift alerts."""
    namespaces: tuple[str, ...] = ()
    """The namespaces the operator watches; empty: all."""


class Malformed(ValueError):
    """A delivery that can never be recorded as it is (answered 400)."""


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Alert(_Lenient):
    status: str = ""
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    startsAt: str = ""
    fingerprint: str = ""

    @field_validator("startsAt")
    @classmethod
    def _rfc3339(cls, value: str) -> str:
        if value:
            instant(value)  # raises ValueError on a time it cannot read
        return value


class AlertmanagerPayload(_Lenient):
    alerts: list[Alert] = []


class AliasEvent(_Lenient):
    entity: str = ""
    data: dict = {}


def read_json(body: bytes) -> object:
    try:
        return json.loads(body)
    except ValueError:
        raise Malformed("the body is not JSON") from None


def validated(model: type[BaseModel], payload: object, sender: str) -> BaseModel:
    """The payload as the model, or Malformed naming each field that is wrong."""
    if not isinstance(payload, dict):
        raise Malformed(f"the body is a JSON {type(payload).__name__}, not the object {sender} posts")
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise Malformed("; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
                                  for err in exc.errors())) from None


def mlflow_signature(secret: str, delivery_id: str, timestamp: str, body: bytes) -> str:
    digest = hmac.new(secret.encode(), f"{delivery_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def drift_alerts(payload: dict) -> list[tuple[str, str, dict]]:
    """(namespace, inference service, alert record) for each firing drift alert
    (pure); Malformed if the payload is not what Alertmanager posts."""
    parsed = validated(AlertmanagerPayload, payload, "Alertmanager")
    out = []
    for alert in parsed.alerts:
        labels = alert.labels
        if alert.status != "firing" or labels.get("alertname") not in DRIFT_ALERTS:
            continue
        if not labels.get("namespace") or not labels.get("inferenceservice"):
            continue
        record = {"alertname": labels["alertname"], "fingerprint": alert.fingerprint, "startsAt": alert.startsAt,
                  **_evidence(alert)}
        out.append((labels["namespace"], labels["inferenceservice"], record))
    return out


def _evidence(alert: Alert) -> dict[str, str]:
    """What the alert measured, for whoever reads the annotation: the share
    of drifted features, or the metric and how far it dropped."""
    if alert.labels["alertname"] == "KubeloopConceptDrift":
        return {"drop": alert.annotations.get("drop", ""), "metric": alert.labels.get("metric", "")}
    return {"share": alert.annotations.get("share", "")}


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
        self.received = Counter("kubeloop_webhook_requests_total", "Webhook requests by source and outcome "
                                "(accepted, ignored, unauthorized, malformed, stale, refused, unrecorded, "
                                "unknown-target).", ["source", "outcome"], registry=registry)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/hooks/alertmanager", self.alertmanager)
        app.router.add_post("/hooks/mlflow", self.mlflow)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/healthz", lambda _: web.Response(text="ok"))
        return app

    async def alertmanager(self, request: web.Request) -> web.Response:
        try:
            authorization = _ascii_header(request, "Authorization")
            if not _token_matches(authorization, self.config.token()):
                return self._answer("alertmanager", "unauthorized", 401, {"error": "unauthorized"})
            alerts = drift_alerts(read_json(await request.read()))
        except Malformed as exc:
            return self._answer("alertmanager", "malformed", 400, {"error": str(exc)})
        foreign = sorted({ns for ns, _, _ in alerts if self.config.namespaces and ns not in self.config.namespaces})
        if foreign:
            return self._answer("alertmanager", "refused", 403, {
                "error": f"this operator does not watch namespace(s) {', '.join(foreign)}"})
        failures = {}
        for namespace, name, record in alerts:
            error = await asyncio.to_thread(self._annotate, namespace, name, DRIFT_ALERT_ANNOTATION,
                                            json.dumps(record, sort_keys=True))
            if error is not None:
                failures[f"{namespace}/{name}"] = error
        return self._settle("alertmanager", len(alerts), failures)

    async def mlflow(self, request: web.Request) -> web.Response:
        body = await request.read()
        try:
            delivery = _ascii_header(request, "X-MLflow-Delivery-Id")
            stamp = _ascii_header(request, "X-MLflow-Timestamp")
            signature = _ascii_header(request, "X-MLflow-Signature")
            secret = self.config.mlflow_secret()
            if not secret or not hmac.compare_digest(signature, mlflow_signature(secret, delivery, stamp, body)):
                return self._answer("mlflow", "unauthorized", 401, {"error": "bad signature"})
            if not stamp.isdigit():
                raise Malformed(f"X-MLflow-Timestamp {stamp!r} is not a Unix time")
            if abs(time.time() - int(stamp)) > MAX_SKEW_SECONDS:
                return self._answer("mlflow", "stale", 400, {"error": "stale delivery"})
            event = validated(AliasEvent, read_json(body), "MLflow")
        except Malformed as exc:
            return self._answer("mlflow", "malformed", 400, {"error": str(exc)})
        if event.entity != "model_version_alias":
            return self._answer("mlflow", "ignored", 200, {"recorded": 0})
        data = event.data
        touched, failures = await asyncio.to_thread(self._wake_followers, str(data.get("name")),
                                                    str(data.get("alias")),
                                                    f"{data.get('alias')}={data.get('version', '')}@{stamp}")
        return self._settle("mlflow", touched, failures)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _answer(self, source: str, outcome: str, status: int, body: dict) -> web.Response:
        self.received.labels(source, outcome).inc()
        return web.json_response(body, status=status)

    def _settle(self, source: str, recorded: int, failures: dict[str, KubeError]) -> web.Response:
        """200 only when everything was recorded. A failure a retry may cure is
        a 503, so the sender delivers again (recording is idempotent); an
        object that does not exist is a 404, which no retry cures."""
        if not failures:
            return self._answer(source, "accepted" if recorded else "ignored", 200, {"recorded": recorded})
        detail = "; ".join(f"{target}: {error}" for target, error in failures.items())
        if any(error.status != 404 for error in failures.values()):
            return self._answer(source, "unrecorded", 503, {"error": f"not recorded, send again: {detail}"})
        return self._answer(source, "unknown-target", 404, {"error": f"no such InferenceService: {detail}"})

    def _annotate(self, namespace: str, name: str, key: str, value: str) -> KubeError | None:
        patch = {"metadata": {"annotations": {key: value}}}
        try:
            self.kube.merge_patch(INFERENCE_SERVICE.api_version, INFERENCE_SERVICE.kind, name, patch, namespace)
        except KubeError as exc:
            log.warning("cannot annotate %s/%s: %s", namespace, name, exc)
            return exc
        return None

    def _wake_followers(self, model: str, alias: str, value: str) -> tuple[int, dict[str, KubeError]]:
        namespaces = self.config.namespaces or (None,)
        touched, failures = 0, {}
        for namespace in namespaces:
            try:
                objects = self.kube.list(INFERENCE_SERVICE.api_version, INFERENCE_SERVICE.kind, namespace)
            except KubeError as exc:
                failures[f"InferenceServices in {namespace or 'all namespaces'}"] = exc
                continue
            for obj in objects:
                if follows(obj.get("spec", {}), model, alias):
                    meta = obj["metadata"]
                    error = self._annotate(meta["namespace"], meta["name"], REGISTRY_EVENT_ANNOTATION, value)
                    if error is None:
                        touched += 1
                    else:
                        failures[f"{meta['namespace']}/{meta['name']}"] = error
        return touched, failures


def _ascii_header(request: web.Request, name: str) -> str:
    """A header that must be ASCII (tokens, signatures, stamps); Malformed otherwise."""
    value = request.headers.get(name, "")
    if not value.isascii():
        raise Malformed(f"the {name} header is not ASCII")
    return value


def _token_matches(authorization: str, token: str) -> bool:
    return bool(token) and hmac.compare_digest(authorization, f"Bearer {token}")


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

    from kubeloop.registry.headers import defer_feast_headers

    defer_feast_headers()
    client = MlflowClient(tracking_uri)
    events = ["model_version_alias.created", "model_version_alias.deleted"]
    for hook in client.list_webhooks():
        if hook.name == name:
            client.update_webhook(hook.webhook_id, url=url, events=events, secret=secret, status="ACTIVE")
            return hook.webhook_id
    return client.create_webhook(name=name, url=url, events=events, secret=secret).webhook_id


async def keep_mlflow_webhook(tracking_uri: str, url: str, secret: Callable[[], str],
                              interval: float = 10.0) -> None:
    """Register this operator's MLflow webhook, and register it again whenever
    the signing secret is rotated; MLflow being down only delays it."""
    registered = None
    while True:
        current = secret()
        if current and current != registered:
            try:
                await asyncio.to_thread(ensure_mlflow_webhook, tracking_uri, url, current)
                registered = current
                log.info("MLflow webhook registered at %s", url)
            except Exception as exc:  # MLflow down or refusing: try again next round
                log.warning("cannot register the MLflow webhook yet: %s", exc)
        await asyncio.sleep(interval)
