"""The local serving router: the endpoint clients call in front of
tritonserver (KServe v2 protocol).

- Canary split by consistent hashing of a request key (the X-Request-Key
  header, else the request's "id"), so one caller always reaches the same
  version; requests without a key are spread at random.
- A caller naming a version (Triton's /versions/{v} routes) reaches it past
  the split when it is the primary or the canary, counted, logged and
  mirrored under its role as a routed request is.
- Shadow mirroring: a share of requests is also sent to the shadow version;
  its answer is logged and compared with the primary's, never returned.
- Paired comparison during a rollout (the config's "compare"): a keyed share
  of the requests the canary answers is also sent to the primary (role
  "paired"); its answer is compared with the canary's and logged under the
  same key, never returned, so late labels judge champion and challenger on
  the same requests.
- Request logging for drift monitoring and outcome joins (the format and
  its two stores, a folder or an s3:// prefix, are kubeloop.requestlog's):
  sampled by the request key's hash (kubeloop.requestlog.sampled), so a key
  has all its rows (every role's) logged or none, and the share logged is
  known; a request without a key is logged under the random key it was
  given. Each record holds the input rows under "features" and the answers
  under "outputs", one entry per row (a float, or the list of class
  probabilities). Bounded: a queue of LOG_QUEUE rows between flushes (what
  does not fit is dropped and counted); writes run off the event loop; a
  failed write (disk full, object store down) is counted and retried, never
  fatal.
- Mirrors (shadow and paired) are bounded too: at most MAX_MIRRORS in
  flight together, the rest skipped and counted.
- Entity requests: a request whose inputs are the entity keys and
  request-time columns of the version's signature (instead of the tensor
  "features") gets its vector from the version's Feast online store
  (kubeloop.front.features); missing or stale values follow the
  service's policy and are counted by view. Such rows are logged with the
  columns the caller sent ("request") beside the assembled vector.
- Prometheus metrics on /metrics: request latency, requests per version and
  outcome, the predictions (per task, see Metrics), shadow and canary
  comparisons and disagreements, the request log's sample rate, and what
  the request log and the mirrors dropped.
- Encodings as Triton speaks them: a request's tensors in JSON or in the
  binary tensor data extension, an answer's outputs binary where the caller
  asks (binary_data_output, an output's binary_data). A binary request is
  decoded on arrival, so all of the above reads the same tensors whatever
  the encoding; Triton is sent JSON (kubeloop.front.encoding says why).
  A compressed body (Content-Encoding) is decoded, and an answer
  compressed as Accept-Encoding asks, by the server at the edge
  (kubeloop.front.compression): the router reads plain bytes, and its
  calls to Triton stay uncompressed.

Answers are read as the served version's signature says (the config's task,
output, classes and threshold; see kubeloop.api.signature).

HTTP on both sides is kubeloop.front.httpserver and .upstream (asyncio
protocols over httptools, on uvloop): what a request costs the front
decides how much of Triton's throughput callers keep. The metrics, the
request log's row and the mirrors are taken care of after the answer is
written.

Its routes live in a JSON file that the serving backend rewrites as aliases
move (the local backend's file, or a ConfigMap mounted into the router's Pod
on a cluster); the router picks up changes within half a second of seeing
them. Locally one tritonserver serves every version; on a cluster each
version is a Triton Deployment of its own, named in `version_urls`. A
pooled service's router runs inside a pool's front
(kubeloop.front.poolfront) and reaches its model through the pool
(kubeloop.front.pool), which loads it on a member first where none holds it.

    python -m kubeloop.front.router --config router.json --port 8080 [--host 0.0.0.0]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import random
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from dataclasses import dataclass, field
from functools import lru_cache, partial
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable, NamedTuple

import orjson
import uvloop
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase

from kubeloop.api.constants import MAX_REQUEST_ROWS
from kubeloop.front import grpcserver
from kubeloop.front.batching import HEADER_LENGTH, Rows, join, joinable, split
from kubeloop.front.coalescing import Coalescer
from kubeloop.front.encoding import REQUEST_HEADER, BinaryOutputs, decode_request, encode_answer, not_json, plain_request
from kubeloop.front.features import (VECTOR_DATATYPE, VECTOR_INPUT, Assembled, FeatureSpec, OnlineStore, RequestError,
                                     assemble_joined, flat_values, is_entity_request, parse_rows, tensor_request)
from kubeloop.front.httpserver import Request, Response, Server, header_lines, json_response
from kubeloop.front.pool import UNSERVED, Pool
from kubeloop.front.upstream import Upstreams, UpstreamError
from kubeloop.requestlog import LogLimits, LogStoreError, ObjectStore, RequestLog, line, open_store, sampled
from kubeloop.requestlog import position as bucket

log = logging.getLogger("kubeloop.router")
MAX_MIRRORS = 64
"""Mirrored requests (shadow and paired) in flight at once."""
SWITCH_SECONDS = 0.0005
"""How long the request log's writer may hold the GIL before the event loop
gets it back: with Python's default, 5 ms, each flush stalled the requests
in flight for that long."""
TRITON_CALLS = 1
"""Calls to one version under way at once. One joins the most requests per
call: on the front benchmark (two cores shared with Triton, concurrency 16)
two calls in flight carried 4.6 requests each and one 6.3, which cut
Triton's CPU per request by a fifth and the router's by a tenth; one call
answered 4,780 requests/s against two's 4,372 in the same run."""
NO_COMPRESSION = b"Accept-Encoding: identity\r\n"
"""Triton compresses an answer when asked; across loopback or a Pod
network that costs both sides CPU and saves nothing."""
GRPC_GRACE = 5.0
"""Seconds gRPC calls under way get to finish when the front stops."""
JSON_BODY = b"Content-Type: application/json\r\n" + NO_COMPRESSION


@dataclass(frozen=True)
class Route:
    role: str
    version: str
    percent: float


@dataclass(frozen=True)
class RouterConfig:
    service: str
    model: str
    triton_model: str
    triton_url: str
    routes: tuple[Route, ...]
    shadow: Route | None = None
    threshold: float = 0.5
    request_log: str | None = None
    """Where logged requests go: a folder or an s3:// prefix."""
    sample_rate: float = 1.0
    task: str = "binary"
    output: str = "probability"
    """The output tensor to read (the signature's output name)."""
    classes: tuple[str, ...] = ()
    """Multiclass: the class labels, in output order."""
    tolerance: float = 0.05
    """Regression: the relative difference above which a shadow disagrees."""
    log_limits: LogLimits = LogLimits()
    features: dict[str, FeatureSpec] = field(default_factory=dict)
    """Version -> what its entity requests read from the online store."""
    missing: str = "default"
    """Entity requests: the policy for missing or stale online values."""
    version_urls: dict[str, str] = field(default_factory=dict)
    """Version -> the Triton serving it, where versions are served apart
    (one predictor each on a cluster); others are on triton_url."""
    compare_percent: float = 0.0
    """The keyed share (0-100) of the canary's requests also sent to the
    primary to compare ("compare": {"percent": P}); 0 compares none."""

    @classmethod
    def load(cls, path: Path) -> "RouterConfig":
        data = json.loads(path.read_text())
        shadow = data.get("shadow")
        return cls(service=data["service"], model=data["model"], triton_model=data["triton_model"],
                   triton_url=data["triton_url"], routes=tuple(Route(**r) for r in data["routes"]),
                   shadow=Route(**shadow) if shadow else None, threshold=data.get("threshold", 0.5),
                   request_log=data.get("request_log"), sample_rate=data.get("sample_rate", 1.0),
                   task=data.get("task", "binary"), output=data.get("output", "probability"),
                   classes=tuple(data.get("classes", ())), tolerance=data.get("tolerance", 0.05),
                   log_limits=LogLimits(**data.get("log_limits", {})),
                   features={v: FeatureSpec.from_dict(f) for v, f in data.get("features", {}).items()},
                   missing=data.get("missing", "default"), version_urls=data.get("version_urls", {}),
                   compare_percent=(data.get("compare") or {}).get("percent", 0.0))

    def server_url(self, version: str) -> str:
        """The base URL of the Triton serving a version."""
        return self.version_urls.get(version, self.triton_url)

    def version_url(self, version: str) -> str:
        """The Triton model URL of a version."""
        return f"{self.server_url(version)}{self.version_path(version)}"

    def version_path(self, version: str) -> str:
        return f"/v2/models/{self.triton_model}/versions/{version}"

    def primary(self) -> Route:
        return next(r for r in self.routes if r.role == "primary")

    def every_route(self) -> tuple[Route, ...]:
        """The routes and the shadow's."""
        return (*self.routes, *([self.shadow] if self.shadow else []))

    def held(self) -> tuple[str, frozenset[str], str]:
        """What a pooled model's repository holds for these routes (as
        kubeloop.serving.repository.put_pooled writes it): the registered
        model, the versions they serve, and the primary, whose config the
        model takes. Routes that change only shares, sampling or the log
        leave it as it is."""
        return self.model, frozenset(r.version for r in self.every_route()), self.primary().version

    def served(self, version: str) -> Route | None:
        """The route of a version callers may name (the primary or the canary); None for any other."""
        return next((r for r in self.routes if r.version == version), None)

    def label(self, index: int) -> str:
        """Multiclass: the class label of an output position."""
        return self.classes[index] if index < len(self.classes) else str(index)


def pick(routes: tuple[Route, ...], key: str) -> Route:
    """The route whose share of [0, 100) holds the key's bucket (pure)."""
    return route_at(routes, bucket(key))


MODEL_ACTIONS = ("", "ready", "infer", "config", "stats")
"""What follows a model (or one of its versions) in its routes: its metadata, readiness and so on."""


def model_route(rest: list[str]) -> tuple[str | None, str] | None:
    """The version named (None: none) and the action of a model route, from
    the path's parts after the model's name, laid out as Triton's:
    [versions/{version}/][ready|infer|config|stats]; None when the parts
    are no model route (pure)."""
    version = None
    if rest[:1] == ["versions"] and len(rest) > 1:
        version, rest = rest[1], rest[2:]
    if len(rest) > 1 or (rest and rest[0] not in MODEL_ACTIONS):
        return None
    return version, rest[0] if rest else ""


def route_at(routes: tuple[Route, ...], position: float) -> Route:
    """The route whose share of [0, 100) holds the position (pure)."""
    edge = 0.0
    for route in routes:
        edge += route.percent
        if position < edge:
            return route
    return routes[0]


OTHER = "_other"
"""The service, model and version of histograms aggregated beyond Metrics.detailed_limit."""


# Regression values have no known scale or sign: buckets at 1 and 3 per
# decade, both signs, from 0.01 to 100,000. With negative buckets Prometheus
# exposes no _sum (OpenMetrics): quantiles come from the buckets.
VALUE_BUCKETS = tuple(sorted({sign * m * 10.0 ** e for sign in (-1, 1) for m in (1, 3) for e in range(-2, 6)} | {0.0}))


@dataclass
class Metrics:
    """Request metrics, and the predictions by task: binary scores in
    kubeloop_prediction_score, multiclass decisions in
    kubeloop_predicted_class_total{class}, regression values in
    kubeloop_prediction_value."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    detailed_limit: int | None = None
    """Services (of a pool's front) whose histograms (latency, predictions,
    feature retrieval, joined calls) are their own; those beyond it share
    series labelled OTHER, except services in a rollout (a canary or a
    shadow), which a rollout's analysis reads. Counters stay per service.
    None: no limit."""
    _series: dict = field(default_factory=dict)
    _detailed: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        labels = ["service", "model", "version", "role"]
        self.latency = Histogram("kubeloop_inference_request_duration_seconds",
                                 "Time from receiving a request to answering it, by version and role.",
                                 labels, registry=self.registry,
                                 buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
        self.requests = Counter("kubeloop_inference_requests_total", "Inference requests by version, role and outcome.",
                                [*labels, "code"], registry=self.registry)
        self.scores = Histogram("kubeloop_prediction_score", "Predicted probabilities returned to callers.",
                                ["service", "model", "version"], registry=self.registry,
                                buckets=(0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0))
        self.classes = Counter("kubeloop_predicted_class", "Rows predicted as each class (multiclass: the most "
                               "probable class).", ["service", "model", "version", "class"], registry=self.registry)
        self.values = Histogram("kubeloop_prediction_value", "Predicted values returned to callers (regression).",
                                ["service", "model", "version"], registry=self.registry, buckets=VALUE_BUCKETS)
        self.traffic = Gauge("kubeloop_router_traffic_ratio",
                             "Share of requests each version answers (a shadow's: the share mirrored to it), "
                             "as the router's current routes say.", labels, registry=self.registry)
        pair = ["service", "model", "primary_version", "shadow_version"]
        self.shadow_comparisons = Counter("kubeloop_shadow_comparisons_total",
                                          "Requests answered by both the primary and the shadow.", pair,
                                          registry=self.registry)
        self.shadow_disagreements = Counter("kubeloop_shadow_disagreements_total",
                                            "Compared requests where the shadow's decision differs.", pair,
                                            registry=self.registry)
        self.shadow_skipped = Counter("kubeloop_shadow_skipped_total",
                                      f"Requests not mirrored because {MAX_MIRRORS} mirrors were in flight.",
                                      ["service"], registry=self.registry)
        versions = ["service", "model", "primary", "canary"]
        self.canary_comparisons = Counter("kubeloop_canary_comparisons_total",
                                          "Rows of canary requests answered by the primary too (paired).",
                                          versions, registry=self.registry)
        self.canary_disagreements = Counter("kubeloop_canary_disagreements_total",
                                            "Paired rows where the canary's decision differs from the primary's.",
                                            versions, registry=self.registry)
        self.canary_skipped = Counter("kubeloop_canary_comparisons_skipped_total",
                                      f"Canary requests not paired because {MAX_MIRRORS} mirrors were in flight.",
                                      ["service"], registry=self.registry)
        self.mirroring = {"shadow": (self.shadow_comparisons, self.shadow_disagreements, self.shadow_skipped),
                          "paired": (self.canary_comparisons, self.canary_disagreements, self.canary_skipped)}
        """A mirror's role -> its comparisons, disagreements and skipped counters."""
        self.sample_rate = Gauge("kubeloop_request_log_sample_rate",
                                 "Share of request keys whose rows the request log keeps (0: no request log).",
                                 ["service"], registry=self.registry)
        self.log_dropped = Counter("kubeloop_request_log_dropped_total",
                                   "Request-log rows dropped because the queue was full (the store refused or lagged).",
                                   ["service"], registry=self.registry)
        self.log_errors = Counter("kubeloop_request_log_write_errors_total",
                                  "Request-log flushes that failed (the rows wait for the next one).",
                                  ["service"], registry=self.registry)
        self.features_missing = Counter("kubeloop_online_features_missing_total",
                                        "Entity-request rows whose feature view value the online store lacked "
                                        "(reason missing) or held past the view's ttl (stale), by the policy "
                                        "applied.", ["service", "view", "reason", "policy"], registry=self.registry)
        self.features_refused = Counter("kubeloop_online_features_refused_total",
                                        "Entity requests refused (503) because too many waited for the online "
                                        "store.", ["service"], registry=self.registry)
        self.retrieval = Histogram("kubeloop_online_feature_retrieval_seconds",
                                   "Time to read an entity request's features from the online store and "
                                   "assemble its vectors.", ["service"], registry=self.registry,
                                   buckets=(0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5))
        self.triton_calls = Histogram("kubeloop_triton_call_requests",
                                      "Callers' requests each call to Triton carried (requests that arrived while "
                                      "the previous call was under way are joined).", ["service"],
                                      registry=self.registry, buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))
        self.triton_refused = Counter("kubeloop_triton_refused_total",
                                      "Requests refused (503) because too many waited for Triton.", ["service"],
                                      registry=self.registry)
        self.histograms = (self.latency, self.scores, self.classes, self.values, self.retrieval, self.triton_calls)
        """What a service beyond detailed_limit shares under OTHER."""
        self.log_removed = Counter("kubeloop_request_log_files_removed_total",
                                   "Request-log files removed by retention or the size limit.", ["service"],
                                   registry=self.registry)

    def series(self, metric, *labels: str):  # noqa: ANN001, ANN201 - a prometheus metric and its child
        """metric.labels(*labels), kept: prometheus_client's lookup cost a
        request more than the observation itself. Bounded by the versions
        served (forget() on each change of routes)."""
        found = self._series.get((metric, labels))
        if found is None:
            found = self._series[(metric, labels)] = metric.labels(*labels)
        return found

    def forget(self) -> None:
        self._series.clear()

    def detailed(self, service: str, rollout: bool) -> bool:
        """Whether the service's histograms are its own (see detailed_limit);
        the first services to ask take the places, until they leave (drop)."""
        if self.detailed_limit is None or rollout or service in self._detailed:
            return True
        if len(self._detailed) < self.detailed_limit:
            self._detailed.add(service)
            return True
        return False

    def drop(self, service: str, metrics: tuple | None = None) -> None:
        """Remove a service's series (of `metrics`; all where None: it left
        the pool's front that shares these metrics)."""
        for metric in metrics or vars(self).values():
            if isinstance(metric, MetricWrapperBase) and "service" in metric._labelnames:
                at = metric._labelnames.index("service")
                for labels in [k for k in metric._metrics if k[at] == service]:
                    metric.remove(*labels)
        if metrics is None:
            self._detailed.discard(service)
        self.forget()


class Router:
    """One service's routes. metrics and pool: shared with the other
    services of a pool's front (each series carries its service)."""

    def __init__(self, config_path: Path, metrics: Metrics | None = None, pool: Pool | None = None):
        self.config_path = config_path
        self.config = RouterConfig.load(config_path)
        self.mtime = config_path.stat().st_mtime
        self.unreadable: float | None = None
        """When the routes file last found unreadable was written."""
        self.metrics = metrics or Metrics()
        self.pool = pool
        self._traffic: list[tuple[str, ...]] = []
        """The traffic series this router set (a shared gauge holds others')."""
        self._own = True
        """Whether this service's histograms are its own (Metrics.detailed)."""
        self._show_routes()
        self.log = RequestLog(self.config.log_limits.queue_rows)
        self._store, self._store_for = None, None
        self.writing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="request-log")
        """Request-log writes block (a file, an object store's PUT): off the event loop, one at a time."""
        self.upstream: Upstreams | None = None
        self.background: set[asyncio.Task] = set()
        self.mirrors: set[asyncio.Task] = set()
        self._expired_at = 0.0
        self.online: dict[FeatureSpec, asyncio.Task] = {}
        """Feature stores being opened or open, by spec (opening imports Feast: seconds)."""
        self.retrieving = ThreadPoolExecutor(max_workers=1, thread_name_prefix="online-features")
        """Feast's reads block: they run off the event loop (raw tensors keep
        flowing meanwhile), one at a time (one sqlite connection per store)."""
        self.coalescers: dict[FeatureSpec, Coalescer] = {}
        """Per store: entity requests waiting for a read are read together."""
        self.upstreams: dict[str, Coalescer] = {}
        """Per version: requests waiting for Triton are sent together."""

    # -- plumbing ------------------------------------------------------------

    async def start(self, upstream: Upstreams | None = None, watch: bool = True) -> None:
        """upstream: one shared with other routers (then theirs to close);
        watch: whether this router reloads its routes itself (a pool's
        front takes up all of its routers' routes itself)."""
        self._owns_upstream = upstream is None
        self.upstream = upstream or Upstreams()
        store = self._log_store()
        if isinstance(store, ObjectStore):
            # Building its client imports boto3 (about a second of CPU; no
            # network): before the first request rather than in the first
            # flush, beside requests.
            await asyncio.get_running_loop().run_in_executor(self.writing, lambda: store.client)
        if watch:
            self._spawn(self._watch())
        self._spawn(self._flush_loop())
        self._open_stores()

    def _open_stores(self) -> None:
        """Start opening the versions' feature stores in a thread, before
        requests need them: Feast takes seconds to import, and the event loop
        keeps serving meanwhile."""
        for spec in set(self.config.features.values()):
            self._opening(spec)

    def _opening(self, spec: FeatureSpec) -> asyncio.Task:
        """The task opening the spec's store; one that failed is tried again."""
        task = self.online.get(spec)
        if task is None or (task.done() and task.exception() is not None):
            task = self.online[spec] = asyncio.create_task(asyncio.to_thread(OnlineStore, spec))
        return task

    async def online_store(self, spec: FeatureSpec) -> OnlineStore:
        try:
            return await asyncio.shield(self._opening(spec))
        except Exception as exc:  # Feast's errors have no common base; the next request tries again
            log.warning("cannot open the feature store of %s: %s", ", ".join(spec.views), exc)
            raise RequestError(503, f"the feature store of {', '.join(spec.views)} cannot be opened: {exc}") from exc

    def stores_open(self) -> bool:
        """Whether every version's feature store is open (ready for entity requests)."""
        return all(spec in self.online and self.online[spec].done() and self.online[spec].exception() is None
                   for spec in self.config.features.values())

    async def stop(self) -> None:
        for task in self.background:
            task.cancel()
        await self.flush_log(self._log_store())
        self.writing.shutdown(wait=True)
        self.retrieving.shutdown(wait=False, cancel_futures=True)
        if self._owns_upstream:
            self.upstream.close()

    def _spawn(self, coro, tasks: set[asyncio.Task] | None = None) -> None:  # noqa: ANN001
        tasks = self.background if tasks is None else tasks
        task = asyncio.create_task(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            try:
                self.take_up_routes()
            except Exception:  # one bad round must not end route reloads for good
                log.exception("the router's housekeeping failed; trying again")

    async def _flush_loop(self) -> None:
        while True:
            store = self._log_store()
            await asyncio.sleep(store.flush_seconds if store else 0.5)
            try:
                await self.flush_log(store)
            except Exception:  # one bad flush must not end flushing for good
                log.exception("the request log's flush failed; trying again")

    def _log_store(self):  # noqa: ANN202 - a kubeloop.requestlog store, or None
        """The store of the configured request log, opened again only when
        the routes name another one (an object store's client is costly)."""
        wanted = (self.config.request_log, self.config.log_limits)
        if self._store_for != wanted:
            self._store_for = wanted
            self._store = open_store(*wanted) if wanted[0] else None
        return self._store

    async def flush_log(self, store) -> None:  # noqa: ANN001 - a kubeloop.requestlog store, or None
        """Write what is queued, count what was dropped, expire old files (each minute)."""
        c = self.config
        rows = self.log.take()
        if rows and store:
            loop = asyncio.get_running_loop()
            try:
                await loop.run_in_executor(self.writing, store.write, rows, time.time())
            except LogStoreError as exc:
                self.log.put_back(rows)
                self.metrics.log_errors.labels(c.service).inc()
                log.warning("cannot write the request log (%d rows wait): %s", len(self.log.rows), exc)
        if self.log.dropped:
            self.metrics.log_dropped.labels(c.service).inc(self.log.dropped)
            self.log.dropped = 0
        if store and time.monotonic() - self._expired_at > 60:
            self._expired_at = time.monotonic()
            try:
                removed = await asyncio.get_running_loop().run_in_executor(self.writing, store.expire, time.time())
            except OSError as exc:
                log.warning("cannot expire request logs: %s", exc)
                return
            if removed:
                self.metrics.log_removed.labels(c.service).inc(removed)

    def take_up_routes(self) -> bool:
        """Reload the routes file if it changed, and open the feature stores
        it names (True when it changed); a broken one keeps the routes in use."""
        found = self.read_routes()
        if found is not None:
            self.take_up(found)
        return found is not None

    def take_up(self, found: tuple[RouterConfig, float]) -> None:
        """Routes read before (read_routes), and the feature stores they name."""
        self.config, self.mtime = found
        self.log.capacity = self.config.log_limits.queue_rows
        served = {r.version for r in self.config.every_route()}
        self.upstreams = {v: u for v, u in self.upstreams.items() if v in served}
        self._show_routes()
        log.info("routes: %s", self.config.routes)
        self._open_stores()

    def written(self) -> float | None:
        """When the routes file was last written (None: it cannot be read)."""
        try:
            return self.config_path.stat().st_mtime
        except OSError:
            return None

    def routes_changed(self) -> bool:
        """Whether the routes file was written since its routes were taken
        up (and is not the one found unreadable)."""
        return self.written() not in (None, self.mtime, self.unreadable)

    def read_routes(self) -> tuple[RouterConfig, float] | None:
        """The routes file's routes and when it was written, where it changed
        since the routes in use (None: unchanged, or unreadable)."""
        mtime = self.written()
        if mtime in (None, self.mtime):
            return None
        try:
            return RouterConfig.load(self.config_path), mtime
        except (OSError, ValueError, KeyError) as exc:
            self.unreadable = mtime
            log.warning("keeping the previous routes: %s", exc)
            return None

    def _show_routes(self) -> None:
        c = self.config
        self.metrics.forget()
        for labels in self._traffic:
            self.metrics.traffic.remove(*labels)
        self._traffic = [(c.service, c.model, route.version, route.role) for route in c.every_route()]
        for labels, route in zip(self._traffic, c.every_route(), strict=True):
            self.metrics.traffic.labels(*labels).set(route.percent / 100)
        own = self.metrics.detailed(c.service, rollout=len(c.routes) > 1 or c.shadow is not None)
        if self._own and not own:  # a rollout ended beyond the limit: its series stop
            self.metrics.drop(c.service, self.metrics.histograms)
        self._own = own
        self.metrics.sample_rate.labels(c.service).set(c.sample_rate if c.request_log else 0.0)

    def _observe(self, version: str, outputs: list) -> None:
        """The predictions' metric, by task (per row: a float, or class probabilities)."""
        c, labels = self.config, self._detail(version)
        for row in outputs:
            if c.task == "multiclass":
                self.metrics.series(self.metrics.classes, *labels, c.label(_argmax(row))).inc()
            elif c.task == "regression":
                self.metrics.series(self.metrics.values, *labels).observe(row)
            else:
                self.metrics.series(self.metrics.scores, *labels).observe(row)

    def _detail(self, version: str = "", *more: str) -> tuple[str, ...]:
        """A histogram's service, model and version labels (then `more`):
        this service's own, or OTHER's where the metrics' limit left it none."""
        c = self.config
        return (c.service, c.model, version, *more) if self._own else (OTHER, OTHER, OTHER, *more)

    def _server(self, version: str | None, requests: int = 1) -> AbstractAsyncContextManager[str]:
        """The base URL of a Triton serving the version while the block
        runs: the configured one, or the pool's member holding the model
        (loaded there first where none does; requests: the callers' the
        call carries). None: any server, for what all answer alike (the
        server's metadata)."""
        if self.pool is None:
            return nullcontext(self.config.server_url(version or self.config.primary().version))
        if version is None:
            return nullcontext(self.pool.any_url())
        return self.pool.serving(self.config.triton_model, requests)

    # -- handlers ------------------------------------------------------------

    async def handle(self, request: Request) -> Response:
        """The KServe v2 routes the front serves (the server's, the model's
        and each served version's), /metrics and the health checks. Without
        a version, infer is split and the model's other routes are its
        primary's."""
        c = self.config
        parts = request.path.strip("/").split("/")
        if request.path == "/metrics":
            return self._get(request) or self.metrics_endpoint()
        if parts == ["v2"]:
            return self._get(request) or await self.forward(None, "/v2")
        if parts[:2] == ["v2", "health"] and len(parts) == 3 and parts[2] in ("ready", "live"):
            return self._get(request) or (await self.ready(c.primary()) if parts[2] == "ready" else Response(200))
        found = model_route(parts[3:]) if parts[:2] == ["v2", "models"] and len(parts) > 2 else None
        if found is None:
            return json_response({"error": f"no route {request.path}"}, 404)
        model, (version, action) = parts[2], found
        if model not in (c.model, c.triton_model):
            return json_response({"error": f"unknown model {model}"}, 404)
        route = c.primary() if version is None else c.served(version)
        if route is None:
            serving = ", ".join(f"{r.version} ({r.role})" for r in c.routes)
            return json_response({"error": f"model {model} has no version {version} here; it serves {serving}"},
                                 404)
        if action == "infer":
            if request.method != "POST":
                return json_response({"error": "infer takes POST"}, 405)
            return await self.infer(request, None if version is None else route)
        return self._get(request) or await self.model_get(route, action)

    @staticmethod
    def _get(request: Request) -> Response | None:
        """405 unless the request is a GET, or its HEAD (kubeloop.front.httpserver leaves out the body)."""
        return None if request.method in ("GET", "HEAD") else json_response({"error": "this route takes GET"}, 405)

    async def model_get(self, route: Route, action: str) -> Response:
        """A version's readiness, or Triton's answer to its metadata (action
        ""), config or stats route."""
        if action == "ready":
            return await self.ready(route)
        return await self.forward(route.version, self.config.version_path(route.version)
                                  + (f"/{action}" if action else ""))

    async def infer(self, request: Request, named: Route | None = None) -> Response:
        """Answer an inference request by the version the split picks, or
        the one the caller named."""
        c = self.config
        started = time.perf_counter()
        body, binary = request.body, None
        header_length = request.headers.get(REQUEST_HEADER)
        try:
            payload = orjson.loads(body) if header_length is None else decode_request(body, header_length)
            if not isinstance(payload, dict):
                raise RequestError(400, "the body must be a JSON object (KServe v2 inference request), "
                                        f"not a {type(payload).__name__}")
            # Only a request that chose an encoding pays for reading its choices; others go to Triton as they came.
            if header_length is not None or "outputs" in payload or "parameters" in payload:
                payload, binary = plain_request(payload)
                body = orjson.dumps(payload)
        except orjson.JSONDecodeError:
            return json_response({"error": not_json(body)}, 400)
        except RequestError as exc:
            return json_response({"error": str(exc)}, exc.status)
        key = request.headers.get(b"x-request-key", b"").decode("latin-1") or payload.get("id")
        if key:
            route = named or self._loadable(pick(c.routes, key))
        else:  # nothing to keep together: a random draw, without hashing a random key
            key = f"{random.getrandbits(64):016x}"
            route = named or self._loadable(route_at(c.routes, random.random() * 100))
        try:
            sent = await self.model_request(route.version, payload, body)
            status, answer = await self.call_triton(route.version, sent)
            if status != 200 and named is None and (primary := await self._instead(route)) is not route:
                route = primary
                sent = await self.model_request(route.version, payload, body)
                status, answer = await self.call_triton(route.version, sent)
        except RequestError as exc:
            self.metrics.series(self.metrics.requests, c.service, c.model, route.version, route.role,
                                str(exc.status)).inc()
            return json_response({"error": str(exc)}, exc.status)
        response = Response(status, answer, headers=_answer_headers(route.version, route.role))
        if binary is not None and status == 200:
            response = _binary_answer(response, binary)
            status = response.status
        response.after = partial(self._account, route, key, payload, sent.body, (sent.columns, sent.vectors), status,
                                 answer, time.perf_counter() - started)
        return response

    def _loadable(self, route: Route) -> Route:
        """The route a split request takes: a pooled version its pool could
        not load (a canary's broken files, rolled back at the operator's
        next look) leaves its share to the primary, as a dedicated service's
        split never names a version that is not ready."""
        if self.pool is None or route.role == "primary" or not self.pool.unready(self.config.triton_model,
                                                                                 route.version):
            return route
        return self.config.primary()

    async def _instead(self, route: Route) -> Route:
        """Where a split request its version failed goes instead, once the
        model's reload under way (if any) is over: the primary, where the
        version is pooled and could not load (found by this request's own
        load, or by that reload), or where the routes taken up after the
        reload send nothing to the version any more (Triton unloads a
        version as the reload ends, a moment before the routes move)."""
        if self.pool is None:
            return route
        await self.pool.settled(self.config.triton_model)
        if all(r.version != route.version for r in self.config.routes):
            return self.config.primary()
        return route if route.role == "primary" else self._loadable(route)

    def _account(self, route: Route, key: str, payload: dict, body: bytes, sent: tuple[dict | None, list | None],
                 status: int, answer: bytes, elapsed: float) -> None:
        """Once the caller has its answer (at concurrency 1 the router is
        otherwise idle then): the metrics, the request log and the mirrors
        (shadow, paired). sent: the columns of an entity request and its
        vectors."""
        c = self.config
        labels = (c.service, c.model, route.version, route.role)
        self.metrics.series(self.metrics.latency, *self._detail(route.version, route.role)).observe(elapsed)
        self.metrics.series(self.metrics.requests, *labels, str(status)).inc()
        columns, vectors = sent
        outputs = parse_outputs(answer, c) if status == 200 else None
        if outputs:
            self._observe(route.version, outputs)
        # Sampled by the key, so the key's other rows (mirrors) follow; rate 1 needs no hash.
        logged = bool(c.request_log) and (c.sample_rate >= 1 or sampled(key, c.sample_rate))
        if logged and outputs:
            record = {"ts": time.time(), "key": key, "role": route.role, "version": route.version,
                      "features": vectors if vectors is not None else _features(payload), "outputs": outputs}
            if columns is not None:
                record["request"] = columns
            self.log.add(line(record))
        mirrored = (payload, body, key, outputs, logged)
        if c.shadow and bucket(key, "shadow") < c.shadow.percent:
            self._send_mirror("shadow", c.shadow, (c.service, c.model, route.version, c.shadow.version), mirrored)
        if route.role == "canary" and c.compare_percent and bucket(key, "compare") < c.compare_percent:
            primary = c.primary()
            self._send_mirror("paired", primary, (c.service, c.model, primary.version, route.version), mirrored)

    def _send_mirror(self, role: str, to: Route, pair: tuple[str, ...],
                     mirrored: tuple[dict, bytes, str, list | None, bool]) -> None:
        """Mirror a request (_mirror's arguments) unless MAX_MIRRORS are in flight: then skipped and counted."""
        if len(self.mirrors) < MAX_MIRRORS:
            self._spawn(self._mirror(role, to, pair, *mirrored), self.mirrors)
        else:
            self.metrics.series(self.metrics.mirroring[role][2], self.config.service).inc()

    async def model_request(self, version: str, payload: dict, body: bytes, count: bool = True) -> "Sent":
        """The request Triton takes for a version: as sent, or, for an entity
        request to a version with feature views, the vectors assembled from
        the online store. count: whether its missing or stale values count in
        the metrics (a shadow's second reading of the same rows does not)."""
        c = self.config
        spec = c.features.get(version)
        if spec is None or not is_entity_request(payload):
            # A version without feature views takes its tensor only; Triton judges it.
            return Sent(body, payload)
        columns = parse_rows(payload, spec)
        store = await self.online_store(spec)
        started = time.perf_counter()
        try:
            assembled = await self._coalescer(spec, store).submit(columns)
        except RequestError:
            raise
        except Exception as exc:  # Feast's errors have no common base; the caller may retry
            log.warning("online feature retrieval failed: %s", exc)
            raise RequestError(503, f"the online feature store cannot be read: {exc}") from exc
        if count:
            self._count_problems(assembled.problems)
        if isinstance(assembled, RequestError):  # this request's rows alone, refused by the missing policy
            raise assembled
        self.metrics.series(self.metrics.retrieval, self._detail()[0]).observe(time.perf_counter() - started)
        request_id = payload.get("id")
        request = tensor_request(assembled.vectors, request_id=request_id)
        return Sent(orjson.dumps(request), request, columns, assembled.vectors, assembled.joined,
                    _vector_rows(assembled, len(spec.columns), request_id))

    def _coalescer(self, spec: FeatureSpec, store: OnlineStore) -> Coalescer:
        found = self.coalescers.get(spec)
        if found is None:
            service = self.config.service
            loop = asyncio.get_running_loop()
            found = self.coalescers[spec] = Coalescer(
                lambda requests: loop.run_in_executor(self.retrieving, assemble_joined, store, requests,
                                                      self.config.missing),
                rows=lambda columns: len(next(iter(columns.values()))), waiting_for="the online store",
                on_refused=lambda: self.metrics.features_refused.labels(service).inc())
        return found

    async def call_triton(self, version: str, sent: "Sent", mirror: bool = False) -> tuple[int, bytes]:
        """Triton's status and answer for one request to a version; joined
        with others waiting for the version when its rows can be. A mirror
        (shadow, paired) finding the version idle goes past it instead of
        taking its one call: a caller arriving meanwhile must not wait behind
        a copy (at concurrency 1 that raised the front's p99 by a third
        during a rollout). The requests of one joined read follow each other
        in this turn of the event loop, so they wait to share a call even
        when the version is idle: going alone, the first of each read took
        a call of its own (4.1 requests a call against 5.5 for raw vectors
        at 16 callers)."""
        body, followed = sent.body, sent.joined > 1
        upstream = self.upstreams.get(version)
        if upstream is None:
            service = self.config.service
            upstream = self.upstreams[version] = Coalescer(
                lambda items: self._post_joined(version, items), rows=lambda item: item[0].count,
                kind=lambda item: item[0].kind, waiting_for="Triton", max_rows=MAX_REQUEST_ROWS, max_calls=TRITON_CALLS,
                on_refused=lambda: self.metrics.triton_refused.labels(service).inc())
        if self.pool is not None:  # one call at a time to each member holding the model
            upstream.max_calls = max(TRITON_CALLS, self.pool.residency.copies(self.config.triton_model))
        if upstream.idle and mirror:
            return (await self._post_joined(version, [(None, body)]))[0]
        if upstream.idle and not followed:  # it goes alone, as sent: whether it could join others does not matter
            return await upstream.submit((None, body))
        rows = sent.rows or joinable(sent.request)
        if rows is None:  # a call of its own, past the queue: it could not join one
            [answer] = await self._post_joined(version, [(None, body)])
            return answer
        return await upstream.submit((rows, body), alone=not followed)

    async def _post_joined(self, version: str, items: list[tuple[Rows | None, bytes]]) -> list[tuple[int, bytes]]:
        """One call for the waiting requests: a lone one as it was sent."""
        self.metrics.series(self.metrics.triton_calls, self._detail()[0]).observe(len(items))
        if len(items) == 1:
            return [(await self._post(version, items[0][1]))[:2]]
        batch = [rows for rows, _ in items]
        body, headers = join(batch)
        status, answer, header_length = await self._post(version, body, headers, len(items))
        if status != 200:
            return [(status, answer)] * len(items)
        answers = split(answer, header_length, batch)
        if answers is None:
            failed = json.dumps({"error": f"Triton's answer to {len(items)} joined requests does not hold one "
                                          "row per row sent"}).encode()
            return [(502, failed)] * len(items)
        return [(200, own) for own in answers]

    async def _post(self, version: str, body: bytes, headers: dict[str, str] | None = None,
                    requests: int = 1) -> tuple[int, bytes, str | None]:
        """Triton's status, answer and the length of a binary answer's JSON
        header; requests: the callers' the body joins."""
        lines = JSON_BODY if headers is None else header_lines(headers) + NO_COMPRESSION
        try:
            async with self._server(version, requests) as server:
                answer = await self.upstream.call(b"POST", f"{server}{self.config.version_path(version)}/infer",
                                                  body, lines)
        except UpstreamError as exc:
            return 503, orjson.dumps({"error": f"model server unavailable: {exc}"}), None
        except UNSERVED as exc:
            return 503, orjson.dumps({"error": f"the pool cannot serve {self.config.model} now: {exc}"}), None
        return answer.status, answer.body, answer.headers.get(HEADER_LENGTH.lower())

    def _count_problems(self, problems: list) -> None:
        c = self.config
        for problem in problems:
            self.metrics.features_missing.labels(c.service, problem.view, problem.reason, c.missing).inc()

    async def _mirror(self, role: str, to: Route, pair: tuple[str, ...], payload: dict, body: bytes, key: str,
                      answered: list | None, logged: bool) -> None:
        """Send the request to another version under a role of its own (the
        shadow, or the primary paired with a canary's answer); compare its
        answer with the one the caller got (the role's counters, by pair)
        and log it under the same key, never answer. Its requests and
        latency count under that role: the version's callers' error rate
        and latency stay theirs."""
        c = self.config
        labels = (c.service, c.model, to.version, role)
        started = time.perf_counter()
        try:
            sent = await self.model_request(to.version, payload, body, count=False)
            status, answer = await self.call_triton(to.version, sent, mirror=True)
        except RequestError as exc:
            self.metrics.series(self.metrics.requests, *labels, str(exc.status)).inc()
            return
        self.metrics.series(self.metrics.latency, *self._detail(to.version, role)).observe(
            time.perf_counter() - started)
        self.metrics.series(self.metrics.requests, *labels, str(status)).inc()
        outputs = parse_outputs(answer, c) if status == 200 else None
        if outputs and answered and len(outputs) == len(answered):
            comparisons, disagreements, _ = self.metrics.mirroring[role]
            self.metrics.series(comparisons, *pair).inc(len(outputs))
            # Counted even when 0, so the series exists from the first comparison.
            self.metrics.series(disagreements, *pair).inc(sum(disagree(c, a, o)
                                                              for a, o in zip(answered, outputs, strict=True)))
        if logged and outputs:
            self.log.add(line({"ts": time.time(), "key": key, "role": role, "version": to.version,
                               "outputs": outputs}))

    async def ready(self, route: Route) -> Response:
        """Ready when the route's version is, and every version's feature
        store is open. A pooled version is ready unless its last load failed
        (or the model's, naming no version): it is loaded by its first
        request, never by a readiness check. A ready answer names the
        version, as an inference answer does: asked of the model, the
        version its routes answer with now (a backend taking up a new
        primary tells from it whether the old one still answers)."""
        if not self.stores_open():
            return Response(503, b"opening the feature stores", "text/plain")
        if self.pool is not None:
            failure = self.pool.unready(self.config.triton_model, route.version)
            return Response(503, failure.encode(), "text/plain") if failure else self._ready(route)
        try:
            answer = await self.upstream.call(b"GET", f"{self.config.version_url(route.version)}/ready",
                                              headers=NO_COMPRESSION)
        except UpstreamError:
            return Response(503)
        return self._ready(route) if answer.status == 200 else Response(answer.status)

    @staticmethod
    def _ready(route: Route) -> Response:
        return Response(200, headers=_answer_headers(route.version, route.role))

    async def forward(self, version: str | None, path: str) -> Response:
        """Triton's answer to a GET of path on a server of the version (None:
        any), as Triton gave it."""
        try:
            async with self._server(version) as server:
                answer = await self.upstream.call(b"GET", f"{server}{path}", headers=NO_COMPRESSION)
        except UpstreamError as exc:
            return json_response({"error": f"model server unavailable: {exc}"}, 503)
        except UNSERVED as exc:
            return json_response({"error": f"the pool cannot serve {self.config.model} now: {exc}"}, 503)
        return Response(answer.status, answer.body, answer.headers.get("content-type", "application/json"))

    def metrics_endpoint(self) -> Response:
        return Response(200, generate_latest(self.metrics.registry), CONTENT_TYPE_LATEST)


def parse_outputs(answer: bytes, config: RouterConfig) -> list | None:
    """One entry per row of a v2 answer: the class probabilities (a list) for
    multiclass, else a float. The config's output tensor is read (the first
    one if the answer names none like it); None when the answer does not fit."""
    try:
        tensors = orjson.loads(answer)["outputs"]
        tensor = next((t for t in tensors if t.get("name") == config.output), tensors[0])
        data = tensor["data"]
        flat = [float(v) for v in flat_values(data)]
        width = int(tensor["shape"][-1]) if len(tensor.get("shape", ())) > 1 else 1
    except (ValueError, KeyError, IndexError, TypeError, StopIteration):
        return None
    if width < 1 or len(flat) % width:
        return None
    if config.task == "multiclass":
        return [flat[i:i + width] for i in range(0, len(flat), width)]
    return flat if width == 1 else None


def _binary_answer(answer: Response, binary: BinaryOutputs) -> Response:
    """Triton's JSON answer with the outputs the caller wants binary after
    its JSON, headed as Triton heads it."""
    try:
        body, header_length = encode_answer(answer.body, binary)
    except RequestError as exc:
        return Response(exc.status, orjson.dumps({"error": str(exc)}), headers=answer.headers)
    if header_length is None:
        return Response(200, body, headers=answer.headers)
    return Response(200, body, "application/octet-stream",
                    answer.headers + header_lines({HEADER_LENGTH: str(header_length)}))


@lru_cache(maxsize=256)
def _answer_headers(version: str, role: str) -> bytes:
    return header_lines({"X-Model-Version": version, "X-Model-Role": role})


def _argmax(row: list[float]) -> int:
    return max(range(len(row)), key=row.__getitem__)


def disagree(config: RouterConfig, primary, shadow) -> bool:  # noqa: ANN001 - a row's output: float or list
    """Whether the shadow's answer for a row differs from the primary's, by
    task: binary, the decision at the signature's threshold; multiclass, the
    most probable class; regression, a relative difference
    |shadow - primary| / max(|primary|, |shadow|) above the config's
    tolerance (two zeros agree)."""
    if config.task == "multiclass":
        return _argmax(primary) != _argmax(shadow)
    if config.task == "regression":
        scale = max(abs(primary), abs(shadow))
        return scale > 0 and abs(shadow - primary) / scale > config.tolerance
    return (primary >= config.threshold) != (shadow >= config.threshold)


def _features(payload: dict) -> list[list[float]]:
    tensor = payload["inputs"][0]
    width = tensor["shape"][-1]
    flat = flat_values(tensor["data"])
    return [flat[i:i + width] for i in range(0, len(flat), width)]


class Sent(NamedTuple):
    """What the router sends Triton for a caller's request."""

    body: bytes
    request: dict
    """The body, parsed."""
    columns: dict | None = None
    """An entity request's columns as sent (for the request log)."""
    vectors: list | None = None
    """An entity request's vectors assembled from the online store."""
    joined: int = 1
    """The requests its online read carried."""
    rows: Rows | None = None
    """An entity request's vectors as joinable rows."""


def _vector_rows(assembled: Assembled, width: int, request_id: object) -> Rows | None:
    """An entity request's vectors as the rows batching.joinable reads from
    the request tensor_request builds of them, without reading it back."""
    if not width or not assembled.vectors:
        return None
    return Rows(VECTOR_INPUT, VECTOR_DATATYPE, width, [v for row in assembled.vectors for v in row],
                request_id if isinstance(request_id, str) else None)


class Front(NamedTuple):
    url: str
    """Where HTTP callers reach it."""
    router: "Router"
    grpc: str | None
    """host:port where gRPC callers reach it (kubeloop.front.grpcserver), when it serves gRPC."""


@asynccontextmanager
async def running(config_path: Path, host: str = "127.0.0.1", port: int = 0,
                  grpc_port: int | None = None) -> AsyncIterator[Front]:
    """The front serving in this event loop, over HTTP and, given a port
    (0: any free one), gRPC. On the way out it finishes the requests under
    way, then writes what its request log holds."""
    router = Router(config_path)
    await router.start()
    try:
        async with listening(router.handle, host, port, grpc_port) as (url, grpc_address):
            yield Front(url, router, grpc_address)
    finally:
        await router.stop()


@asynccontextmanager
async def listening(handle: Callable[[Request], Awaitable[Response]], host: str, port: int,
                    grpc_port: int | None) -> AsyncIterator[tuple[str, str | None]]:
    """A front's handler served over HTTP and, given a port, gRPC: where
    callers reach each. On the way out the requests under way finish."""
    server, calls = Server(handle), None
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    try:
        bound = await server.start(host, port)
        grpc_address = None
        if grpc_port is not None:
            calls, grpc_bound = await grpcserver.start(handle, host, grpc_port)
            grpc_address = f"{shown}:{grpc_bound}"
        yield f"http://{shown}:{bound}", grpc_address
    finally:
        if calls is not None:
            await calls.stop(GRPC_GRACE)
        await server.close()


async def serve(serving: AbstractAsyncContextManager) -> None:
    """Serve until SIGTERM or SIGINT."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    async with serving:
        # What the imports and the start built lives as long as the process:
        # frozen, a full collection walks only what requests leave behind
        # (with boto3 and Feast's imports it walked 100,000 objects for 35 ms,
        # stalling every request in flight).
        gc.freeze()
        await stopping.wait()


def main(prog: str = "python -m kubeloop.front.router", start: Callable = running) -> None:
    """Run a front from its command line; start: its running() (this router's, or a pool's front's)."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1", help="0.0.0.0 in a Pod (its own network namespace)")
    parser.add_argument("--grpc-port", type=int, help="serve KServe v2 gRPC too, on this port")
    args = parser.parse_args()
    logging.basicConfig(level=os.environ.get("KUBELOOP_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.setswitchinterval(SWITCH_SECONDS)
    uvloop.run(serve(start(args.config, args.host, args.port, args.grpc_port)))


if __name__ == "__main__":
    main()
