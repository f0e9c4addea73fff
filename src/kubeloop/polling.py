"""Waiting for the world to reach a state: the one polling helper (tenacity
underneath), used by the story, the local platform's installers and the
tests."""

from __future__ import annotations

from typing import Callable, TypeVar

from tenacity import RetryError, Retrying, retry_if_result, stop_after_delay, wait_fixed

T = TypeVar("T")


def wait_for(probe: Callable[[], T], timeout: float = 30, what: str = "condition", interval: float = 0.2,
             seen: Callable[[], str] | None = None, error: Callable[[str], Exception] = TimeoutError) -> T:
    """probe()'s first truthy value, asked every interval seconds. After
    timeout, error(a message naming what, and what was seen: seen()'s
    answer, else probe's last value)."""
    try:
        return Retrying(stop=stop_after_delay(timeout), wait=wait_fixed(interval),
                        retry=retry_if_result(lambda value: not value))(probe)
    except RetryError as exc:
        saw = seen() if seen else repr(exc.last_attempt.result())
        raise error(f"{what} did not happen within {timeout:.0f} s; saw {saw}") from None
