"""Run-to-completion Jobs the operator starts on a cluster (drift checks,
materialisation): one restricted Pod that runs one command on a kubeloop
image, reaches object storage through a Secret by reference only, and
leaves its result as its termination message. Pure: building the Job and
reading what it left; the operator's modules create and poll them through
kubeloop.kube."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, StrictFloat, StrictInt, StrictStr

TERMINATION_LOG = "/dev/termination-log"
SUMMARY_BYTES = 4096
"""The kubelet keeps at most this much of a termination message."""
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                "seccompProfile": {"type": "RuntimeDefault"}}


QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")


def _quantity(value: int | float | str) -> int | float | str:
    if QUANTITY.match(value) if isinstance(value, str) else value >= 0:
        return value
    raise ValueError("not a Kubernetes quantity: write it as 500m, 1Gi or 2")


Quantity = Annotated[StrictInt | StrictFloat | StrictStr, AfterValidator(_quantity)]
"""A Kubernetes quantity as a container's resources write it (500m, 1Gi, 2,
0.5), kept as written."""


class Resources(BaseModel):
    """A container's requests and limits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requests: dict[str, Quantity] = {}
    limits: dict[str, Quantity] = {}

    def container(self) -> dict:
        """As a container's `resources`."""
        return {k: dict(v) for k, v in (("requests", self.requests), ("limits", self.limits)) if v}


class JobResources(BaseModel):
    """What the Pods of the operator's own Jobs ask of a node, by purpose; a
    purpose given replaces its defaults whole, as a container's resources do."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    monitoring: Resources = Resources(requests={"cpu": "500m", "memory": "1Gi"}, limits={"memory": "4Gi"})
    """Each drift or outcome check (Evidently over the request log)."""
    materialize: Resources = Resources(requests={"cpu": "250m", "memory": "512Mi"}, limits={"memory": "2Gi"})
    """Each materialisation of an online store (Feast)."""


def object_store_access(container: dict, secret: str | None, endpoint: str | None) -> dict:
    """The container reaches object storage: the endpoint for boto3
    (AWS_ENDPOINT_URL_S3) and for Feast's S3 registry, which reads a variable
    of its own (FEAST_S3_ENDPOINT_URL); the credentials from the Secret by
    reference (envFrom), never their values."""
    if endpoint:
        container.setdefault("env", []).extend(
            {"name": name, "value": endpoint} for name in ("AWS_ENDPOINT_URL_S3", "FEAST_S3_ENDPOINT_URL"))
    if secret:
        container["envFrom"] = [{"secretRef": {"name": secret}}]
    return container


CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
MLFLOW_KEYS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")
"""What a Secret for MLflow may hold (the optional keys of KUBELOOP_MLFLOW_SECRET)."""


def object_store_env(secret: str | None, endpoint: str | None) -> list[dict]:
    """The same access as environment variables alone, for a container that
    takes no envFrom (a TrainJob's trainer): each credential by reference to
    its key in the Secret."""
    env = [{"name": "AWS_ENDPOINT_URL_S3", "value": endpoint}] if endpoint else []
    if secret:
        env += [{"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}} for key in CREDENTIALS]
    return env


def task_job(metadata: dict, pod_labels: dict[str, str], container: dict, *, deadline: int, ttl: int,
             backoff_limit: int, volumes: list[dict]) -> dict:
    """A Job of one restricted Pod that runs the container once (restarted
    by the Job at most backoff_limit times), killed after deadline seconds,
    gone ttl seconds after it finished; no ServiceAccount token in the Pod."""
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": backoff_limit,
            "activeDeadlineSeconds": deadline,
            "ttlSecondsAfterFinished": ttl,
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "securityContext": dict(POD_SECURITY),
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }


def finished(job: dict) -> bool:
    return any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
               for c in job.get("status", {}).get("conditions", []))


def failure(job: dict) -> str | None:
    """Why the Job failed ("reason: message"), None unless it did."""
    failed = next((c for c in job.get("status", {}).get("conditions", [])
                   if c.get("type") == "Failed" and c.get("status") == "True"), None)
    return f"{failed.get('reason')}: {failed.get('message', '')}" if failed else None


def termination_message(pods: list[dict]) -> str | None:
    """What the Job's Pods left as their termination message: the latest
    that left one (a retried Pod's own, rather than its failed
    predecessor's); None when none did (killed, evicted, still running)."""
    messages = []
    for pod in pods:
        for status in pod.get("status", {}).get("containerStatuses", []):
            terminated = status.get("state", {}).get("terminated") or {}
            if terminated.get("message"):
                messages.append((terminated.get("finishedAt") or "", terminated["message"]))
    return max(messages)[1] if messages else None
