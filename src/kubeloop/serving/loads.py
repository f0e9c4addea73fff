"""Model loads that run beside a reconcile instead of inside it.

Triton's repository API answers a load request only once the model has
loaded or failed, which for a large model (or a python-backend model with a
slow initialize) takes minutes. A reconcile holds a kopf worker and its
object's lock, so it starts the load here and returns; a later reconcile
collects the outcome. One load per key (one InferenceService) at a time: the
next one starts once the running one has finished, so the table holds at most
one entry per served object.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Load:
    token: str
    """What was asked for (the server and the fingerprint of what it loads)."""
    future: Future

    def done(self) -> bool:
        return self.future.done()


class Loads:
    """Loads in flight, by key."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._loads: dict[str, Load] = {}

    def get(self, key: str) -> Load | None:
        with self._guard:
            return self._loads.get(key)

    def start(self, key: str, token: str, call: Callable[[], None]) -> Load:
        """Run call in a thread of its own (a daemon: a load still waiting for
        Triton must not hold up the operator's exit)."""
        load = Load(token, Future())
        load.future.set_running_or_notify_cancel()

        def run() -> None:
            try:
                call()
            except BaseException as exc:  # noqa: BLE001 - handed to whoever collects the load
                load.future.set_exception(exc)
            else:
                load.future.set_result(None)

        with self._guard:
            self._loads[key] = load
        threading.Thread(target=run, name=f"triton-load-{key}", daemon=True).start()
        return load

    def collect(self, key: str, load: Load) -> None:
        """Forget a finished load and raise what it raised."""
        with self._guard:
            if self._loads.get(key) is load:
                del self._loads[key]
        load.future.result()

    def forget(self, key: str) -> None:
        with self._guard:
            self._loads.pop(key, None)
