"""The Helm chart installed into the live control plane, and the operator run
with nothing but a token of the chart's ServiceAccount: its RBAC is enough
(every example converges, no request is refused) and no more than enough
(kubectl auth can-i, and the API server's audit log against the rules)."""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from kubeloop.api.constants import API_VERSION, LABEL_RETRAIN_OF
from kubeloop.api.times import epoch
from kubeloop.cli.demo import load_examples
from kubeloop.dev.binaries import binary
from kubeloop.paths import repo_root
from kubeloop.dev.platform import build_kubeconfig
from kubeloop.processes import free_port
from kubeloop.operator.permissions import operator_permissions
from tests.support.alerts import post_alert
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e
CHART = Path(__file__).resolve().parents[2] / "charts" / "kubeloop"

# Declared permissions a short run does not exercise, and why they are still needed.
NOT_EXERCISED = {
    ("apps", "deployments", "delete"): "a canary whose rollout failed, or a role the spec dropped",
    ("", "services", "delete"): "a Service the spec no longer wants",
    ("autoscaling", "horizontalpodautoscalers", "delete"): "autoscaling removed from the spec",
    ("kubeloop.dev", "optimizedmodels", "create"): "retraining's OptimizedModel, once a retrained version exists",
    ("", "configmaps", "get"): "a TrainingJob that names its feature store's ConfigMap (tests/e2e/test_byo.py)",
    ("", "configmaps", "create"): "the router's routes, with a router image (tests/e2e/test_real_node.py)",
    ("", "configmaps", "patch"): "the router's routes, with a router image (tests/e2e/test_real_node.py)",
    ("", "configmaps", "delete"): "the router's routes once the router image is unset",
    ("batch", "jobs", "list"): "drift Jobs: a service whose requests the router logs to object storage",
    ("batch", "jobs", "create"): "drift Jobs: a service whose requests the router logs to object storage",
    ("batch", "jobs", "delete"): "drift Jobs: older ones, and all when their service goes",
}


@dataclass
class Release:
    name: str
    namespace: str
    service_account: str
    token: str

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"


def helm(platform, *args: str) -> str:
    result = subprocess.run([str(binary("helm")), f"--kubeconfig={platform.kubeconfig}", *args],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture
def release(platform, kube, kubectl, namespace):
    system = f"{namespace}-system"
    name = f"kl-{namespace}"
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": system}})
    webhook_token = secrets.token_hex(16)
    kube.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "kubeloop-webhook", "namespace": system},
                "stringData": {"token": webhook_token}})
    helm(platform, "install", name, str(CHART), "--namespace", system,
         "--set", f"mlflow.trackingUri={platform.env()['MLFLOW_TRACKING_URI']}",
         "--set", "pipelines.backend=noop", "--set", "webhooks.tokenSecret.name=kubeloop-webhook",
         "--set", f"watchNamespaces={{{namespace}}}")
    yield Release(name, system, f"{name}-kubeloop", webhook_token)
    helm(platform, "uninstall", name, "--namespace", system)
    kube.delete("v1", "Namespace", system)


def test_helm_install_creates_the_operator_and_its_least_privilege_rbac(platform, kube, namespace, release):
    status = json.loads(helm(platform, "status", release.name, "--namespace", release.namespace, "-o", "json"))
    assert status["info"]["status"] == "deployed"
    deployment = kube.get("apps/v1", "Deployment", release.service_account, release.namespace)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == release.service_account
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    role = kube.get("rbac.authorization.k8s.io/v1", "Role", release.service_account, namespace)
    assert role["rules"] == [r.policy() for r in operator_permissions().namespaced]
    # Only the watched namespace gets the namespaced rules.
    assert kube.get("rbac.authorization.k8s.io/v1", "ClusterRole", release.service_account) is None
    fleet = kube.get("rbac.authorization.k8s.io/v1", "ClusterRole", f"{release.service_account}-fleet")
    assert fleet["rules"] == [r.policy() for r in operator_permissions().cluster]


def can_i(kubectl, release: Release, *args: str) -> bool:
    result = kubectl("auth", "can-i", f"--as={release.user}", *args, check=False)
    return result.stdout.strip() == "yes"


def test_kubectl_auth_can_i_shows_the_service_account_is_minimal(kubectl, namespace, release):
    allowed = [("patch", "trainingjobs.kubeloop.dev", "-n", namespace),
               ("create", "trainingjobs.kubeloop.dev", "-n", namespace),
               ("patch", "inferenceservices.kubeloop.dev", "--subresource=status", "-n", namespace),
               ("create", "deployments.apps", "-n", namespace),
               ("list", "nodes"), ("list", "pods", "--all-namespaces")]
    refused = [("*", "*", "--all-namespaces"), ("get", "secrets", "--all-namespaces"),
               ("get", "secrets", "-n", namespace), ("get", "secrets", "-n", release.namespace),
               ("list", "trainingjobs.kubeloop.dev", "-n", "default"),
               ("create", "inferenceservices.kubeloop.dev", "-n", namespace),
               ("create", "clusterrolebindings"), ("create", "rolebindings", "-n", namespace),
               ("create", "pods", "-n", namespace), ("create", "pods/exec", "-n", namespace),
               ("delete", "nodes"), ("patch", "nodes"), ("get", "pods", "-n", namespace),
               ("impersonate", "serviceaccounts", "-n", namespace),
               ("create", "serviceaccounts/token", "-n", release.namespace),
               ("patch", "customresourcedefinitions.apiextensions.k8s.io")]
    # The authorizer reads RBAC from a watch-fed cache, a moment behind helm.
    wait_for(lambda: [a for a in allowed if not can_i(kubectl, release, *a)] == [], timeout=15,
             what="every needed verb allowed")
    assert [r for r in refused if can_i(kubectl, release, *r)] == []


def examples_for(namespace: str, model: str) -> list[dict]:
    docs = load_examples(repo_root() / "examples")
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
        spec = doc["spec"]
        if doc["kind"] == "TrainingJob":
            spec["modelName"] = model
        elif doc["kind"] == "OptimizedModel":
            spec["source"]["name"] = model
        else:
            spec["model"]["name"] = model
            spec["retraining"]["template"]["modelName"] = model
            spec["backend"] = "kubernetes"
            spec["resources"] = {"cpu": "100m", "memory": "128Mi"}
    return docs


def audit_events(platform, user: str, since: float) -> list[dict]:
    events = [json.loads(line) for line in platform.audit_log.read_text().splitlines()]
    return [e for e in events if e["user"]["username"] == user and epoch(e["requestReceivedTimestamp"]) >= since]


def used_permissions(events: list[dict]) -> set[tuple[str, str, str]]:
    """(group, resource[/subresource], verb) of each request; an apply that
    created its object needed create as well as patch."""
    used = set()
    for event in events:
        ref = event.get("objectRef")
        if not ref:
            continue
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        used.add((ref.get("apiGroup", ""), resource, event["verb"]))
        if event["verb"] == "patch" and event.get("responseStatus", {}).get("code") == 201:
            used.add((ref.get("apiGroup", ""), resource, "create"))
    return used


def test_the_operator_with_the_charts_token_reconciles_the_examples(platform, kube, kubectl, namespace, release,
                                                                     tmp_path):
    if not platform.audit_log.exists():
        pytest.skip("this platform was started without audit logging; restart it (`kubeloop dev down && up`)")
    started = time.time() - 1
    token = kubectl("create", "token", release.service_account, "-n", release.namespace,
                    "--duration=1h").stdout.strip()
    config = tmp_path / "chart.kubeconfig"
    server = kube.server
    config.write_text(yaml.safe_dump(build_kubeconfig(server, platform.pki.ca_cert, token, release.service_account)))
    model = f"{namespace}-fraud"
    client = MlflowClient(platform.env()["MLFLOW_TRACKING_URI"])
    client.create_registered_model(model)
    version = client.create_model_version(model, source=f"s3://models/{model}/1")
    client.set_registered_model_alias(model, "champion", version.version)
    token_file = tmp_path / "webhook-token"
    token_file.write_text(release.token)
    port = free_port()
    op = OperatorProcess(config, tmp_path / "operator", {
        "KUBELOOP_REGISTRY": "mlflow", "MLFLOW_TRACKING_URI": platform.env()["MLFLOW_TRACKING_URI"],
        "KUBELOOP_PIPELINE_BACKENDS": "noop", "KUBELOOP_PIPELINE_BACKEND": "noop",
        "KUBELOOP_SERVING_BACKENDS": "kubernetes", "KUBELOOP_SERVING_BACKEND": "kubernetes",
        "KUBELOOP_RESYNC_SECONDS": "2", "KUBELOOP_WORK_DIR": str(tmp_path / "work"),
        "KUBELOOP_WEBHOOK_PORT": str(port), "KUBELOOP_WEBHOOK_TOKEN_FILE": str(token_file),
    }, [namespace])
    try:
        op.start()
        op.wait_for_log("webhooks and /metrics on", timeout=60)
        docs = examples_for(namespace, model)
        for doc in docs:
            kube.create(doc)

        def phase(kind: str, name: str) -> str | None:
            return ((kube.get(API_VERSION, kind, name, namespace) or {}).get("status") or {}).get("phase")

        names = {d["kind"]: d["metadata"]["name"] for d in docs}
        wait_for(lambda: phase("TrainingJob", names["TrainingJob"]) == "Succeeded", timeout=60, what="TrainingJob")
        wait_for(lambda: phase("InferenceService", names["InferenceService"]) == "Ready", timeout=90,
                 what="InferenceService Ready on the fake fleet")
        wait_for(lambda: phase("OptimizedModel", names["OptimizedModel"]) is not None, timeout=60,
                 what="OptimizedModel status")
        # The alert path: the webhook annotates the InferenceService, retraining creates a TrainingJob.
        alert = {"fingerprint": "chart0000000001",
                 "startsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "labels": {"alertname": "KubeloopDataDrift", "namespace": namespace,
                            "inferenceservice": names["InferenceService"]},
                 "annotations": {"share": "0.6"}}
        response = post_alert(f"http://127.0.0.1:{port}/hooks/alertmanager", release.token, alert)
        assert response.status_code == 200, response.text
        wait_for(lambda: kube.list(API_VERSION, "TrainingJob", namespace,
                                   f"{LABEL_RETRAIN_OF}={names['InferenceService']}"),
                 timeout=60, what="the retraining TrainingJob")
        kube.delete(API_VERSION, "InferenceService", names["InferenceService"], namespace)
        wait_for(lambda: kube.get(API_VERSION, "InferenceService", names["InferenceService"], namespace) is None,
                 timeout=30, what="the InferenceService's finalizer released")
    finally:
        op.stop()
    assert "Forbidden" not in op.log(), op.log()[-3000:]  # not "403": a log line's milliseconds can read so

    events = audit_events(platform, release.user, started)
    assert events, "the audit log holds none of the operator's requests"
    refused = [(e["verb"], e.get("objectRef")) for e in events if e.get("responseStatus", {}).get("code") == 403]
    assert refused == []
    declared = {(r.api_group, resource, verb)
                for r in operator_permissions().namespaced + operator_permissions().cluster
                for resource in r.resources for verb in r.verbs}
    used = used_permissions(events)
    assert used <= declared
    unused = declared - used
    assert unused <= set(NOT_EXERCISED), sorted(unused - set(NOT_EXERCISED))
