"""Kubernetes-style durations and RFC 3339 timestamps, as the API's fields
and statuses spell them."""

from __future__ import annotations

import datetime as dt
import re

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(duration: str) -> float:
    """A duration ("90s", "1h30m", "7d") in seconds."""
    return sum(float(n) * _UNITS[u] for n, u in re.findall(r"(\d+)(ms|s|m|h|d)", duration))


def iso(timestamp: float) -> str:
    """A Unix time as RFC 3339 in UTC, to the second (as Kubernetes writes times)."""
    return dt.datetime.fromtimestamp(timestamp, dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def instant(text: str) -> str:
    """An RFC 3339 time spelt one way (UTC, milliseconds, Z). Alertmanager
    spells one instant two ways: its webhook trims trailing zeros from the
    fraction, its API does not; keys built from either must be equal."""
    parsed = _parse(text)
    if parsed.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone")
    return parsed.astimezone(dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def epoch(text: str) -> float:
    """An RFC 3339 time as a Unix time."""
    return _parse(text).timestamp()


def _parse(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
