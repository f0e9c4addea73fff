"""The loop's cluster flavour, its pure parts (unit level; the flavour itself
runs on the real node in tests/e2e/test_real_node.py)."""

from __future__ import annotations

from kubeloop.cli.demo import load_examples
from kubeloop.paths import repo_root
from kubeloop.story.cluster import SERVING_RESOURCES, Endpoints, on_the_real_node
from kubeloop.story.loop import Timings, prepare
from tests.unit.fakes import FakeObjects


def test_the_example_service_is_served_on_cpu_with_a_small_request_on_the_real_node():
    docs = prepare(load_examples(repo_root() / "examples"), "ns", "m", Timings())
    service = next(d for d in docs if d["kind"] == "InferenceService")
    assert "gpu" in service["spec"]
    assert service["spec"]["features"]["materializeEvery"] == Timings().materialize_every
    moved = next(d for d in on_the_real_node(docs) if d["kind"] == "InferenceService")
    assert "gpu" not in moved["spec"] and moved["spec"]["resources"] == SERVING_RESOURCES
    # Its store is a folder on this machine, which router Pods cannot open: callers send vectors there.
    assert "features" not in moved["spec"]
    assert "gpu" in service["spec"] and "features" in service["spec"]  # the input is left as it was


def _slice(name: str, ready: bool, address: str) -> dict:
    return {"kind": "EndpointSlice", "metadata": {"name": name, "namespace": "ns",
                                                  "labels": {"kubernetes.io/service-name": "front"}},
            "ports": [{"name": "http", "port": 8080}],
            "endpoints": [{"addresses": [address], "conditions": {"ready": ready}}]}


def test_a_service_url_maps_to_a_ready_endpoint_or_none():
    objects = FakeObjects()
    reach = Endpoints(objects)
    assert reach("http://front.ns.svc.cluster.local") is None
    objects.apply(_slice("front-a", False, "10.244.128.5"))
    assert reach("http://front.ns.svc.cluster.local") is None  # a terminating router is no target
    objects.apply(_slice("front-b", True, "10.244.128.9"))
    assert reach("http://front.ns.svc.cluster.local") == "http://10.244.128.9:8080"
