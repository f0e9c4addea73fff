"""How often a steady object's timer reconciles it.

Every change reaches the operator through its watch and is reconciled at
once; the timer is there for what no event announces (a Pod gone, a model
registry alias moved where no webhook tells). With a few objects each is
reconciled every resync_seconds. With thousands that would be thousands of
reconciles a minute for objects where nothing happened, so steady objects
share a budget of timer reconciles a second: each is reconciled every
count / per_second seconds instead (5,000 services at 50 a second: every
100 s). Objects with work under way are not steady and keep resync_seconds.
"""

from __future__ import annotations

import threading
import time
from typing import Callable


class ResyncPace:
    def __init__(self, seconds: float, per_second: float, clock: Callable[[], float] = time.monotonic):
        self.seconds = seconds
        self.per_second = per_second
        self.clock = clock
        self.last: dict[str, float] = {}
        """Object uid -> when it was last reconciled; one entry per object (forget() on deletion)."""
        self._lock = threading.Lock()

    def interval(self) -> float:
        """How often each steady object is reconciled by its timer now."""
        return max(self.seconds, len(self.last) / self.per_second)

    def due(self, uid: str, steady: bool) -> bool:
        """Whether the object's timer, firing now, should reconcile it. The
        timer fires every `seconds`: half of that is allowed for its jitter."""
        with self._lock:
            last = self.last.get(uid)
            return not steady or last is None or self.clock() - last + self.seconds / 2 >= self.interval()

    def reconciled(self, uid: str) -> None:
        with self._lock:
            self.last[uid] = self.clock()

    def forget(self, uid: str) -> None:
        with self._lock:
            self.last.pop(uid, None)
