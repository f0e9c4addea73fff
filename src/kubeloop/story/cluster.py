"""The loop's cluster flavour (`kubeloop demo --cluster`): the same hops,
with the InferenceService served the way a cluster serves it. KServe's
controller (on the real node) runs one predictor per version from
kubeloop's Triton image, kubeloop's serving front (the runtime image) splits
and logs requests to the object store, and drift checks run as Jobs that
read that log. Training and optimisation stay on the local pipeline backend
(a Kubeflow run cannot execute here).

The real node has no GPU, so the example InferenceService is served on CPU
with a small request (the node has two cores for every Pod of the story).
Callers on this machine reach a Service through its ready endpoints: the
host routes the Pod network but not Service addresses (kube-proxy's rules
apply only behind the host's routing, and the Service range is blackholed).
"""

from __future__ import annotations

import copy
import sys
from urllib.parse import urlsplit

from kubeloop.dev import kserve
from kubeloop.dev.images import PYTHON_IMAGES, python_image

OBJECT_STORE_SECRET = "kubeloop-object-store"
SERVING_RESOURCES = {"cpu": "250m", "memory": "1Gi"}


def prepare_cluster(platform, namespace: str, progress=lambda _: None) -> dict[str, str]:  # noqa: ANN001
    """KServe and kubeloop's images on the platform's real node, the
    namespace with the object store's credentials (a Secret the routers and
    drift Jobs take by reference); returns the operator's settings for the
    cluster path."""
    kserve.install(platform, progress)
    images = {}
    for name in ("runtime", "triton"):
        progress(f"kubeloop's {name} image")
        images[name] = python_image(PYTHON_IMAGES[name], [sys.executable, "-m", "pip"])
        platform.import_image(images[name])
    env = platform.env()
    kube = platform.kube()
    try:
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        kube.apply({"apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": OBJECT_STORE_SECRET, "namespace": namespace},
                    "stringData": {k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}})
    finally:
        kube.close()
    runtime = images["runtime"].ref
    return {
        "KUBELOOP_SERVING_BACKENDS": "kserve", "KUBELOOP_SERVING_BACKEND": "kserve",
        "KUBELOOP_ROUTER_IMAGE": runtime, "KUBELOOP_COMPONENTS_IMAGE": runtime,
        "KUBELOOP_TRITON_IMAGE": images["triton"].ref, "KUBELOOP_TRITON_BACKEND": "python",
        "KUBELOOP_DRIFT_MONITOR": "kubernetes", "KUBELOOP_OBJECT_STORE_SECRET": OBJECT_STORE_SECRET,
        "KUBELOOP_OBJECT_STORE_ENDPOINT": env["AWS_ENDPOINT_URL_S3"],
    }


def on_the_real_node(docs: list[dict]) -> list[dict]:
    """The story's objects for a CPU-only node (pure): the InferenceService
    without a GPU request, with a small CPU request, and no online features
    (the story's store is a repository folder on this machine, which Pods
    cannot open: its callers send feature vectors)."""
    out = copy.deepcopy(docs)
    for doc in out:
        if doc["kind"] == "InferenceService":
            doc["spec"].pop("gpu", None)
            doc["spec"].pop("features", None)
            doc["spec"]["resources"] = dict(SERVING_RESOURCES)
    return out


class Endpoints:
    """Maps a Service URL (http://<service>.<namespace>.svc...) to one of its
    ready endpoints, as a caller on this machine reaches it."""

    def __init__(self, kube):  # noqa: ANN001 - kubeloop.kube.Kube
        self.kube = kube

    def __call__(self, url: str) -> str | None:
        found = self.address(urlsplit(url).hostname)
        return f"http://{found}" if found else None

    def address(self, host: str, port: str = "http") -> str | None:
        """ip:port of a ready endpoint of the Service named by host
        (<service>.<namespace>..., a port after ":" ignored) for its port of
        that name (http: also an unnamed one)."""
        service, namespace = host.split(":")[0].split(".")[:2]
        names = (port, "") if port == "http" else (port,)
        for endpoint_slice in self.kube.list("discovery.k8s.io/v1", "EndpointSlice", namespace,
                                             f"kubernetes.io/service-name={service}"):
            number = next((p["port"] for p in endpoint_slice.get("ports") or [] if p.get("name") in names), None)
            for endpoint in endpoint_slice.get("endpoints") or []:
                if number and (endpoint.get("conditions") or {}).get("ready"):
                    return f"{endpoint['addresses'][0]}:{number}"
        return None
