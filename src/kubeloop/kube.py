"""The one module that talks to the Kubernetes API.

Everything else builds plain dicts and hands them here. Writes are
server-side apply: one idempotent request that creates the object or brings
the fields kubeloop owns to the desired value, and is a no-op when nothing
changed; that is what makes every reconcile safe to repeat.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Generic, Hashable, Iterable, Iterator, Mapping, TypeVar

import kubernetes
import urllib3
from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException

from kubeloop.api.resources import KINDS

log = logging.getLogger(__name__)

FIELD_MANAGER = "kubeloop"
T = TypeVar("T")


@dataclass(frozen=True)
class ResourceType:
    """Where a kind lives in the REST API."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        return f"{base}/{name}" if name else base


_TYPES = [
    ResourceType("v1", "Namespace", "namespaces", namespaced=False),
    ResourceType("v1", "Node", "nodes", namespaced=False),
    ResourceType("v1", "Pod", "pods"),
    ResourceType("v1", "Service", "services"),
    ResourceType("v1", "ConfigMap", "configmaps"),
    ResourceType("v1", "Secret", "secrets"),
    ResourceType("v1", "ServiceAccount", "serviceaccounts"),
    ResourceType("v1", "Event", "events"),
    ResourceType("discovery.k8s.io/v1", "EndpointSlice", "endpointslices"),
    ResourceType("apps/v1", "Deployment", "deployments"),
    ResourceType("batch/v1", "Job", "jobs"),
    ResourceType("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers"),
    ResourceType("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
    ResourceType("rbac.authorization.k8s.io/v1", "Role", "roles"),
    ResourceType("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
    ResourceType("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", namespaced=False),
    ResourceType("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "clusterrolebindings",
                 namespaced=False),
    ResourceType("apiextensions.k8s.io/v1", "CustomResourceDefinition",
                 "customresourcedefinitions", namespaced=False),
    ResourceType("apiregistration.k8s.io/v1", "APIService", "apiservices", namespaced=False),
    ResourceType("gateway.networking.k8s.io/v1", "HTTPRoute", "httproutes"),
    ResourceType("trainer.kubeflow.org/v1alpha1", "TrainJob", "trainjobs"),
    ResourceType("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime", "clustertrainingruntimes",
                 namespaced=False),
    ResourceType("jobset.x-k8s.io/v1alpha2", "JobSet", "jobsets"),
    ResourceType("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration",
                 "mutatingwebhookconfigurations", namespaced=False),
    ResourceType("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration",
                 "validatingwebhookconfigurations", namespaced=False),
    ResourceType("resource.k8s.io/v1", "DeviceClass", "deviceclasses", namespaced=False),
    ResourceType("resource.k8s.io/v1", "ResourceSlice", "resourceslices", namespaced=False),
    ResourceType("resource.k8s.io/v1", "ResourceClaim", "resourceclaims"),
    ResourceType("resource.k8s.io/v1", "ResourceClaimTemplate", "resourceclaimtemplates"),
    ResourceType("serving.kserve.io/v1beta1", "InferenceService", "inferenceservices"),
    ResourceType("serving.kserve.io/v1alpha1", "ServingRuntime", "servingruntimes"),
    ResourceType("serving.kserve.io/v1alpha1", "ClusterStorageContainer", "clusterstoragecontainers",
                 namespaced=False),
] + [ResourceType(k.api_version, k.kind, k.plural) for k in KINDS]
RESOURCE_TYPES = {(t.api_version, t.kind): t for t in _TYPES}


class KubeError(Exception):
    """A Kubernetes API call failed."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def transient(self) -> bool:
        """Conflicts, throttling and server errors are worth retrying."""
        return self.status in (0, 409, 429) or self.status >= 500


def resource_type(api_version: str, kind: str) -> ResourceType:
    try:
        return RESOURCE_TYPES[(api_version, kind)]
    except KeyError:
        raise ValueError(f"kubeloop does not manage {kind} in {api_version}") from None


CONNECTIONS_KEPT = 32
"""Kept-alive connections to the API server: more than the operator's threads that talk to it at once."""


class Kube:
    """A small, typed-by-convention client: objects are plain dicts."""

    def __init__(self, api_client: ApiClient):
        # Failures surface at once; callers decide about retrying (kopf's
        # backoff in the operator, polling loops elsewhere).
        api_client.configuration.retries = 0
        pool = api_client.rest_client.pool_manager.connection_pool_kw
        pool["retries"] = 0
        # The client keeps 5 connections a core: on 2 cores the operator's
        # handler, resync and watch threads found the pool full and each
        # discarded connection cost a TLS handshake to make again.
        pool["maxsize"] = max(pool.get("maxsize") or 0, CONNECTIONS_KEPT)
        self._api = api_client

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, context: str | None = None) -> "Kube":
        """path, else $KUBECONFIG as it is now (the kubernetes client reads it once, at import)."""
        config = Configuration()
        kubernetes.config.load_kube_config(config_file=path or os.environ.get("KUBECONFIG"), context=context,
                                           client_configuration=config)
        return cls(ApiClient(config))

    @classmethod
    def in_cluster(cls) -> "Kube":
        config = Configuration()
        kubernetes.config.load_incluster_config(client_configuration=config)
        return cls(ApiClient(config))

    @classmethod
    def from_environment(cls) -> "Kube":
        """In-cluster credentials inside a Pod, else the kubeconfig ($KUBECONFIG)."""
        try:
            return cls.in_cluster()
        except kubernetes.config.ConfigException:
            return cls.from_kubeconfig()

    @property
    def server(self) -> str:
        return self._api.configuration.host

    def close(self) -> None:
        self._api.close()

    # -- raw -------------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None, *,
                query: Iterable[tuple[str, str]] = (), content_type: str | None = None,
                timeout: float = 30) -> Any:
        headers = {"Content-Type": content_type} if content_type else {}
        raw = self._call(method, path, body, query=query, headers=headers, timeout=timeout).data
        return json.loads(raw) if raw else None

    def headers(self, method: str, path: str, *, timeout: float = 30) -> Mapping[str, str]:
        """A request's response headers, any case (a proxied Pod's own,
        through the API server's proxy); a failure is a KubeError, as for
        request()."""
        answer = self._call(method, path, timeout=timeout)
        answer.drain_conn()
        return answer.headers

    def _call(self, method: str, path: str, body: Any = None, *, query: Iterable[tuple[str, str]] = (),
              headers: dict[str, str] | None = None, timeout: float = 30) -> urllib3.HTTPResponse:
        """The raw response; every failure becomes a KubeError here and only here."""
        with _mapped_errors():
            return self._api.call_api(
                path, method, query_params=list(query), header_params={"Accept": "application/json", **(headers or {})},
                body=body, auth_settings=["BearerToken"], _return_http_data_only=True, _preload_content=False,
                _request_timeout=timeout,
            )

    # -- objects ---------------------------------------------------------

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict | None:
        rtype = resource_type(api_version, kind)
        try:
            return self.request("GET", rtype.path(namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, api_version: str, kind: str, namespace: str | None = None,
             label_selector: str | None = None, field_selector: str | None = None) -> list[dict]:
        return self.snapshot(api_version, kind, namespace, label_selector, field_selector)[0]

    def snapshot(self, api_version: str, kind: str, namespace: str | None = None,
                 label_selector: str | None = None, field_selector: str | None = None) -> tuple[list[dict], str]:
        """Every object, with the list's resourceVersion (where a watch picks up)."""
        rtype = resource_type(api_version, kind)
        query = [(name, value) for name, value in (("labelSelector", label_selector),
                                                   ("fieldSelector", field_selector)) if value]
        items: list[dict] = []
        token = None
        while True:
            page = query + ([("continue", token)] if token else []) + [("limit", "500")]
            result = self.request("GET", rtype.path(namespace), query=page)
            for item in result.get("items", []):
                item.setdefault("apiVersion", api_version)
                item.setdefault("kind", kind)
                items.append(item)
            token = result.get("metadata", {}).get("continue")
            if not token:
                return items, result.get("metadata", {}).get("resourceVersion", "")

    def watch(self, api_version: str, kind: str, namespace: str | None = None,
              resource_version: str | None = None, timeout: int = 300) -> Iterator[tuple[str, dict]]:
        """Stream (event type, object) pairs until the server ends the watch."""
        rtype = resource_type(api_version, kind)
        query = [("watch", "true"), ("timeoutSeconds", str(timeout)), ("allowWatchBookmarks", "false")]
        if resource_version:
            query.append(("resourceVersion", resource_version))
        response = self._call("GET", rtype.path(namespace), query=query, timeout=timeout + 10)
        buffer = b""
        try:
            with _mapped_errors():
                for chunk in response.stream(65536):
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if line.strip():
                            event = json.loads(line)
                            yield event["type"], event["object"]
        finally:
            response.release_conn()

    def apply(self, obj: dict, field_manager: str = FIELD_MANAGER, subresource: str | None = None) -> dict:
        """Server-side apply: create the object or converge the fields we own."""
        rtype = resource_type(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        path = rtype.path(meta.get("namespace"), meta["name"])
        if subresource:
            path += f"/{subresource}"
        return self.request(
            "PATCH", path, obj, content_type="application/apply-patch+yaml",
            query=[("fieldManager", field_manager), ("force", "true")],
        )

    def create(self, obj: dict) -> dict:
        rtype = resource_type(obj["apiVersion"], obj["kind"])
        return self.request("POST", rtype.path(obj["metadata"].get("namespace")), obj)

    def merge_patch(self, api_version: str, kind: str, name: str, patch: dict,
                    namespace: str | None = None, subresource: str | None = None) -> dict:
        rtype = resource_type(api_version, kind)
        path = rtype.path(namespace, name) + (f"/{subresource}" if subresource else "")
        return self.request("PATCH", path, patch, content_type="application/merge-patch+json")

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None,
               propagation: str = "Background") -> bool:
        """Delete if present; True when something was deleted."""
        rtype = resource_type(api_version, kind)
        try:
            self.request("DELETE", rtype.path(namespace, name),
                         {"propagationPolicy": propagation})
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def healthy(self) -> bool:
        try:
            return self.text("/readyz") == "ok"
        except KubeError:
            return False

    def text(self, path: str) -> str:
        """A GET of one of the API server's own text routes (/readyz, /metrics)."""
        return self._call("GET", path, headers={"Accept": "*/*"}, timeout=5).data.decode()


@contextmanager
def _mapped_errors() -> Iterator[None]:
    """API errors and broken connections, as KubeErrors: the one mapping."""
    try:
        yield
    except ApiException as exc:
        raise _kube_error(exc) from None
    except (OSError, urllib3.exceptions.HTTPError) as exc:  # refused, reset, timeout
        raise KubeError(0, "Unreachable", str(exc)) from None


def _kube_error(exc: ApiException) -> KubeError:
    message = exc.body.decode() if isinstance(exc.body, bytes) else (exc.body or "")
    try:
        message = json.loads(message).get("message", message)
    except (ValueError, AttributeError):
        pass
    return KubeError(exc.status or 0, exc.reason or "", message)


class _Expired(Exception):
    """The watch's resourceVersion is older than the server keeps (410 Gone)."""


class Informer(Generic[T]):
    """A local copy of one kind's objects: one LIST, then a WATCH from the
    list's resourceVersion, listing again only when the server has forgotten
    that version (410) or the connection failed. `keep` reduces each object to
    what the reader needs (None: not kept), so memory follows what matters,
    not the size of the cluster. Reads never call the API server; while it is
    unreachable they see the last state it sent, and the log says why.
    `index` files each kept object under a key (None: under none), so a
    reader asking for one key's objects does not scan them all.
    `on_change(old, new)`, where set, is called from the watch's thread
    when what is kept of an object changes (None: not kept); a LIST after
    a broken watch tells nothing."""

    def __init__(self, kube: Kube, api_version: str, kind: str, keep: Callable[[dict], T | None],
                 watch_seconds: int = 60, index: Callable[[T], Hashable | None] | None = None):
        self._kube, self._api_version, self._kind = kube, api_version, kind
        self._keep, self._watch_seconds = keep, watch_seconds
        self._index_of = index
        self.on_change: Callable[[T | None, T | None], None] | None = None
        self._items: dict[str, T] = {}
        self._index: dict[Hashable, dict[str, T]] = {}
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._stopping = threading.Event()
        self._error = "not listed yet"
        self.lists = 0
        """How many LISTs it has made: one, plus one per expired or broken watch."""

    def start(self) -> "Informer[T]":
        threading.Thread(target=self._run, name=f"informer-{self._kind}", daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop following; the watch in flight ends within watch_seconds."""
        self._stopping.set()

    def values(self, timeout: float = 30) -> list[T]:
        """What is kept of every object, once the first LIST has arrived."""
        self._wait_synced(timeout)
        with self._lock:
            return list(self._items.values())

    def indexed(self, key: Hashable, timeout: float = 30) -> list[T]:
        """What is kept of the objects `index` files under key, once the first LIST has arrived."""
        self._wait_synced(timeout)
        with self._lock:
            return list(self._index.get(key, {}).values())

    def _wait_synced(self, timeout: float) -> None:
        if not self._synced.wait(timeout):
            raise KubeError(0, "NotSynced", f"no {self._kind} list within {timeout:.0f} s: {self._error}")

    def _file(self, uid: str, kept: T | None) -> None:
        """Keep (or, for None, forget) an object, and refile it; under the lock."""
        old = self._items.pop(uid, None)
        if old is not None and self._index_of and (key := self._index_of(old)) is not None:
            filed = self._index[key]
            filed.pop(uid, None)
            if not filed:
                del self._index[key]
        if kept is None:
            return
        self._items[uid] = kept
        if self._index_of and (key := self._index_of(kept)) is not None:
            self._index.setdefault(key, {})[uid] = kept

    def _run(self) -> None:
        delay = 0.5
        while not self._stopping.is_set():
            try:
                version = self._relist()
                delay = 0.5
                while not self._stopping.is_set():
                    version = self._follow(version)
            except _Expired:
                continue
            except KubeError as exc:
                if exc.status == 410:
                    continue
                self._error = str(exc)
                log.warning("watching %s failed (%s); listing again in %.1f s", self._kind, exc, delay)
                self._stopping.wait(delay)
                delay = min(delay * 2, 30)

    def _tell(self, old: T | None, new: T | None) -> None:
        try:
            self.on_change(old, new)
        except Exception:  # noqa: BLE001 - a listener's failure must not stop the watch
            log.exception("a listener of %s changes failed", self._kind)

    def _relist(self) -> str:
        objects, version = self._kube.snapshot(self._api_version, self._kind)
        self.lists += 1
        kept = {o["metadata"]["uid"]: k for o in objects if (k := self._keep(o)) is not None}
        with self._lock:
            self._items, self._index = {}, {}
            for uid, item in kept.items():
                self._file(uid, item)
        self._synced.set()
        return version

    def _follow(self, version: str) -> str:
        for kind, obj in self._kube.watch(self._api_version, self._kind, resource_version=version,
                                          timeout=self._watch_seconds):
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise _Expired()
                raise KubeError(obj.get("code", 0), obj.get("reason", ""), obj.get("message", ""))
            version = obj["metadata"]["resourceVersion"]
            kept = None if kind == "DELETED" else self._keep(obj)
            with self._lock:
                old = self._items.get(obj["metadata"]["uid"])
                self._file(obj["metadata"]["uid"], kept)
            if self.on_change is not None and old != kept:
                self._tell(old, kept)
            if self._stopping.is_set():
                break
        return version
