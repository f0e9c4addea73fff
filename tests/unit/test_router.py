"""The router's routing decisions (pure)."""

from __future__ import annotations

from collections import Counter

from kubeloop.serving.router import Route, _features, bucket, pick

ROUTES = (Route("primary", "1", 80), Route("canary", "2", 20))


def test_the_same_key_always_reaches_the_same_version():
    assert {pick(ROUTES, "caller-42").version for _ in range(20)} == {pick(ROUTES, "caller-42").version}


def test_shares_follow_the_percents():
    counts = Counter(pick(ROUTES, f"k{i}").role for i in range(20000))
    assert abs(counts["canary"] / 20000 - 0.20) < 0.01


def test_the_shadow_draw_is_independent_of_the_canary_draw():
    keys = [f"k{i}" for i in range(20000)]
    canary = {k for k in keys if pick(ROUTES, k).role == "canary"}
    mirrored = {k for k in keys if bucket(k, "shadow") < 50}
    assert abs(len(canary & mirrored) / len(canary) - 0.5) < 0.03


def test_a_zero_percent_canary_gets_nothing():
    routes = (Route("primary", "1", 100), Route("canary", "2", 0))
    assert {pick(routes, f"k{i}").role for i in range(1000)} == {"primary"}


def test_features_from_flat_and_nested_v2_tensors():
    nested = {"inputs": [{"shape": [2, 3], "data": [[1, 2, 3], [4, 5, 6]]}]}
    flat = {"inputs": [{"shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]}]}
    assert _features(nested) == _features(flat) == [[1, 2, 3], [4, 5, 6]]


def test_the_traffic_gauge_shows_the_routes_the_router_reads(tmp_path, monkeypatch):
    import json
    import os

    from prometheus_client import generate_latest

    from kubeloop.dev import processes
    from kubeloop.serving.router import Router

    config = {"service": "ml/fraud", "model": "fraud", "triton_model": "fraud", "triton_url": "http://127.0.0.1:1",
              "routes": [{"role": "primary", "version": "1", "percent": 80},
                         {"role": "canary", "version": "2", "percent": 20}]}
    path = tmp_path / "routes.json"
    path.write_text(json.dumps(config))
    # As the router runs: processes.start leaves out what an earlier test's feast import set.
    for name in processes.INHERITED_NOT:
        monkeypatch.delenv(name, raising=False)
    router = Router(path)

    def shown() -> dict:
        return {(s.labels["role"], s.labels["version"]): s.value
                for metric in router.metrics.registry.collect() if metric.name == "kubeloop_router_traffic_ratio"
                for s in metric.samples}

    assert shown() == {("primary", "1"): 0.8, ("canary", "2"): 0.2}
    config["routes"] = [{"role": "primary", "version": "2", "percent": 100}]
    config["shadow"] = {"role": "shadow", "version": "3", "percent": 50}
    path.write_text(json.dumps(config))
    os.utime(path, ns=(0, path.stat().st_mtime_ns + 1))
    router.reload_routes()
    assert shown() == {("primary", "2"): 1.0, ("shadow", "3"): 0.5}
    path.write_text("{broken")
    os.utime(path, ns=(0, path.stat().st_mtime_ns + 2))
    router.reload_routes()
    assert shown() == {("primary", "2"): 1.0, ("shadow", "3"): 0.5}
    assert b"kubeloop_router_traffic_ratio" in generate_latest(router.metrics.registry)
