"""The local platform's choice of Feast online store: sqlite (a file in the
feature repository, the embedded default) or Redis, Debian's `redis-server`
started as a platform process on 127.0.0.1 when chosen.

Redis here is a cache of the offline store that materialisation refills, so
it persists nothing (no RDB snapshots, no append-only file) and is bounded:
at its memory limit it refuses writes (noeviction) rather than silently
evicting feature values.
"""

from __future__ import annotations

import shutil
from enum import Enum
from pathlib import Path

MAX_MEMORY = "512mb"


class OnlineStoreKind(str, Enum):
    sqlite = "sqlite"
    redis = "redis"


def redis_binary() -> str:
    found = shutil.which("redis-server")
    if not found:
        raise FileNotFoundError("redis-server is not installed: `make debs` installs Debian's redis-server")
    return found


def build_redis_argv(binary: str, port: int, root: Path, address: str = "127.0.0.1") -> list[str]:
    """redis-server on address:port only, nothing persisted, bounded memory.
    Without a password, Redis's protected mode refuses every client that is
    not on loopback; on the real node's address (on this machine only, as
    MLflow's) the Pods are such clients, so it is off there."""
    protected = "yes" if address == "127.0.0.1" else "no"
    return [binary, "--bind", address, "--port", str(port), "--dir", str(root),
            "--save", "", "--appendonly", "no", "--protected-mode", protected,
            "--maxmemory", MAX_MEMORY, "--maxmemory-policy", "noeviction",
            "--daemonize", "no", "--logfile", ""]


def answering(address: str) -> bool:
    """Whether Redis at host:port answers PING."""
    import redis

    host, port = address.rsplit(":", 1)
    try:
        with redis.Redis(host=host, port=int(port), socket_connect_timeout=1, socket_timeout=1) as client:
            return bool(client.ping())
    except (redis.ConnectionError, redis.TimeoutError):
        return False
