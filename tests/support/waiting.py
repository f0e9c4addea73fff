"""Polling helpers: wait for the world to reach a state, with a useful message."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_for(probe: Callable[[], T], timeout: float = 30, interval: float = 0.2,
             what: str = "condition") -> T:
    """Call probe until it returns something truthy; return that value."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise TimeoutError(f"{what} not reached within {timeout} s (last: {last!r})")
