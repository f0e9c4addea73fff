"""Test namespaces that go when their test ends.

The operator puts a finalizer on kubeloop's objects (its delete handlers); a
namespace deleted after the operator that would run them has stopped waits
for it for ever, and the namespace controller sweeps every resource type of
every such namespace again and again: in one CI run, 46,000 of the API
server's 58,000 requests, for seven namespaces stuck Terminating."""

from __future__ import annotations

import uuid

from kubeloop.api.constants import API_VERSION
from kubeloop.kube import KubeError

KINDS = ("TrainingJob", "OptimizedModel", "InferenceService")


def create_namespace(kube, prefix: str = "t") -> str:  # noqa: ANN001 - kubeloop.kube.Kube
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


def delete_namespace(kube, name: str) -> None:  # noqa: ANN001
    """Delete the namespace, and release the finalizers the (stopped)
    operator left on kubeloop's objects in it, so that it is gone soon."""
    kube.delete("v1", "Namespace", name)
    for kind in KINDS:
        for item in kube.list(API_VERSION, kind, name):
            if not item["metadata"].get("finalizers"):
                continue
            try:
                kube.merge_patch(API_VERSION, kind, item["metadata"]["name"], {"metadata": {"finalizers": None}}, name)
            except KubeError as exc:
                if exc.status != 404:  # gone already: nothing to release
                    raise
