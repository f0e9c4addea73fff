"""The local platform's Redis command line (pure)."""

from __future__ import annotations

from pathlib import Path

from kubeloop.dev.onlinestore import build_redis_argv


def _options(argv: list[str]) -> dict[str, str]:
    return dict(zip(argv[1::2], argv[2::2], strict=True))


def test_redis_listens_where_asked_persists_nothing_and_refuses_writes_when_full():
    options = _options(build_redis_argv("redis-server", 6400, Path("/state/redis")))
    assert options["--bind"] == "127.0.0.1" and options["--port"] == "6400" and options["--dir"] == "/state/redis"
    assert options["--save"] == "" and options["--appendonly"] == "no"
    assert options["--maxmemory-policy"] == "noeviction" and options["--protected-mode"] == "yes"


def test_on_the_real_nodes_address_pods_may_connect():
    """Protected mode refuses every client off loopback when no password is
    set (seen on the real node: the host's own PING was refused)."""
    options = _options(build_redis_argv("redis-server", 6400, Path("/r"), "10.244.128.1"))
    assert options["--bind"] == "10.244.128.1" and options["--protected-mode"] == "no"
