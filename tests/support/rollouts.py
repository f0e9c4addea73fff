"""Waiting for a rollout's end, on either backend."""

from __future__ import annotations

from tests.support.faults import status_of
from tests.support.waiting import wait_for


def rollout_of(kube, namespace: str, name: str, challenger: str, timeout: float) -> dict:  # noqa: ANN001 - a test Kube
    """The service's rollout of `challenger` once it is Promoted or Aborted."""
    def rollout() -> dict:
        return status_of(kube, "InferenceService", namespace, name).get("rollout") or {}

    return wait_for(lambda: (r := rollout()).get("challenger") == challenger
                    and r.get("phase") in ("Promoted", "Aborted") and r,
                    timeout=timeout, interval=1, what=f"the rollout of version {challenger} ending",
                    seen=lambda: repr(rollout()))
