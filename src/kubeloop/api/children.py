"""Names, labels and ownership shared by every child object."""

from __future__ import annotations

import hashlib
import json

from kubeloop.api.constants import (
    ANNOTATION_INPUT_HASH, LABEL_MANAGED_BY, LABEL_OWNER_KIND, LABEL_OWNER_NAME, LABEL_PART_OF,
    MANAGER,
)
from kubeloop.api.refs import ObjectRef


def owner_labels(ref: ObjectRef) -> dict[str, str]:
    """Labels that find every child of one object (and survive renames of children)."""
    return {
        LABEL_MANAGED_BY: MANAGER,
        LABEL_PART_OF: "kubeloop",
        LABEL_OWNER_KIND: ref.kind.lower(),
        LABEL_OWNER_NAME: ref.name,
    }


def owner_selector(ref: ObjectRef) -> str:
    return ",".join(f"{k}={v}" for k, v in owner_labels(ref).items())


def child_metadata(ref: ObjectRef, name: str, labels: dict[str, str] | None = None,
                   annotations: dict[str, str] | None = None) -> dict:
    meta = {
        "name": name,
        "namespace": ref.namespace,
        "labels": {**owner_labels(ref), **(labels or {})},
        "ownerReferences": [ref.owner_reference()],
    }
    if annotations:
        meta["annotations"] = annotations
    return meta


def content_hash(data: object, length: int = 12) -> str:
    """A stable short hash of JSON-able data (key order does not matter)."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def with_input_hash(obj: dict) -> dict:
    """The object with an annotation hashing its own desired content, so an
    observer can tell whether the live object was built from the same inputs."""
    annotations = obj["metadata"].setdefault("annotations", {})
    annotations[ANNOTATION_INPUT_HASH] = content_hash({k: v for k, v in obj.items() if k != "status"})
    return obj


def dns_name(*parts: str, limit: int = 63) -> str:
    """Join parts into a DNS-1123 label; over-long names keep a hash suffix so
    two long names never collide."""
    name = "-".join(p.strip("-").lower() for p in parts if p)
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: limit - 9].rstrip('-')}-{digest}"


def restricted(container: dict) -> dict:
    """The container under the restricted Pod Security profile: no privilege
    escalation, a read-only root, non-root, no capabilities."""
    container["securityContext"] = {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
        "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
    }
    return container
