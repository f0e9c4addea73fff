"""kopf handlers: one thin handler per kind.

Each parses the body into the typed spec and status, calls its reconciler,
writes the returned status, posts events, and turns "try again later" into a
kopf.TemporaryError. The same handler serves create, update, resume and the
periodic timer, so the operator converges from whatever state it finds.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
from typing import Any, Callable

import kopf
from pydantic import BaseModel, ValidationError

from kubeloop.api.constants import FINALIZER, GROUP, VERSION
from kubeloop.api.refs import ObjectRef
from kubeloop.api.resources import INFERENCE_SERVICE, OPTIMIZED_MODEL, TRAINING_JOB, Kind
from kubeloop.operator.conditions import INVALID_SPEC, INVALID_STATUS, Observation, merge_conditions, now
from kubeloop.operator.kube import KubeError
from kubeloop.operator.ports import Objects, Ports
from kubeloop.operator.reconcilers.common import Event, Outcome, transition_events
from kubeloop.operator.reconcilers.optimization import reconcile_optimized_model
from kubeloop.operator.reconcilers.serving import reconcile_inference_service
from kubeloop.operator.reconcilers.training import reconcile_training_job
from kubeloop.operator.settings import OperatorConfig

log = logging.getLogger("kubeloop.operator")
Reconciler = Callable[..., Outcome]


def reconcile(kind: Kind, reconciler: Reconciler, meta: dict, spec: dict, status: dict | None,
              ports: Ports, retry: int = 0) -> Outcome:
    """Parse, reconcile, and map an invalid spec to a condition (no handler I/O)."""
    ref = ObjectRef.from_meta(kind.kind, meta)
    current, dropped = parse_status(kind, status)
    try:
        parsed = kind.spec.model_validate(spec)
    except ValidationError as exc:
        message = "; ".join(
            f"spec.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors())
        conditions = merge_conditions(current.conditions, [Observation("Ready", "False", INVALID_SPEC, message)],
                                      ref.generation, now())
        new = current.model_copy(update={"conditions": conditions, "phase": "Failed",
                                         "observed_generation": ref.generation})
        return Outcome(new, [Event("Warning", INVALID_SPEC, message)])
    outcome = reconciler(ref, parsed, current, ports, attempt=retry)
    if dropped:
        message = (f"status fields that failed validation were reset: {', '.join(dropped)}; "
                   "everything else was kept")
        conditions = merge_conditions(outcome.status.conditions,
                                      [Observation("StatusValid", "False", INVALID_STATUS, message)],
                                      ref.generation, now())
        outcome.status = outcome.status.model_copy(update={"conditions": conditions})
    outcome.events = outcome.events + transition_events(kind.kind, current, outcome.status)
    return outcome


def parse_status(kind: Kind, status: dict | None) -> tuple[BaseModel, list[str]]:
    """The typed status, and the fields left out because they failed validation
    (a hand edit, a status written by another version): each bad field or list
    item goes, the rest is kept (a retrain in its canary survives a bad
    readyReplicas)."""
    data = copy.deepcopy(status or {})
    dropped: list[str] = []
    for _ in range(64):
        try:
            return kind.status.model_validate(data), dropped
        except ValidationError as exc:
            removed = [path for err in exc.errors() if (path := _remove(data, err["loc"]))]
        if not removed:
            break
        dropped += [p for p in removed if p not in dropped]
    return kind.status(), dropped + ["(the rest)"]


def _remove(data: dict, loc: tuple) -> str | None:
    """Delete what loc points at, or the nearest thing above it that exists (a
    missing required field takes its parent); a list item goes whole (a
    condition without its status means nothing). Its path, or None."""
    index = next((i for i, key in enumerate(loc) if isinstance(key, int)), None)
    deepest = len(loc) if index is None else index + 1
    for depth in range(deepest, 0, -1):
        parent = data
        try:
            for key in loc[:depth - 1]:
                parent = parent[key]
            del parent[loc[depth - 1]]
        except (KeyError, IndexError, TypeError):
            continue
        return "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in loc[:depth]).lstrip(".")
    return None


def status_changes(old: dict | None, new: dict) -> dict:
    """The status fields that changed, as a merge patch: removed ones as
    None, which the patch deletes, at any depth (a merge patch merges nested
    objects, so a field dropped from one, like drift.message after a run that
    evaluated, would otherwise stay)."""
    old = old or {}
    changes = {}
    for key, value in new.items():
        before = old.get(key)
        if before == value:
            continue
        nested = isinstance(value, dict) and isinstance(before, dict)
        changes[key] = status_changes(before, value) if nested else value
    changes.update({key: None for key in old if key not in new and old[key] is not None})
    return changes


def apply_outcome(outcome: Outcome, status: dict | None, patch: kopf.Patch, body: kopf.Body) -> None:
    """Put the status fields that changed in kopf's patch and post the outcome's events."""
    for key, value in status_changes(status, outcome.status.to_wire()).items():
        patch.status[key] = value
    post_outcome(outcome, body)


def post_outcome(outcome: Outcome, body: kopf.Body) -> None:
    """Post the outcome's events; "try again later" becomes kopf's backoff."""
    for event in outcome.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message[:1024])
    if outcome.retry_after is not None:
        raise kopf.TemporaryError(outcome.retry_reason or "an external system is unavailable",
                                  delay=outcome.retry_after)


def _unfinished(status: dict, **_: Any) -> bool:
    """Finished runs have nothing left to converge and the timer leaves them
    alone, unless a condition is still undecided (a promotion that met a
    registry outage is Promoted=Unknown until a reconcile gets through)."""
    status = status or {}
    if status.get("phase") == "Succeeded":
        return any(c.get("status") == "Unknown" for c in status.get("conditions", []))
    return status.get("phase") != "Failed"


def build_registry(config: OperatorConfig) -> kopf.OperatorRegistry:
    """Every handler of the operator, in a registry of its own."""
    registry = kopf.OperatorRegistry()
    # In-cluster service account or the kubeconfig, as the kubernetes client finds them.
    kopf.on.login(registry=registry)(kopf.login_via_client)

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        # kopf's own bookkeeping lives under our API group, not kopf.zalando.org.
        settings.persistence.finalizer = FINALIZER
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=GROUP, key="last-handled-configuration")
        settings.posting.level = logging.WARNING
        # The chart installs the CRDs and names the namespaces: no need to watch
        # every CRD and namespace in the cluster (and to be allowed to).
        settings.scanning.disabled = True
        settings.execution.max_workers = 16
        settings.watching.server_timeout = 300
        # A timer still running when its object is deleted holds the finalizer
        # until kopf looks again: every 60 s by default, so `kubectl delete` hung.
        settings.background.cancellation_polling = 2
        settings.networking.request_timeout = 60
        if getattr(memo, "ports", None) is None:
            from kubeloop.operator.wiring import build_ports

            memo.ports = build_ports(config)
        if config.webhook_port and getattr(memo, "webhooks", None) is None:
            memo.webhooks, memo.mlflow_webhook = await _serve_webhooks(config, memo.ports)

    @kopf.on.cleanup(registry=registry)
    async def stop_webhooks(memo: kopf.Memo, **_: Any) -> None:
        if getattr(memo, "ports", None) is not None and memo.ports.materializer is not None:
            memo.ports.materializer.stop()
        if getattr(memo, "mlflow_webhook", None) is not None:
            memo.mlflow_webhook.cancel()
        if getattr(memo, "webhooks", None) is not None:
            await memo.webhooks.cleanup()

    for kind, reconciler, timer_when in (
        (TRAINING_JOB, reconcile_training_job, _unfinished),
        (OPTIMIZED_MODEL, reconcile_optimized_model, _unfinished),
        (INFERENCE_SERVICE, reconcile_inference_service, None),
    ):
        _register(registry, config, kind, reconciler, timer_when)

    @kopf.on.delete(GROUP, VERSION, TRAINING_JOB.plural, id="cancel-run", registry=registry)
    @kopf.on.delete(GROUP, VERSION, OPTIMIZED_MODEL.plural, id="cancel-run", registry=registry)
    def cancel_run(meta: dict, status: dict, spec: dict, memo: kopf.Memo, **_: Any) -> None:
        """A deleted object's pipeline run is cancelled if it is still going."""
        status = status or {}
        backend = memo.ports.pipelines.get(status.get("backend") or spec.get("backend")
                                           or memo.ports.default_pipeline_backend)
        with _locks.of(meta["uid"]):
            if backend and status.get("runId") and status.get("phase") == "Running":
                backend.cancel(status["runId"])
        _locks.forget(meta["uid"])

    @kopf.on.delete(GROUP, VERSION, INFERENCE_SERVICE.plural, id="stop-serving", registry=registry)
    def stop_serving(meta: dict, spec: dict, memo: kopf.Memo, **_: Any) -> None:
        """Backends that run processes outside Kubernetes stop them here, and
        the drift monitor and the materialiser let go of the object."""
        ref = ObjectRef.from_meta(INFERENCE_SERVICE.kind, meta)
        backend = memo.ports.serving.get(spec.get("backend") or memo.ports.default_serving_backend)
        with _locks.of(meta["uid"]):
            if backend:
                backend.delete(ref)
            if memo.ports.monitor:
                memo.ports.monitor.forget(ref)
            if memo.ports.materializer:
                memo.ports.materializer.forget(ref.uid)
        _locks.forget(meta["uid"])

    return registry


async def _serve_webhooks(config: OperatorConfig, ports: Ports):  # noqa: ANN202 - aiohttp AppRunner
    """Alertmanager's and MLflow's webhooks and /metrics, in kopf's event loop."""
    from prometheus_client import CollectorRegistry

    from kubeloop.monitoring.metrics import DriftCollector, FreshnessCollector
    from kubeloop.operator.kube import Kube
    from kubeloop.operator.webhooks import SecretFile, WebhookConfig, Webhooks, keep_mlflow_webhook, serve

    token, mlflow_secret = SecretFile(config.webhook_token_file), SecretFile(config.mlflow_webhook_secret_file)
    if not token.value():
        raise kopf.PermanentError(f"KUBELOOP_WEBHOOK_TOKEN_FILE ({config.webhook_token_file}) holds no token")
    metrics = CollectorRegistry()
    metrics.register(DriftCollector(config.state_dir / "monitoring"))
    if ports.materializer is not None:
        metrics.register(FreshnessCollector(ports.materializer))
    webhooks = Webhooks(ports.objects or Kube.from_environment(),
                        WebhookConfig(token.value, mlflow_secret.value, tuple(config.namespaces)), metrics)
    runner = await serve(webhooks, config.webhook_address, config.webhook_port)
    keeper = None
    if config.mlflow_webhook_url and config.tracking_uri:
        keeper = asyncio.create_task(keep_mlflow_webhook(config.tracking_uri, config.mlflow_webhook_url,
                                                         mlflow_secret.value))
    return runner, keeper


def _read(objects: Objects, kind: Kind, meta: dict) -> dict | None:
    try:
        return objects.get(kind.api_version, kind.kind, meta["name"], meta["namespace"])
    except KubeError as exc:
        raise kopf.TemporaryError(f"reading {kind.kind} {meta['name']}: {exc}", delay=5) from None


def _write_status(objects: Objects, kind: Kind, meta: dict, changes: dict) -> None:
    if not changes:
        return
    try:
        objects.merge_patch(kind.api_version, kind.kind, meta["name"], {"status": changes}, meta["namespace"],
                            subresource="status")
    except KubeError as exc:
        raise kopf.TemporaryError(f"writing the status of {kind.kind} {meta['name']}: {exc}", delay=5) from None


class ObjectLocks:
    """A lock per object, for reconciles that run in kopf's thread pool."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    def of(self, uid: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(uid, threading.Lock())

    def forget(self, uid: str) -> None:
        with self._guard:
            self._locks.pop(uid, None)


_locks = ObjectLocks()


def _register(registry: kopf.OperatorRegistry, config: OperatorConfig, kind: Kind,
              reconciler: Reconciler, timer_when: Callable[..., bool] | None) -> None:
    resource = (GROUP, VERSION, kind.plural)

    def handler(meta: dict, spec: dict, status: dict, patch: kopf.Patch, body: kopf.Body,
                memo: kopf.Memo, retry: int = 0, **_: Any) -> None:
        # kopf runs timers beside change handlers: one reconcile of an object at a time.
        if meta.get("deletionTimestamp"):
            return  # the delete handlers own it now
        objects = memo.ports.objects if memo.ports else None
        if objects is None:  # no API client of our own (unit tests): kopf writes the status
            with _locks.of(meta["uid"]):
                outcome = reconcile(kind, reconciler, meta, spec, status, memo.ports, retry)
            apply_outcome(outcome, status, patch, body)
            return
        with _locks.of(meta["uid"]):
            # kopf hands a handler the body it had when it queued it; a reconcile that held
            # the lock meanwhile may have written status since. Start from the latest, and
            # write the result before letting go, so the next reconcile starts from it.
            latest = _read(objects, kind, meta)
            if latest is None or latest["metadata"].get("deletionTimestamp"):
                # Gone, or being deleted while this waited: a reconcile now would
                # start again what the delete handler just stopped.
                return
            meta, status = latest["metadata"], latest.get("status")
            outcome = reconcile(kind, reconciler, meta, latest.get("spec", {}), status, memo.ports, retry)
            _write_status(objects, kind, meta, status_changes(status, outcome.status.to_wire()))
        post_outcome(outcome, body)

    handler.__name__ = f"reconcile_{kind.singular}"
    kopf.on.create(*resource, id="reconcile", registry=registry)(handler)
    # Any change but status: the spec, and the annotations webhooks write.
    kopf.on.update(*resource, id="reconcile", registry=registry)(handler)
    kopf.on.resume(*resource, id="reconcile", registry=registry)(handler)
    kopf.timer(*resource, id="resync", interval=config.resync_seconds, initial_delay=config.resync_seconds,
               when=timer_when, registry=registry)(handler)
