"""KServe on the local platform's real node, installed as on any cluster:
its controller manager (built from KServe's Go module, tools/kserve) runs as
a Pod in the `kserve` namespace; its CRDs, RBAC, webhooks and the
`inferenceservice-config` ConfigMap come from the same module's zip. The
webhooks get a self-signed serving certificate. The manager runs as a Pod
rather than a process here because its webhook server listens on every
address: inside the Pod's network namespace that is the Pod's own address."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from functools import lru_cache
from pathlib import Path

import yaml

from kubeloop.dev.binaries import ensure, versions
from kubeloop.paths import repo_root
from kubeloop.dev.images import Image, ImageConfig, build_image, image_tag, images_dir
from kubeloop.dev.pki import webhook_certificates
from kubeloop.polling import wait_for

NAMESPACE = "kserve"
MANAGER = "kserve-controller-manager"
WEBHOOK_SERVICE = "kserve-webhook-server-service"
CERT_DIR = "/tmp/k8s-webhook-server/serving-certs"
FIELD_MANAGER = "kubeloop-dev"
# The webhooks the v0.20 manager serves (the module's manifests also name the
# LLM and local-model controllers' webhooks, which other binaries serve).
SERVED_PATHS = ("/mutate-pods", "/mutate-serving-kserve-io-v1beta1-inferenceservice",
                "/validate-serving-kserve-io-v1beta1-inferenceservice",
                "/validate-serving-kserve-io-v1alpha1-trainedmodel",
                "/validate-serving-kserve-io-v1alpha1-inferencegraph",
                "/validate-serving-kserve-io-v1alpha1-clusterservingruntime",
                "/validate-serving-kserve-io-v1alpha1-servingruntime")
CRD_FILES = ("serving.kserve.io_*.yaml", "clusterstoragecontainer/serving*.yaml", "localmodel/serving*.yaml")


@lru_cache(maxsize=1)
def module_dir() -> Path:
    """KServe's module as the Go proxy serves it (the manager's build fetched it)."""
    out = subprocess.run(["go", "mod", "download", "-json", f"github.com/kserve/kserve@{versions()['KSERVE_VERSION']}"],
                         cwd=repo_root() / "tools" / "kserve", capture_output=True, text=True, check=True,
                         env={**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"})
    return Path(json.loads(out.stdout)["Dir"])


def manager_image(progress=lambda _: None) -> Image:  # noqa: ANN001 - a progress callback
    """The manager's image: its static binary alone, built once per binary."""
    binary = ensure("manager", progress)
    tag = image_tag([versions()["KSERVE_VERSION"].encode(), str(binary.stat().st_mtime_ns).encode()])
    image = Image("kserve-manager", tag, images_dir() / f"kserve-manager-{tag}.tar")
    if not image.archive.exists():
        def populate(rootfs: Path) -> None:
            (rootfs / "manager").write_bytes(binary.read_bytes())
            (rootfs / "manager").chmod(0o755)
            (rootfs / "tmp").mkdir(mode=0o1777, exist_ok=True)
        build_image(image, populate, ImageConfig(entrypoint=["/manager"]))
    return image


def crds(module: Path) -> list[dict]:
    found = []
    for pattern in CRD_FILES:
        for path in sorted((module / "config" / "crd" / "full").glob(pattern)):
            found += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return found


def inferenceservice_config(module: Path) -> dict:
    """KServe's default configuration, for Standard (raw Deployment) mode
    with no ingress (no Istio or Gateway here): callers reach a predictor
    through its Service, or through kubeloop's front."""
    source = yaml.safe_load((module / "config" / "configmap" / "inferenceservice.yaml").read_text())
    data = {key: value for key, value in source["data"].items() if not key.startswith("_")}
    data["deploy"] = json.dumps({"defaultDeploymentMode": "Standard"})
    ingress = json.loads(data["ingress"])
    data["ingress"] = json.dumps({**ingress, "disableIngressCreation": True, "ingressClassName": ""})
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "inferenceservice-config",
                                                                   "namespace": NAMESPACE}, "data": data}


def webhook_configurations(module: Path, ca: bytes) -> list[dict]:
    """The module's webhook configurations for the webhooks this manager
    serves, pointed at its Service and trusting the install's CA."""
    text = (module / "config" / "webhook" / "manifests.yaml").read_text()
    text = text.replace("$(webhookServiceName)", WEBHOOK_SERVICE).replace("$(kserveNamespace)", NAMESPACE)
    configurations = []
    for doc in (d for d in yaml.safe_load_all(text) if d):
        hooks = [h for h in doc["webhooks"] if h["clientConfig"]["service"]["path"] in SERVED_PATHS]
        for hook in hooks:
            hook["clientConfig"]["caBundle"] = base64.b64encode(ca).decode()
            hook["admissionReviewVersions"] = ["v1", "v1beta1"]
        doc["metadata"].pop("creationTimestamp", None)
        if hooks:
            configurations.append({**doc, "webhooks": hooks})
    return configurations


def manager_objects(module: Path, image: str, cert: bytes, key: bytes) -> list[dict]:
    """The manager's identity, permissions, certificate, Deployment and webhook Service."""
    role = yaml.safe_load((module / "config" / "rbac" / "role.yaml").read_text())
    role["metadata"].pop("creationTimestamp", None)
    labels = {"app.kubernetes.io/name": MANAGER}
    container = {
        "name": "manager", "image": image, "imagePullPolicy": "Never",
        # The metrics endpoint stays inside the Pod; probes need the Pod's address.
        "args": ["--metrics-addr=127.0.0.1:8080", "--health-probe-addr=:8081", "--webhook-port=9443"],
        "env": [{"name": "POD_NAMESPACE", "value": NAMESPACE}],
        "ports": [{"name": "webhook", "containerPort": 9443}],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8081}, "periodSeconds": 2},
        "resources": {"requests": {"cpu": "100m", "memory": "200Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "runAsUser": 65532, "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "volumeMounts": [{"name": "cert", "mountPath": CERT_DIR, "readOnly": True}],
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": MANAGER, "namespace": NAMESPACE}},
        role,
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "kserve-manager-rolebinding"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]},
         "subjects": [{"kind": "ServiceAccount", "name": MANAGER, "namespace": NAMESPACE}]},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "kserve-webhook-server-cert", "namespace": NAMESPACE},
         "type": "kubernetes.io/tls",
         "data": {"tls.crt": base64.b64encode(cert).decode(), "tls.key": base64.b64encode(key).decode()}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": MANAGER, "namespace": NAMESPACE},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
             "metadata": {"labels": labels},
             "spec": {"serviceAccountName": MANAGER, "terminationGracePeriodSeconds": 5,
                      "containers": [container],
                      "volumes": [{"name": "cert", "secret": {"secretName": "kserve-webhook-server-cert"}}]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": WEBHOOK_SERVICE, "namespace": NAMESPACE},
         "spec": {"selector": labels, "ports": [{"port": 443, "targetPort": "webhook"}]}},
    ]


def install(platform, progress=lambda _: None) -> None:  # noqa: ANN001 - a Platform with a real node
    """Install KServe onto the platform's real node and wait until its
    manager answers admission requests (idempotent)."""
    module = module_dir()
    image = manager_image(progress)
    platform.import_image(image)
    ca, cert, key = webhook_certificates(platform.dir / "kserve-pki",
                                         [f"{WEBHOOK_SERVICE}.{NAMESPACE}.svc", f"{WEBHOOK_SERVICE}.{NAMESPACE}"])
    kube = platform.kube()
    try:
        names = [kube.apply(crd, field_manager=FIELD_MANAGER)["metadata"]["name"] for crd in crds(module)]
        # The manager exits at start when a kind it watches is not served yet.
        _poll(lambda: all(_established(kube, name) for name in names), 60, "KServe's CRDs Established",
              lambda: f"not established: {[n for n in names if not _established(kube, n)]}")
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": NAMESPACE, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}},
            field_manager=FIELD_MANAGER)
        for obj in [inferenceservice_config(module), *manager_objects(module, image.ref, cert, key)]:
            kube.apply(obj, field_manager=FIELD_MANAGER)
        progress("waiting for KServe's controller manager")
        _wait_ready(kube)
        for obj in webhook_configurations(module, ca):
            kube.apply(obj, field_manager=FIELD_MANAGER)
    finally:
        kube.close()


class KServeError(RuntimeError):
    """KServe could not be installed; the message says what its manager reported."""


def _poll(done, timeout: float, what: str, why) -> None:  # noqa: ANN001 - callables
    wait_for(done, timeout, what, interval=0.5, seen=why, error=KServeError)


def _established(kube, name: str) -> bool:  # noqa: ANN001 - a Kube
    crd = kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name, None) or {}
    return any(c["type"] == "Established" and c["status"] == "True" for c in (crd.get("status") or {}).get("conditions") or [])


def _wait_ready(kube, timeout: float = 180) -> None:  # noqa: ANN001 - a Kube
    def ready() -> bool:
        deployment = kube.get("apps/v1", "Deployment", MANAGER, NAMESPACE) or {}
        return deployment.get("status", {}).get("readyReplicas", 0) >= 1

    def states() -> str:
        pods = kube.list("v1", "Pod", NAMESPACE, "app.kubernetes.io/name=" + MANAGER)
        return str([c.get("state") for p in pods for c in p.get("status", {}).get("containerStatuses", [])] or "no Pod")
    _poll(ready, timeout, "KServe's manager Ready", states)
