"""The cluster loop's operator: kubeloop's chart installed by helm on the
platform's real node, the operator image in its Pod, configured as a team
would configure it (values, Secrets by reference).

The platform's Alertmanager and MLflow run on this machine, outside the
cluster, and call the operator at 127.0.0.1:<the platform's operator port>.
With the real node that port lies in the API server's static NodePort band,
so the chart's Service (type NodePort) takes it: kube-proxy carries those
calls to whichever Pod the Deployment runs now, also after the Pod is
replaced. Prometheus and MLflow listen on the node's address, where the Pod
reaches them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import requests
import yaml

from kubeloop.dev.binaries import binary
from kubeloop.dev.images import PYTHON_IMAGES, python_image
from kubeloop.dev.platform import PlatformError
from kubeloop.paths import repo_root
from kubeloop.polling import wait_for
from kubeloop.story.cluster import OBJECT_STORE_SECRET

RELEASE = "kubeloop"
WEBHOOK_SECRET = "kubeloop-webhook"
MLFLOW_WEBHOOK_SECRET = "kubeloop-mlflow-webhook"
RESYNC_SECONDS = 3


class ChartError(PlatformError):
    """helm could not install or remove the chart; the message carries its output."""


def operator_values(settings: dict[str, str], platform_env: dict[str, str], namespace: str, image: str) -> dict:
    """The chart's values for the cluster loop (pure): the settings
    prepare_cluster chose, the platform's servers as the Pod reaches them,
    the webhooks' Secrets by name, and the NodePort Alertmanager and MLflow
    call."""
    repository, tag = image.rsplit(":", 1)
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "watchNamespaces": [namespace],
        "resyncSeconds": RESYNC_SECONDS,
        "pipelines": {"backend": "trainer", "trainer": {"image": settings["KUBELOOP_TRAINING_IMAGE"]},
                      "componentsImage": settings["KUBELOOP_COMPONENTS_IMAGE"]},
        "mlflow": {"trackingUri": platform_env["MLFLOW_TRACKING_URI"]},
        "objectStore": {"credentialsSecret": OBJECT_STORE_SECRET,
                        "endpoint": settings["KUBELOOP_OBJECT_STORE_ENDPOINT"],
                        "requestLogUrl": platform_env["KUBELOOP_REQUEST_LOG"]},
        "serving": {"backend": "kserve", "tritonImage": settings["KUBELOOP_TRITON_IMAGE"],
                    "tritonBackend": settings["KUBELOOP_TRITON_BACKEND"],
                    "routerImage": settings["KUBELOOP_ROUTER_IMAGE"]},
        "webhooks": {"tokenSecret": {"name": WEBHOOK_SECRET},
                     "mlflowWebhookUrl": platform_env["KUBELOOP_MLFLOW_WEBHOOK_URL"],
                     "mlflowSecret": {"name": MLFLOW_WEBHOOK_SECRET}},
        "metrics": {"prometheusUrl": platform_env["PROMETHEUS_URL"]},
        "service": {"type": "NodePort", "nodePort": int(platform_env["KUBELOOP_WEBHOOK_PORT"])},
        "jobResources": json.loads(settings["KUBELOOP_JOB_RESOURCES"]),
    }


@dataclass
class ChartOperator:
    """The chart's release in namespace on a platform with a real node."""

    platform: object
    """kubeloop.dev.platform.Platform"""
    namespace: str

    def install(self, settings: dict[str, str], progress=lambda _: None) -> str:  # noqa: ANN001
        """Build and import the operator image, create the webhooks' Secrets
        from the platform's, and `helm upgrade --install` the chart; the
        image's reference."""
        progress("kubeloop's operator image")
        image = python_image(PYTHON_IMAGES["operator"], [sys.executable, "-m", "pip"])
        self.platform.import_image(image)
        env = self.platform.env()
        secrets = {WEBHOOK_SECRET: ("token", env["KUBELOOP_WEBHOOK_TOKEN_FILE"]),
                   MLFLOW_WEBHOOK_SECRET: ("secret", env["KUBELOOP_MLFLOW_WEBHOOK_SECRET_FILE"])}
        kube = self.platform.kube()
        try:
            for name, (key, path) in secrets.items():
                kube.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": self.namespace},
                            "stringData": {key: Path(path).read_text()}})
        finally:
            kube.close()
        values = self.platform.dir / f"operator-values-{self.namespace}.yaml"
        values.write_text(yaml.safe_dump(operator_values(settings, env, self.namespace, image.ref), sort_keys=False))
        progress("helm upgrade --install of kubeloop's chart")
        self._helm("upgrade", "--install", RELEASE, str(repo_root() / "charts" / "kubeloop"), "-f", str(values))
        return image.ref

    def uninstall(self) -> None:
        self._helm("uninstall", RELEASE, "--ignore-not-found")

    def pod(self) -> dict | None:
        """The operator's Pod that is Ready now, if one is."""
        kube = self.platform.kube()
        try:
            pods = kube.list("v1", "Pod", self.namespace, f"app.kubernetes.io/instance={RELEASE}")
        finally:
            kube.close()
        return next((p for p in pods if p["metadata"].get("deletionTimestamp") is None and any(
            c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions", []))), None)

    def answering(self) -> dict | None:
        """The Ready Pod, once the webhooks answer through the NodePort where
        Alertmanager and MLflow call them."""
        found = self.pod()
        if not found:
            return None
        try:
            url = f"http://127.0.0.1:{self.platform.env()['KUBELOOP_WEBHOOK_PORT']}/healthz"
            return found if requests.get(url, timeout=2).status_code == 200 else None
        except requests.RequestException:
            return None

    def wait_answering(self, timeout: float = 180) -> dict:
        """The Ready Pod once its webhooks answer through the NodePort;
        ChartError with the Pods' states and the operator's log after timeout."""
        return wait_for(self.answering, timeout, "the operator's Pod answering through its NodePort", interval=1,
                        seen=self.seen, error=ChartError)

    def seen(self) -> str:
        kube = self.platform.kube()
        try:
            pods = kube.list("v1", "Pod", self.namespace, f"app.kubernetes.io/instance={RELEASE}")
        finally:
            kube.close()
        states = [(p["metadata"]["name"], (p.get("status") or {}).get("phase"),
                   (p.get("status") or {}).get("containerStatuses")) for p in pods]
        return f"{states}\n{self.log()}"

    def log(self, tail: int = 40) -> str:
        """The operator container's last lines (kubectl logs of the Deployment's Pod)."""
        result = subprocess.run([str(binary("kubectl")), f"--kubeconfig={self.platform.kubeconfig}", "logs", "-n",
                                 self.namespace, f"deployment/{RELEASE}", f"--tail={tail}"],
                                capture_output=True, text=True, timeout=30)
        return result.stdout + result.stderr

    def _helm(self, *args: str) -> None:
        result = subprocess.run([str(binary("helm")), f"--kubeconfig={self.platform.kubeconfig}", *args,
                                 "--namespace", self.namespace], capture_output=True, text=True, timeout=180)
        if result.returncode != 0:
            raise ChartError(f"helm {args[0]} failed: {result.stderr.strip() or result.stdout.strip()}")
