"""A pool on the cluster (pure): one Pod holding the pool's front, its
Triton members and the container that fills their shared repository.

The Pod's containers share one process namespace (the front measures each
member's memory by its process, as on one machine) and one model
repository (an emptyDir). The operator writes each pooled service's router
file as a key of one of the pool's routes ConfigMaps, under a field manager
of the service's own (server-side apply: services join and leave one key
each, never writing over another's); the repository container fetches the
versions a file names and only then hands the file to the front
(kubeloop.serving.poolsync). A ConfigMap holds at most 1 MiB, a few
hundred router files of 2 to 3 KiB, so a pool's routes are spread over
ROUTE_SHARDS ConfigMaps by a hash of the service's key, projected into one
folder of the Pod.

Each Pod is a whole pool of its own (the front knows what each member
holds because it loaded it there): `replicas` Pods, rolled one new Pod at a
time before an old one goes. A front sends a request for a model its
members do not hold to the model's owner among the Pods (found through a
headless Service of the pool's ready Pods, kubeloop.front.peers), so a
model is loaded on one Pod, not on every Pod its callers happen to reach. A Pod is Ready once its front serves every route the repository
container found at its start (the front's readiness; a new Pod gets no
request for a service it does not know yet), and each container waits a
few seconds after it is told to stop, so that callers are sent elsewhere
before the front closes, and its members outlive it.
"""

from __future__ import annotations

import hashlib
import json

from kubeloop.api.children import content_hash, dns_name, restricted, with_input_hash
from kubeloop.api.constants import LABEL_MANAGED_BY, LABEL_PART_OF, MANAGER
from kubeloop.serving.base import PoolSize
from kubeloop.serving.builders.workloads import MODEL_REPOSITORY, ROUTER_GRPC_PORT, ROUTER_PORT, GRPC_PORT, ServingImages

LABEL_POOL = "kubeloop.dev/pool"
LABEL_POOL_PART = "kubeloop.dev/pool-part"
LABEL_ROUTES_SHARD = "kubeloop.dev/routes-shard"
ROUTE_SHARDS = 32
"""Routes ConfigMaps a pool spreads its services over: room for about
10,000 router files of 2.5 KiB (5,000 fill the fullest shard to 0.42 MiB of
its 1 MiB), and a service's reconcile reads only its own shard of each pool."""
ROUTES_DIR = "/etc/kubeloop/routes"
CONFIG_DIR = "/etc/kubeloop/pool"
SERVED_DIR = "/var/run/kubeloop/served"
SYNCED_FILE = f"{SERVED_DIR}/.synced"
"""Written by the repository container once its first round has handed the
front every route it could (kubeloop.serving.poolsync)."""
STOP_DELAY_SECONDS = 5
"""How long a stopping pool Pod's front keeps serving: the Pod has left its
Service's endpoints by then (kube-proxy sends new connections elsewhere)."""
MEMBER_STOP_DELAY_SECONDS = STOP_DELAY_SECONDS + 10
"""The members outlive the front by its grace for requests under way: the
other Pods' fronts may still send it requests until their next look at the
headless Service (cluster DNS caches it), and those must not reach members
that are gone."""
WORK_DIR = "/var/run/kubeloop/work"
MEMBER_PORT = 9000
"""Member i listens on MEMBER_PORT + 10 i (HTTP), + 1 (gRPC), + 2 (metrics)."""
POD_IP = "KUBELOOP_POD_IP"
"""The front's own address among its peers (kubeloop.front.poolfront reads it)."""
EMPTY_MEMBER_MIB = 512
"""A member's own memory beside its budget (the server holding no model), in its container's limit."""


def pool_name(pool: str) -> str:
    return dns_name("kubeloop-pool", pool)


def peers_name(pool: str) -> str:
    return dns_name("kubeloop-pool", pool, "peers")


def routes_name(pool: str, shard: int) -> str:
    return dns_name("kubeloop-pool", pool, f"routes-{shard:02d}")


def route_shard(key: str) -> int:
    """The routes ConfigMap that holds a service's key (stable across
    processes, unlike Python's hash)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % ROUTE_SHARDS


def route_manager(service: str) -> str:
    """The field manager that owns one service's key of a routes ConfigMap."""
    return f"kubeloop-pool/{service}"[:128]


def url(pool: str, namespace: str) -> str:
    return f"http://{pool_name(pool)}.{namespace}.svc.cluster.local"


def grpc_address(pool: str, namespace: str) -> str:
    return f"{pool_name(pool)}.{namespace}.svc.cluster.local:{GRPC_PORT}"


def _metadata(pool: str, namespace: str, name: str, part: str) -> dict:
    return {"name": name, "namespace": namespace,
            "labels": {LABEL_MANAGED_BY: MANAGER, LABEL_PART_OF: "kubeloop", LABEL_POOL: pool, LABEL_POOL_PART: part}}


def build_routes(pool: str, namespace: str, key: str, config: dict | None) -> dict:
    """One service's key of its shard of the pool's routes ConfigMaps,
    applied under route_manager (config None: the key as it leaves)."""
    shard = route_shard(key)
    metadata = _metadata(pool, namespace, routes_name(pool, shard), "routes")
    metadata["labels"][LABEL_ROUTES_SHARD] = str(shard)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
            **({"data": {key: json.dumps(config, indent=2, sort_keys=True)}} if config is not None else {})}


def member_names(size: PoolSize) -> list[str]:
    return [f"member-{i}" for i in range(size.members)]


def front_config(pool: str, namespace: str, size: PoolSize) -> dict:
    """The pool front's pool.json: members by port (found among the Pod's
    processes), routes from the folder the repository container fills,
    peers from the headless Service."""
    return {"name": pool, "routes": SERVED_DIR, "synced": SYNCED_FILE, "repository": MODEL_REPOSITORY,
            "estimate_mib": size.estimate_mib,
            "spread_at": size.spread_at, "detailed_metrics": size.detailed_metrics,
            "peers": {"host": f"{peers_name(pool)}.{namespace}.svc.cluster.local", "port": ROUTER_PORT},
            "members": {m: {"url": f"http://127.0.0.1:{MEMBER_PORT + 10 * i}",
                            "grpc": f"127.0.0.1:{MEMBER_PORT + 10 * i + 1}", "budget_mib": size.memory_mib}
                        for i, m in enumerate(member_names(size))}}


def build_pool(pool: str, size: PoolSize, namespace: str, images: ServingImages) -> list[dict]:
    """The pool's config, Deployment, Service and its Pods' headless Service."""
    config = front_config(pool, namespace, size)
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _metadata(pool, namespace, pool_name(pool), "config"),
                  "data": {"pool.json": json.dumps(config, indent=2, sort_keys=True)}}
    labels = {LABEL_POOL: pool, LABEL_POOL_PART: "pod", "app.kubernetes.io/name": "kubeloop-pool"}
    shards = [{"configMap": {"name": routes_name(pool, shard), "optional": True}} for shard in range(ROUTE_SHARDS)]
    volumes = [{"name": "routes", "projected": {"sources": shards}},
               {"name": "config", "configMap": {"name": pool_name(pool)}},
               *({"name": name, "emptyDir": {}} for name in ("models", "served", "work", "tmp")),
               {"name": "shm", "emptyDir": {"medium": "Memory"}}]
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {**_metadata(pool, namespace, pool_name(pool), "pod")},
        "spec": {
            "replicas": size.replicas,
            "selector": {"matchLabels": {LABEL_POOL: pool, LABEL_POOL_PART: "pod"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {"labels": labels, "annotations": {
                    "prometheus.io/scrape": "true", "prometheus.io/port": str(ROUTER_PORT),
                    # A change of members or budgets rolls the pool's Pods:
                    # a new one's members hold nothing, and its front knows it.
                    "kubeloop.dev/pool-hash": content_hash(config)}},
                "spec": {
                    "automountServiceAccountToken": False, "shareProcessNamespace": True,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                                        "fsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [_stopping_late(_front(images)), _stopping_late(_repository(images)),
                                   *(_stopping_late(_member(images, size, i), MEMBER_STOP_DELAY_SECONDS)
                                     for i in range(size.members))],
                    "terminationGracePeriodSeconds": MEMBER_STOP_DELAY_SECONDS + 30,
                    "volumes": volumes,
                },
            },
        },
    }
    service = {"apiVersion": "v1", "kind": "Service", "metadata": _metadata(pool, namespace, pool_name(pool), "service"),
               "spec": {"selector": {LABEL_POOL: pool, LABEL_POOL_PART: "pod"},
                        "ports": [{"name": "http", "port": 80, "targetPort": "http"},
                                  {"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc"}]}}
    # Its name resolves to the ready Pods' own addresses: each front's list of its peers.
    peers = {"apiVersion": "v1", "kind": "Service", "metadata": _metadata(pool, namespace, peers_name(pool), "peers"),
             "spec": {"clusterIP": "None", "selector": {LABEL_POOL: pool, LABEL_POOL_PART: "pod"},
                      "ports": [{"name": "http", "port": ROUTER_PORT, "targetPort": "http"}]}}
    return [config_map, with_input_hash(deployment), service, peers]


def _stopping_late(container: dict, seconds: int = STOP_DELAY_SECONDS) -> dict:
    return {**container, "lifecycle": {"preStop": {"sleep": {"seconds": seconds}}}}


def _front(images: ServingImages) -> dict:
    container = restricted({
        "name": "front", "image": images.router,
        "command": ["python", "-m", "kubeloop.front.poolfront", "--config", f"{CONFIG_DIR}/pool.json",
                    "--port", str(ROUTER_PORT), "--grpc-port", str(ROUTER_GRPC_PORT), "--host", "0.0.0.0"],
        "ports": [{"name": "http", "containerPort": ROUTER_PORT}, {"name": "grpc", "containerPort": ROUTER_GRPC_PORT}],
        "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": "http"}, "periodSeconds": 2},
        "livenessProbe": {"httpGet": {"path": "/v2/health/live", "port": "http"}, "periodSeconds": 10,
                          "failureThreshold": 6, "initialDelaySeconds": 30},
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "env": [{"name": POD_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                *([{"name": name, "value": images.object_store_endpoint}
                   for name in ("AWS_ENDPOINT_URL_S3", "FEAST_S3_ENDPOINT_URL")]
                  if images.object_store_endpoint else [])],
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
                         {"name": "served", "mountPath": SERVED_DIR, "readOnly": True},
                         {"name": "models", "mountPath": MODEL_REPOSITORY, "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"}],
    })
    if images.object_store_secret:
        container["envFrom"] = [{"secretRef": {"name": images.object_store_secret}}]
    return container


def _repository(images: ServingImages) -> dict:
    container = restricted({
        "name": "repository", "image": images.puller,
        "command": ["kubeloop", "serving", "pool-sync", "--routes", ROUTES_DIR, "--served", SERVED_DIR,
                    "--repository", MODEL_REPOSITORY, "--work", WORK_DIR, "--backend", images.triton_backend],
        "env": [{"name": "MLFLOW_TRACKING_URI", "value": images.tracking_uri}],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "volumeMounts": [{"name": "routes", "mountPath": ROUTES_DIR, "readOnly": True},
                         {"name": "served", "mountPath": SERVED_DIR}, {"name": "models", "mountPath": MODEL_REPOSITORY},
                         {"name": "work", "mountPath": WORK_DIR}, {"name": "tmp", "mountPath": "/tmp"}],
    })
    if images.registry_secret:
        container["envFrom"] = [{"secretRef": {"name": images.registry_secret}}]
    return container


def _member(images: ServingImages, size: PoolSize, index: int) -> dict:
    http = MEMBER_PORT + 10 * index
    return restricted({
        "name": f"member-{index}", "image": images.triton,
        "args": ["tritonserver", f"--model-repository={MODEL_REPOSITORY}", "--model-control-mode=explicit",
                 "--strict-readiness=true", "--exit-on-error=false",
                 f"--http-port={http}", f"--grpc-port={http + 1}", f"--metrics-port={http + 2}"],
        "livenessProbe": {"httpGet": {"path": "/v2/health/live", "port": http},
                          "periodSeconds": 10, "failureThreshold": 6, "initialDelaySeconds": 30},
        # The front keeps the models within the budget; the limit is the
        # kernel's backstop above the empty server and the budget.
        "resources": {"requests": {"cpu": "100m", "memory": f"{EMPTY_MEMBER_MIB}Mi"},
                      "limits": {"memory": f"{int(size.memory_mib) + EMPTY_MEMBER_MIB}Mi"}},
        "volumeMounts": [{"name": "models", "mountPath": MODEL_REPOSITORY, "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"}, {"name": "shm", "mountPath": "/dev/shm"}],
    })
