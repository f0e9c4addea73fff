"""Identity of a kubeloop object, and the ownerReference that points at it."""

from __future__ import annotations

from dataclasses import dataclass, field

from kubeloop.api.constants import API_VERSION


@dataclass(frozen=True)
class ObjectRef:
    """Which custom object a reconcile is about."""

    kind: str
    namespace: str
    name: str
    uid: str
    generation: int = 0
    annotations: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    """What webhooks recorded on the object (drift alerts, registry events)."""

    @classmethod
    def from_meta(cls, kind: str, meta: dict) -> "ObjectRef":
        return cls(kind, meta["namespace"], meta["name"], meta["uid"], meta.get("generation", 0),
                   dict(meta.get("annotations") or {}))

    def owner_reference(self) -> dict:
        """Makes the owner's deletion garbage-collect the child."""
        return {"apiVersion": API_VERSION, "kind": self.kind, "name": self.name, "uid": self.uid,
                "controller": True, "blockOwnerDeletion": True}

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"
