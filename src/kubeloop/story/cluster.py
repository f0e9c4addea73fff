"""The loop's cluster flavour (`kubeloop demo --cluster`): the same hops,
with nothing of the loop in the operator's process. The story's feature store
is published (registry and sources in the object store, online store in
Redis on the node's address; feature_store.yaml in the ConfigMap
feast-client), so Pods open it. Each TrainingJob becomes a Kubeflow Trainer
TrainJob whose dataset initializer joins the features and whose node Pods
train; each OptimizedModel a Job; the online store is materialised by Jobs;
KServe's controller (on the real node) runs one predictor per version from
kubeloop's Triton image, kubeloop's serving front (the runtime image) reads
the callers' features online, splits and logs requests to the object store,
and drift checks run as Jobs that read that log.

The real node has no GPU, so the example InferenceService is served on CPU
with a small request (the node has two cores for every Pod of the story).
Callers on this machine reach a Service through its ready endpoints: the
host routes the Pod network but not Service addresses (kube-proxy's rules
apply only behind the host's routing, and the Service range is blackholed).
"""

from __future__ import annotations

import copy
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from kubeloop.dev import kserve, trainer
from kubeloop.dev.images import PYTHON_IMAGES, python_image
from kubeloop.dev.objectstore import FEAST_BUCKET

OBJECT_STORE_SECRET = "kubeloop-object-store"
STORE_CONFIG_MAP = "feast-client"
STORY_REDIS_DB = 1
SERVING_RESOURCES = {"cpu": "250m", "memory": "1Gi"}
# The node's two cores, as requested while a retrain runs (measured): the
# three controllers' Pods (0.3), the operator (0.1), the front (0.1), the
# champion (0.25) and the retrain's two nodes (0.5 each) leave 0.25 for the
# drift checks and materialisations that run every 30 s. At their defaults
# (0.5 and 0.25) the second node Pod could not be scheduled while a check ran.
TRAINING = {"distributed": {"nodes": 2}, "resources": {"cpu": "500m", "memory": "1536Mi"}}
JOB_RESOURCES = {"monitoring": {"requests": {"cpu": "100m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
                 "materialize": {"requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}}
CLIENT_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL_S3",
               "FEAST_S3_ENDPOINT_URL")


@dataclass(frozen=True)
class ClusterPath:
    settings: dict[str, str]
    """The operator's settings for the cluster path."""
    repo: Path
    """The story's working copy of the published store."""
    sources: str
    """Where the published sources live (s3://); upload the working copy's there after changing it."""


def client_env(platform_env: dict[str, str]) -> dict[str, str]:
    """What a client of the published store on this machine needs in its
    environment (the object store's endpoint and credentials)."""
    return {k: platform_env[k] for k in CLIENT_KEYS}


def prepare_cluster(platform, namespace: str, folder: Path, progress=lambda _: None) -> ClusterPath:  # noqa: ANN001
    """KServe, Kubeflow Trainer and kubeloop's images on the platform's real
    node; the namespace with the object store's credentials (a Secret that
    routers, Jobs and training Pods take by reference) and the published
    store's client ConfigMap; the store's working copy in folder. This
    process must hold client_env() in its environment."""
    from kubeloop.featurestore.generate import Scenario, default_start
    from kubeloop.featurestore.publish import publish_sources
    from kubeloop.featurestore.store import create_repository

    kserve.install(platform, progress)
    images = {}
    for name in ("runtime", "triton", "training"):
        progress(f"kubeloop's {name} image")
        images[name] = python_image(PYTHON_IMAGES[name], [sys.executable, "-m", "pip"])
        platform.import_image(images[name])
    progress("Kubeflow Trainer and JobSet")
    trainer.install(platform, images["training"].ref, progress)
    env = platform.env()
    progress("the published feature store")
    # A Redis database of its own: another store of the example's project in the platform's Redis (a
    # test's) writes the same keys, and Feast keeps whichever event is newest.
    repo = create_repository(folder, Scenario(start=default_start(45), days=45),
                             redis_address=f"{platform.start_redis()},db={STORY_REDIS_DB}",
                             registry=f"s3://{FEAST_BUCKET}/{namespace}/registry.db")
    sources = f"s3://{FEAST_BUCKET}/{namespace}/data"
    publish_sources(repo, sources, env["AWS_ENDPOINT_URL_S3"])
    kube = platform.kube()
    try:
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        kube.apply({"apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": OBJECT_STORE_SECRET, "namespace": namespace},
                    "stringData": {k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}})
        kube.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": STORE_CONFIG_MAP, "namespace": namespace},
                    "data": {"feature_store.yaml": (repo / "feature_store.yaml").read_text()}})
    finally:
        kube.close()
    runtime = images["runtime"].ref
    return ClusterPath({
        "KUBELOOP_PIPELINE_BACKENDS": "trainer", "KUBELOOP_PIPELINE_BACKEND": "trainer",
        "KUBELOOP_TRAINING_IMAGE": images["training"].ref,
        "KUBELOOP_SERVING_BACKENDS": "kserve", "KUBELOOP_SERVING_BACKEND": "kserve",
        "KUBELOOP_ROUTER_IMAGE": runtime, "KUBELOOP_COMPONENTS_IMAGE": runtime,
        "KUBELOOP_TRITON_IMAGE": images["triton"].ref, "KUBELOOP_TRITON_BACKEND": "python",
        "KUBELOOP_DRIFT_MONITOR": "kubernetes", "KUBELOOP_MATERIALIZER": "kubernetes",
        # The materialisation Jobs run in the operator's namespace, beside the Secret they take.
        "KUBELOOP_OPERATOR_NAMESPACE": namespace,
        "KUBELOOP_OBJECT_STORE_SECRET": OBJECT_STORE_SECRET,
        "KUBELOOP_OBJECT_STORE_ENDPOINT": env["AWS_ENDPOINT_URL_S3"],
        "KUBELOOP_JOB_RESOURCES": json.dumps(JOB_RESOURCES),
        **client_env(env),
    }, repo, sources)


def on_the_real_node(docs: list[dict]) -> list[dict]:
    """The story's objects for a CPU-only node with the published store
    (pure): training, the retrain's too, reads the store from its ConfigMap
    on two nodes; the InferenceService has no GPU request and a small CPU
    one."""
    store = {"configMap": {"name": STORE_CONFIG_MAP}}
    out = copy.deepcopy(docs)
    for doc in out:
        spec = doc["spec"]
        if doc["kind"] == "TrainingJob":
            spec["features"]["store"] = store
            spec.update(copy.deepcopy(TRAINING))
        if doc["kind"] == "InferenceService":
            spec.pop("gpu", None)
            spec["resources"] = dict(SERVING_RESOURCES)
            template = spec.get("retraining", {}).get("template")
            if template:
                template["features"]["store"] = store
                template.update(copy.deepcopy(TRAINING))
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
