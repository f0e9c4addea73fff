"""kopf handlers: one thin handler per kind, and one per kind's deletion.

Each reconcile handler converges its object (kubeloop.operator.converging:
parse, reconcile, write the status), posts the events and turns "try again
later" into a kopf.TemporaryError. The same handler serves create, update,
resume and the periodic timer, so the operator converges from whatever
state it finds. Delete handlers call the reconcilers' deletion path.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Any, Callable

import kopf

from kubeloop.api.constants import FINALIZER, GROUP, VERSION
from kubeloop.api.refs import ObjectRef
from kubeloop.api.resources import INFERENCE_SERVICE, OPTIMIZED_MODEL, TRAINING_JOB, Kind
from kubeloop.operator.converging import ObjectLocks, Reconciler, converge
from kubeloop.operator.pacing import ResyncPace, ResyncThread
from kubeloop.operator.reconcilers import deletion
from kubeloop.operator.reconcilers.common import Outcome
from kubeloop.operator.reconcilers.optimization import reconcile_optimized_model
from kubeloop.operator.reconcilers.serving import reconcile_inference_service
from kubeloop.operator.reconcilers.training import reconcile_training_job
from kubeloop.operator.settings import OperatorConfig

log = logging.getLogger("kubeloop.operator")


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


def _steady_service(status: dict) -> bool:
    """Ready, serving one version, no rollout or retrain under way: no timer
    of its own, resynced at the pace kubeloop.operator.pacing keeps."""
    rollout = (status.get("rollout") or {}).get("phase")
    retraining = (status.get("retraining") or {}).get("state")
    return (status.get("phase") == "Ready" and not status.get("canaryVersion")
            and rollout not in ("Progressing", "Paused")
            and retraining not in ("Training", "Optimizing", "Gating", "Canary"))


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
        from kubeloop.operator.wiring import build_ports, serve_webhooks

        if getattr(memo, "ports", None) is None:
            memo.ports = build_ports(config)
        if config.webhook_port and getattr(memo, "webhooks", None) is None:
            memo.webhooks, memo.mlflow_webhook = await serve_webhooks(config, memo.ports)
        if getattr(memo, "resyncs", None) is None:
            services = handlers[INFERENCE_SERVICE.kind]
            # Started by the first reconcile, whose context holds kopf's event queue.
            memo.resyncs = ResyncThread(pace, lambda meta: _resync(services, INFERENCE_SERVICE, meta, memo))
            memo.ports.watch_serving_pods(pace.poke)

    @kopf.on.cleanup(registry=registry)
    async def stop_webhooks(memo: kopf.Memo, **_: Any) -> None:
        if getattr(memo, "resyncs", None) is not None:
            memo.resyncs.stop()
        if getattr(memo, "ports", None) is not None:
            memo.ports.features.stop()
        if getattr(memo, "mlflow_webhook", None) is not None:
            memo.mlflow_webhook.cancel()
        if getattr(memo, "webhooks", None) is not None:
            await memo.webhooks.cleanup()

    locks = ObjectLocks()
    """One reconcile or delete of an object at a time: kopf runs timers beside change handlers."""
    pace = ResyncPace(config.resync_seconds, config.resync_per_second)
    handlers = {kind.kind: _register(registry, config, locks, kind, reconciler, timer_when, (pace, steady))
                for kind, reconciler, timer_when, steady in (
                    (TRAINING_JOB, reconcile_training_job, _unfinished, None),
                    (OPTIMIZED_MODEL, reconcile_optimized_model, _unfinished, None),
                    (INFERENCE_SERVICE, reconcile_inference_service, _unsteady_service, _steady_service))}

    @kopf.on.delete(GROUP, VERSION, TRAINING_JOB.plural, id="cancel-run", registry=registry)
    @kopf.on.delete(GROUP, VERSION, OPTIMIZED_MODEL.plural, id="cancel-run", registry=registry)
    def cancel_run(meta: dict, status: dict, spec: dict, memo: kopf.Memo, **_: Any) -> None:
        with locks.last(meta["uid"]):
            deletion.cancel_run(spec, status, memo.ports)

    @kopf.on.delete(GROUP, VERSION, INFERENCE_SERVICE.plural, id="stop-serving", registry=registry)
    def stop_serving(meta: dict, spec: dict, memo: kopf.Memo, **_: Any) -> None:
        with locks.last(meta["uid"]):
            deletion.stop_serving(ObjectRef.from_meta(INFERENCE_SERVICE.kind, meta), spec, memo.ports)
        pace.forget(meta["uid"])

    return registry


def _unsteady_service(status: dict, **_: Any) -> bool:
    """Where an InferenceService keeps kopf's timer: while it is not steady."""
    return not _steady_service(status or {})


def _timer_has_work(pace: ResyncPace, meta: dict, status: dict | None) -> bool:
    """Whether kopf's timer reconciles the object now: not before its change
    handler has reconciled its generation (kopf runs and retries that), nor
    while the resync thread looks at it (steady, or waiting on its backend).
    A timer run queued on a thread holds up kopf's stopping of the timer when
    the object turns steady, and kopf then patches a dummy annotation onto
    the object every cancellation_polling seconds until the run is done:
    51 PATCHes a service at 5,000 services."""
    reconciled = (status or {}).get("observedGeneration") == meta.get("generation")
    return reconciled and not pace.tracks(meta["uid"])


def _resync(handler: Callable[..., None], kind: Kind, meta: dict, memo: kopf.Memo) -> None:
    """A steady or waiting object's resync, as its timer would have run it;
    a retry it asks for is its next resync, or a change's reconcile before that."""
    body = {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": meta}
    try:
        handler(meta, body, memo)
    except kopf.TemporaryError as exc:
        log.info("resync of %s %s/%s: %s", kind.kind, meta["namespace"], meta["name"], exc)


def _register(registry: kopf.OperatorRegistry, config: OperatorConfig, locks: ObjectLocks, kind: Kind,
              reconciler: Reconciler, timer_when: Callable[..., bool] | None,
              pacing: tuple[ResyncPace, Callable[[dict], bool] | None]) -> Callable[..., None]:
    """The kind's reconcile handler, registered for every change and for
    kopf's timer where timer_when holds. pacing: the steady objects' pace,
    and what makes one of this kind steady (None: never)."""
    resource = (GROUP, VERSION, kind.plural)
    pace, steady = pacing

    def handler(meta: dict, body: kopf.Body, memo: kopf.Memo, retry: int = 0, **_: Any) -> None:
        if meta.get("deletionTimestamp"):
            return  # the delete handlers own it now
        outcome = converge(kind, reconciler, meta, memo.ports, locks, retry)
        if outcome is None:
            return
        if steady is not None:
            pace.reconciled(meta, steady(outcome.status.to_wire()), waiting=bool(outcome.waiting))
            memo.resyncs.start(contextvars.copy_context())
        post_outcome(outcome, body)

    async def resync(meta: dict, body: kopf.Body, memo: kopf.Memo, status: dict, retry: int = 0,
                     **_: Any) -> None:
        if not _timer_has_work(pace, meta, status):
            return
        # A reconcile runs on the event loop's own threads: timers never
        # queue ahead of a change on the threads kopf runs change handlers on.
        await asyncio.to_thread(handler, meta, body, memo, retry)

    handler.__name__ = f"reconcile_{kind.singular}"
    kopf.on.create(*resource, id="reconcile", registry=registry)(handler)
    # Any change but status: the spec, and the annotations webhooks write.
    kopf.on.update(*resource, id="reconcile", registry=registry)(handler)
    kopf.on.resume(*resource, id="reconcile", registry=registry)(handler)
    resync.__name__ = f"resync_{kind.singular}"
    kopf.timer(*resource, id="resync", interval=config.resync_seconds, initial_delay=config.resync_seconds,
               when=timer_when, registry=registry)(resync)
    return handler
