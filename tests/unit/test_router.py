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
