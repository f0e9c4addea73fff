"""The real node's Pods as Prometheus targets (unit: the pure part; the
scrape itself is proven in tests/e2e/test_real_node.py)."""

from __future__ import annotations

from kubeloop.dev.podtargets import pod_targets


def _pod(name: str, node: str, phase: str = "Running", scrape: str = "true", ip: str = "10.244.128.9") -> dict:
    return {"metadata": {"name": name, "namespace": "ml", "labels": {"kubeloop.dev/inferenceservice": "fraud"},
                         "annotations": {"prometheus.io/scrape": scrape, "prometheus.io/port": "8080"}},
            "spec": {"nodeName": node}, "status": {"phase": phase, "podIP": ip}}


def test_running_pods_on_the_real_node_that_ask_to_be_scraped_are_targets():
    pods = [_pod("router", "kubeloop-real"), _pod("fake", "gpu-l40s"), _pod("starting", "kubeloop-real", "Pending"),
            _pod("quiet", "kubeloop-real", scrape="false")]
    assert pod_targets(pods, "kubeloop-real") == [{
        "targets": ["10.244.128.9:8080"],
        "labels": {"namespace": "ml", "pod": "router", "job": "kubernetes-pods", "inferenceservice": "fraud"}}]
