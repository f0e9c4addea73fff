"""The loop's cluster flavour, its pure parts (unit level; the flavour itself
runs on the real node in tests/e2e/test_real_node.py)."""

from __future__ import annotations

import json

from kubeloop.cli.demo import load_examples
from kubeloop.paths import repo_root
from kubeloop.api.training import TrainingJobSpec
from kubeloop.story.cluster import JOB_RESOURCES, SERVING_RESOURCES, STORE_CONFIG_MAP, Endpoints, on_the_real_node
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


def test_the_cluster_loops_operator_is_the_charts_pod_configured_as_the_host_operator_was(tmp_path):
    """Cluster path, its pure part: the chart's values for the loop render
    (helm template, the chart's own schema) into an operator Pod with the
    settings prepare_cluster chose, the platform's servers at the addresses
    a Pod reaches, the webhooks' Secrets by reference, and a NodePort
    Service on the port Alertmanager and MLflow call."""
    import subprocess

    import yaml

    from kubeloop.dev.binaries import binary
    from kubeloop.story.chart import MLFLOW_WEBHOOK_SECRET, WEBHOOK_SECRET, operator_values

    settings = {"KUBELOOP_TRAINING_IMAGE": "kubeloop/training:abc", "KUBELOOP_COMPONENTS_IMAGE": "kubeloop/runtime:1",
                "KUBELOOP_ROUTER_IMAGE": "kubeloop/runtime:1", "KUBELOOP_TRITON_IMAGE": "kubeloop/triton:2",
                "KUBELOOP_TRITON_BACKEND": "python", "KUBELOOP_OBJECT_STORE_ENDPOINT": "http://10.88.0.1:8333",
                "KUBELOOP_JOB_RESOURCES": json.dumps(JOB_RESOURCES)}
    platform_env = {"MLFLOW_TRACKING_URI": "http://10.88.0.1:5000", "KUBELOOP_REQUEST_LOG": "s3://requests",
                    "KUBELOOP_MLFLOW_WEBHOOK_URL": "http://127.0.0.1:30011/hooks/mlflow",
                    "PROMETHEUS_URL": "http://10.88.0.1:9090", "KUBELOOP_WEBHOOK_PORT": "30011"}
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(operator_values(settings, platform_env, "team", "kubeloop/operator:xyz")))
    out = subprocess.run([str(binary("helm")), "template", "kubeloop", str(repo_root() / "charts" / "kubeloop"),
                          "--namespace", "team", "--kube-version", "1.36.3", "-f", str(values)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "kubeloop/operator:xyz" and container["imagePullPolicy"] == "Never"
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["KUBELOOP_PIPELINE_BACKEND"] == "trainer" and env["KUBELOOP_TRAINING_IMAGE"] == "kubeloop/training:abc"
    assert env["KUBELOOP_SERVING_BACKEND"] == "kserve" and env["KUBELOOP_TRITON_BACKEND"] == "python"
    assert env["KUBELOOP_MATERIALIZER"] == "kubernetes" and env["KUBELOOP_NAMESPACES"] == "team"
    assert env["MLFLOW_TRACKING_URI"] == "http://10.88.0.1:5000"
    assert env["KUBELOOP_PROMETHEUS_URL"] == "http://10.88.0.1:9090"
    assert json.loads(env["KUBELOOP_JOB_RESOURCES"]) == JOB_RESOURCES  # what the node's two cores hold
    assert env["AWS_SECRET_ACCESS_KEY"] == {"secretKeyRef": {"name": "kubeloop-object-store",
                                                             "key": "AWS_SECRET_ACCESS_KEY"}}
    secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets == {WEBHOOK_SECRET, MLFLOW_WEBHOOK_SECRET}
    (service,) = [d for d in docs if d["kind"] == "Service"]
    assert service["spec"]["type"] == "NodePort" and service["spec"]["ports"][0]["nodePort"] == 30011


def test_the_outcome_story_on_the_cluster_path_is_refused_before_anything_starts(tmp_path):
    """Cluster path, its CLI: the outcome story's labels are a folder on this
    machine, which Pods cannot read, so `demo --cluster --story outcomes` is
    refused at once, naming the option and what to run instead, and no
    platform starts."""
    from typer.testing import CliRunner

    from kubeloop.cli.main import app

    state = tmp_path / "state"
    result = CliRunner(env={"COLUMNS": "400"}).invoke(app, ["demo", "--cluster", "--story", "outcomes",
                                                        "--state-dir", str(state)])
    assert result.exit_code == 2, result.output
    assert "--story" in result.output and "kubeloop demo --story outcomes" in result.output, result.output
    assert not state.exists()
