"""The loop's cluster flavour, its pure parts (unit level; the flavour itself
runs on the real node in tests/e2e/test_real_node.py)."""

from __future__ import annotations

from kubeloop.cli.demo import load_examples
from kubeloop.paths import repo_root
from kubeloop.api.training import TrainingJobSpec
from kubeloop.story.cluster import SERVING_RESOURCES, STORE_CONFIG_MAP, Endpoints, on_the_real_node
from kubeloop.story.loop import Timings, prepare
from tests.unit.fakes import FakeObjects


def test_on_the_real_node_the_service_is_served_on_cpu_and_training_reads_the_published_store_on_two_nodes():
    docs = prepare(load_examples(repo_root() / "examples"), "ns", "m", Timings())
    service = next(d for d in docs if d["kind"] == "InferenceService")
    assert "gpu" in service["spec"]
    assert service["spec"]["features"]["materializeEvery"] == Timings().materialize_every
    moved = {d["kind"]: d["spec"] for d in on_the_real_node(docs)}
    served = moved["InferenceService"]
    assert "gpu" not in served and served["resources"] == SERVING_RESOURCES
    # Callers send entity requests: the front reads the published store's online values.
    assert served["features"] == service["spec"]["features"]
    for spec in (moved["TrainingJob"], served["retraining"]["template"]):
        assert spec["features"]["store"] == {"configMap": {"name": STORE_CONFIG_MAP}}
        assert spec["distributed"] == {"nodes": 2} and spec["resources"]["cpu"] == "500m"
        TrainingJobSpec.model_validate(spec)  # still a TrainingJob the API accepts
    assert "gpu" in service["spec"] and "store" not in service["spec"]["retraining"]["template"]["features"]


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
