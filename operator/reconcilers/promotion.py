"""Declarative promotion: move an alias to a version once its gates pass,
exactly once, with the verdict recorded in the registry."""

from __future__ import annotations

import json
from dataclasses import asdict

from kubeloop.api.promotion import PromotionPolicy, alias_for
from kubeloop.api.tasks import PRIMARY
from kubeloop.operator.conditions import Observation
from kubeloop.registry.base import ModelRegistry, RegistryUnavailable
from kubeloop.registry.promotion import GateResult, Verdict, check_gates, promote
from kubeloop.registry.tags import TASK

GATE_TAG = "kubeloop.gate.{alias}"
REGISTRY_UNAVAILABLE = "RegistryUnavailable"


def gate(registry: ModelRegistry, model: str, version: str, policy: PromotionPolicy, metric: str | None) -> Verdict:
    """The gates' verdict for a version, computed once and kept on the version
    (so a failed gate is not re-judged, nor re-recorded, on every reconcile)."""
    alias = alias_for(policy.promote_to or "champion")
    candidate = registry.get_version(model, version)
    recorded = candidate.tags.get(GATE_TAG.format(alias=alias))
    if recorded:
        data = json.loads(recorded)
        return Verdict(data["passed"], [GateResult(**r) for r in data["results"]])
    metric = metric or PRIMARY[candidate.tags.get(TASK, "binary")]
    verdict = check_gates(policy.gates, candidate, registry.get_alias(model, alias), metric)
    registry.set_version_tag(model, version, GATE_TAG.format(alias=alias),
                             json.dumps({"passed": verdict.passed, "results": [asdict(r) for r in verdict.results]}))
    return verdict


def promote_when_gated(registry: ModelRegistry, model: str, version: str, policy: PromotionPolicy, by: str,
                       metric: str | None = None) -> Observation:
    """The Promoted condition after moving policy.promote_to to the version
    if its gates pass (and it is not there already); metric is what
    not-worse-than-champion compares (None: the version's task's primary
    metric). Reason
    REGISTRY_UNAVAILABLE when the registry could not be reached."""
    try:
        return _promote_when_gated(registry, model, version, policy, by, metric)
    except RegistryUnavailable as exc:
        return Observation("Promoted", "Unknown", REGISTRY_UNAVAILABLE, str(exc))


def _promote_when_gated(registry: ModelRegistry, model: str, version: str, policy: PromotionPolicy, by: str,
                        metric: str | None) -> Observation:
    alias = alias_for(policy.promote_to)
    current = registry.get_alias(model, alias)
    if current is not None and current.version == version:
        return Observation("Promoted", "True", "Promoted", f"{model} version {version} is {alias}")
    verdict = gate(registry, model, version, policy, metric)
    if not verdict.passed:
        return Observation("Promoted", "False", "GateFailed", verdict.summary())
    promote(registry, model, version, alias, by=by, reason="every promotion gate passed", verdict=verdict)
    return Observation("Promoted", "True", "Promoted", f"{model} version {version} is {alias}: {verdict.summary()}")
