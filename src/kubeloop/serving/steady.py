"""What a steady service's reconcile can leave out, and how it knows.

Why: at 300 services resynced 19 times a second, each reconcile asked the API
server nine things (the service, an apply of its Deployment and Service, a
GET of the Deployment, a LIST of each kind it may own and of its Pods): 171
requests a second, and each LIST by label made the API server filter every
object of that kind in the namespace. A spec change waited behind them.

- Unwanted children only come from a service's earlier wanted sets: once this
  process has cleaned up after a set, a reconcile that wants the same set
  has nothing to find (CleanedUp).
- A child this process applied and nobody changed since (its resourceVersion
  is still the one the apply answered) needs no apply of the same object: a
  GET says so, and costs the API server less than a server-side apply
  (Applied).

A process that starts again remembers nothing: it lists and applies once per
service, as before.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from typing import Callable, Generic, TypeVar

from kubeloop.api.refs import ObjectRef
from kubeloop.kube import Kube

SERVICES_KEPT = 50_000
"""Services whose clean-up is remembered (the least recently cleaned dropped
first; a dropped one is listed again at its next reconcile, nothing else is lost)."""
CHILDREN_KEPT = 200_000
"""Children whose last apply is remembered, likewise (a dropped one is applied again)."""

K = TypeVar("K")
V = TypeVar("V")


class _Kept(Generic[K, V]):
    """A bounded, thread-safe record, least recently written dropped first."""

    def __init__(self, kept: int):
        self.kept = kept
        self._lock = threading.Lock()
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        with self._lock:
            return self._items.get(key)

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.kept:
                self._items.popitem(last=False)

    def pop(self, key: K) -> None:
        with self._lock:
            self._items.pop(key, None)


class CleanedUp:
    """Per service (by uid), what its last complete clean-up in this process
    left: the backend's name and the set of children it wanted. The
    backends share one, so a service that moves to another backend and back
    is listed again."""

    def __init__(self, kept: int = SERVICES_KEPT):
        self._wanted: _Kept[str, tuple[str, frozenset]] = _Kept(kept)

    def due(self, ref: ObjectRef, wanted: tuple[str, frozenset]) -> bool:
        """Whether the service's children must be listed for unwanted ones."""
        return self._wanted.get(ref.uid) != wanted

    def done(self, ref: ObjectRef, wanted: tuple[str, frozenset]) -> None:
        """Every child the service owned beyond the wanted set was deleted."""
        self._wanted.put(ref.uid, wanted)

    def forget(self, ref: ObjectRef) -> None:
        self._wanted.pop(ref.uid)


class Applied:
    """Server-side apply of children, left out where the child is as this
    process last applied it."""

    def __init__(self, kube: Kube, kept: int = CHILDREN_KEPT):
        self.kube = kube
        self._last: _Kept[tuple, tuple[bytes, str]] = _Kept(kept)

    def apply(self, obj: dict, before: Callable[[dict | None], None] | None = None) -> dict:
        """The child as the API server holds it once obj is applied. Where it
        will be applied, `before` first gets the child as it is (None: not
        there), read once for both."""
        meta = obj["metadata"]
        key = (obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        digest = hashlib.blake2b(json.dumps(obj, sort_keys=True).encode(), digest_size=16).digest()
        last = self._last.get(key)
        def read() -> dict | None:
            return self.kube.get(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))

        unchanged = last is not None and last[0] == digest
        live = read() if unchanged else None
        if unchanged and live is not None and live["metadata"].get("resourceVersion") == last[1]:
            return live
        if before is not None:
            before(live if unchanged else read())
        answer = self.kube.apply(obj)
        version = answer.get("metadata", {}).get("resourceVersion")
        if version:
            self._last.put(key, (digest, version))
        return answer
