"""What installing a Go-built Kubernetes controller onto the real node takes,
whichever engine it is (KServe, Kubeflow Trainer, JobSet): its Go module's
manifests, an image holding its static binary alone, webhook configurations
that trust the install's own CA, a Pod under the restricted profile, and
waits that say what the controller reported when it is not ready."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Callable

from kubeloop.dev.binaries import ensure
from kubeloop.dev.images import Image, ImageConfig, build_image, image_tag, images_dir
from kubeloop.paths import repo_root
from kubeloop.polling import wait_for

FIELD_MANAGER = "kubeloop-dev"
CERT_DIR = "/tmp/k8s-webhook-server/serving-certs"
WEBHOOK_PORT = 9443
PROBE_PORT = 8081
RESTRICTED = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
              "runAsUser": 65532, "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


@lru_cache(maxsize=None)
def module_dir(module: str, version: str, tools: str) -> Path:
    """A Go module as the proxy serves it (the binary's build fetched it),
    resolved from the tools module that pins it."""
    out = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"],
                         cwd=repo_root() / "tools" / tools, capture_output=True, text=True, check=True,
                         env={**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"})
    return Path(json.loads(out.stdout)["Dir"])


def binary_image(name: str, binary: str, version: str, progress: Callable[[str], None] = lambda _: None) -> Image:
    """An image of one static binary (at /manager), built once per binary."""
    path = ensure(binary, progress)
    tag = image_tag([version.encode(), binary.encode(), str(path.stat().st_mtime_ns).encode()])
    image = Image(name, tag, images_dir() / f"{name}-{tag}.tar")
    if not image.archive.exists():
        def populate(rootfs: Path) -> None:
            (rootfs / "manager").write_bytes(path.read_bytes())
            (rootfs / "manager").chmod(0o755)
            (rootfs / "tmp").mkdir(mode=0o1777, exist_ok=True)
        build_image(image, populate, ImageConfig(entrypoint=["/manager"]))
    return image


def webhooks_to(doc: dict, service: str, namespace: str, ca: bytes, served: Callable[[dict], bool] = lambda _: True
                ) -> dict | None:
    """A webhook configuration from a module's manifests with the hooks
    served kept, each pointed at service and trusting ca; None if none is."""
    hooks = [h for h in doc["webhooks"] if served(h)]
    for hook in hooks:
        hook["clientConfig"]["service"].update(name=service, namespace=namespace)
        hook["clientConfig"]["caBundle"] = base64.b64encode(ca).decode()
    doc["metadata"].pop("creationTimestamp", None)
    return {**doc, "webhooks": hooks} if hooks else None


def tls_secret(name: str, namespace: str, cert: bytes, key: bytes) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace},
            "type": "kubernetes.io/tls",
            "data": {"tls.crt": base64.b64encode(cert).decode(), "tls.key": base64.b64encode(key).decode()}}


def cluster_role_for(role: dict, name: str, account: str, namespace: str) -> list[dict]:
    """A module's ClusterRole under name, bound to the controller's account."""
    role = {**role, "metadata": {"name": name}}
    return [role, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                   "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]}]


def manager_deployment(name: str, namespace: str, image: str, args: list[str], volumes: dict[str, dict],
                       env: list[dict] | None = None) -> dict:
    """The controller's Deployment: one replica (no leader election needed),
    its webhook on WEBHOOK_PORT, ready when its probe port says so; volumes
    maps each mount path to its volume source."""
    labels = {"app.kubernetes.io/name": name}
    mounts = [{"name": f"v{i}", "mountPath": path, "readOnly": True} for i, path in enumerate(volumes)]
    container = {
        "name": "manager", "image": image, "imagePullPolicy": "Never", "args": args, "env": env or [],
        "ports": [{"name": "webhook", "containerPort": WEBHOOK_PORT}],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": PROBE_PORT}, "periodSeconds": 2},
        "resources": {"requests": {"cpu": "100m", "memory": "200Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": RESTRICTED, "volumeMounts": mounts,
    }
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels},
                "spec": {"serviceAccountName": name, "terminationGracePeriodSeconds": 5, "containers": [container],
                         "volumes": [{"name": f"v{i}", **source} for i, source in enumerate(volumes.values())]}}}}


def webhook_service(name: str, namespace: str, manager: str) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": {"app.kubernetes.io/name": manager},
                     "ports": [{"port": 443, "targetPort": "webhook"}]}}


def restricted_namespace(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": name, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}


def wait_established(kube, names: list[str], what: str, error: type[Exception]) -> None:  # noqa: ANN001 - a Kube
    """Every CRD named Established: a manager exits at start when a kind it
    watches is not served yet."""
    wait_for(lambda: all(_established(kube, n) for n in names), 60, f"{what}'s CRDs Established", interval=0.5,
             seen=lambda: f"not established: {[n for n in names if not _established(kube, n)]}", error=error)


def wait_ready(kube, name: str, namespace: str, error: type[Exception], timeout: float = 180) -> None:  # noqa: ANN001
    """The manager's Deployment has a ready Pod; else error with its containers' states."""
    def ready() -> bool:
        deployment = kube.get("apps/v1", "Deployment", name, namespace) or {}
        return deployment.get("status", {}).get("readyReplicas", 0) >= 1

    def states() -> str:
        pods = kube.list("v1", "Pod", namespace, "app.kubernetes.io/name=" + name)
        return str([c.get("state") for p in pods for c in p.get("status", {}).get("containerStatuses", [])] or "no Pod")
    wait_for(ready, timeout, f"{name} Ready", interval=0.5, seen=states, error=error)


def _established(kube, name: str) -> bool:  # noqa: ANN001 - a Kube
    crd = kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name, None) or {}
    return any(c["type"] == "Established" and c["status"] == "True"
               for c in (crd.get("status") or {}).get("conditions") or [])
