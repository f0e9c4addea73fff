"""KServe on the local platform's real node, installed as on any cluster:
its controller manager (built from KServe's Go module, tools/kserve) runs as
a Pod in the `kserve` namespace; its CRDs, RBAC, webhooks and the
`inferenceservice-config` ConfigMap come from the same module's zip. The
webhooks get a self-signed serving certificate. The manager runs as a Pod
rather than a process here because its webhook server listens on every
address: inside the Pod's network namespace that is the Pod's own address."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from kubeloop.dev import controllers
from kubeloop.dev.binaries import versions
from kubeloop.dev.controllers import CERT_DIR, FIELD_MANAGER, PROBE_PORT, WEBHOOK_PORT
from kubeloop.dev.images import Image
from kubeloop.dev.pki import webhook_certificates

NAMESPACE = "kserve"
MANAGER = "kserve-controller-manager"
WEBHOOK_SERVICE = "kserve-webhook-server-service"
# The webhooks the v0.20 manager serves (the module's manifests also name the
# LLM and local-model controllers' webhooks, which other binaries serve).
SERVED_PATHS = ("/mutate-pods", "/mutate-serving-kserve-io-v1beta1-inferenceservice",
                "/validate-serving-kserve-io-v1beta1-inferenceservice",
                "/validate-serving-kserve-io-v1alpha1-trainedmodel",
                "/validate-serving-kserve-io-v1alpha1-inferencegraph",
                "/validate-serving-kserve-io-v1alpha1-clusterservingruntime",
                "/validate-serving-kserve-io-v1alpha1-servingruntime")
CRD_FILES = ("serving.kserve.io_*.yaml", "clusterstoragecontainer/serving*.yaml", "localmodel/serving*.yaml")


def module_dir() -> Path:
    return controllers.module_dir("github.com/kserve/kserve", versions()["KSERVE_VERSION"], "kserve")


def manager_image(progress=lambda _: None) -> Image:  # noqa: ANN001 - a progress callback
    return controllers.binary_image("kserve-manager", "manager", versions()["KSERVE_VERSION"], progress)


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
    # webhooks_to fills in the Service the manifests leave as kustomize variables.
    text = (module / "config" / "webhook" / "manifests.yaml").read_text()
    found = [controllers.webhooks_to(doc, WEBHOOK_SERVICE, NAMESPACE, ca,
                                     lambda hook: hook["clientConfig"]["service"]["path"] in SERVED_PATHS)
             for doc in yaml.safe_load_all(text) if doc]
    for doc in filter(None, found):
        for hook in doc["webhooks"]:
            hook["admissionReviewVersions"] = ["v1", "v1beta1"]
    return [doc for doc in found if doc]


def manager_objects(module: Path, image: str, cert: bytes, key: bytes) -> list[dict]:
    """The manager's identity, permissions, certificate, Deployment and webhook Service."""
    role = yaml.safe_load((module / "config" / "rbac" / "role.yaml").read_text())
    # The metrics endpoint stays inside the Pod; probes need the Pod's address.
    args = ["--metrics-addr=127.0.0.1:8080", f"--health-probe-addr=:{PROBE_PORT}", f"--webhook-port={WEBHOOK_PORT}"]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": MANAGER, "namespace": NAMESPACE}},
        *controllers.cluster_role_for(role, role["metadata"]["name"], MANAGER, NAMESPACE),
        controllers.tls_secret("kserve-webhook-server-cert", NAMESPACE, cert, key),
        controllers.manager_deployment(MANAGER, NAMESPACE, image, args,
                                       {CERT_DIR: {"secret": {"secretName": "kserve-webhook-server-cert"}}},
                                       env=[{"name": "POD_NAMESPACE", "value": NAMESPACE}]),
        controllers.webhook_service(WEBHOOK_SERVICE, NAMESPACE, MANAGER),
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
        controllers.wait_established(kube, names, "KServe", KServeError)
        kube.apply(controllers.restricted_namespace(NAMESPACE), field_manager=FIELD_MANAGER)
        for obj in [inferenceservice_config(module), *manager_objects(module, image.ref, cert, key)]:
            kube.apply(obj, field_manager=FIELD_MANAGER)
        progress("waiting for KServe's controller manager")
        controllers.wait_ready(kube, MANAGER, NAMESPACE, KServeError)
        for obj in webhook_configurations(module, ca):
            kube.apply(obj, field_manager=FIELD_MANAGER)
    finally:
        kube.close()


class KServeError(RuntimeError):
    """KServe could not be installed; the message says what its manager reported."""
