"""Promotion through registry aliases: gates, and promotions and rollbacks
recorded in the registry so they can be audited.

Every move of an alias is written twice: on the version (what it was
promoted to, when, by whom, why, and the gate results) and in the registered
model's audit trail, which is also what `rollback` reads to find the version
an alias pointed at before. The trail is append-only: each entry is a model
tag of its own (kubeloop.audit.<time>-<random>), never a read-modify-write of
a shared list, so two promotions at once cannot lose each other's entry.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field

from kubeloop.api.promotion import PromotionGates, alias_for
from kubeloop.api.tasks import LOWER_IS_BETTER, improvement
from kubeloop.api.times import iso
from kubeloop.registry.base import ModelRegistry, ModelVersion
from kubeloop.registry.tags import AUDIT as AUDIT_TAG, AUDIT_PREFIX, CHAMPION_PREFIX, MEETS_SLO, METRIC_PREFIX


@dataclass(frozen=True)
class GateResult:
    gate: str
    passed: bool
    detail: str


@dataclass(frozen=True)
class Verdict:
    passed: bool
    results: list[GateResult] = field(default_factory=list)

    def summary(self) -> str:
        return "; ".join(f"{r.gate}: {'pass' if r.passed else 'FAIL'} ({r.detail})" for r in self.results) or "no gates"


def metrics_of(version: ModelVersion, prefix: str = METRIC_PREFIX) -> dict[str, float]:
    out = {}
    for key, value in version.tags.items():
        if key.startswith(prefix):
            try:
                out[key.removeprefix(prefix)] = float(value)
            except ValueError:
                pass
    return out


def check_gates(gates: PromotionGates, candidate: ModelVersion, champion: ModelVersion | None,
                metric: str = "auc") -> Verdict:
    """Every gate against the candidate's recorded evidence (pure).

    not worse than champion compares the candidate with the champion's score
    on the candidate's own evaluation set (gate.champion.* tags, written by the
    evaluate step), never with numbers from another data set.
    """
    results = []
    metrics = metrics_of(candidate)
    for bound in gates.metrics:
        value = metrics.get(bound.metric)
        ok = value is not None and (bound.min is None or value >= bound.min) and (bound.max is None or value <= bound.max)
        results.append(GateResult(f"{bound.metric} in [{bound.min}, {bound.max}]", ok,
                                  f"{bound.metric}={value:.4f}" if value is not None else "not measured"))
    if gates.not_worse_than_champion:
        if champion is None or champion.version == candidate.version:
            results.append(GateResult("not worse than champion", True, "no champion to compare with"))
        else:
            mine = metrics.get(metric)
            theirs = metrics_of(candidate, CHAMPION_PREFIX).get(metric)
            ok = mine is not None and theirs is not None and improvement(metric, mine, theirs) >= -gates.tolerance
            better = "lower" if metric in LOWER_IS_BETTER else "higher"
            detail = (f"{metric} {mine:.4f} vs champion version {champion.version} {theirs:.4f} on the same data "
                      f"({better} is better)"
                      if mine is not None and theirs is not None else "the champion was not evaluated on this data")
            results.append(GateResult("not worse than champion", ok, detail))
    if gates.require_latency_slo:
        meets = candidate.tags.get(MEETS_SLO)
        results.append(GateResult("latency SLO", meets == "true",
                                  "met" if meets == "true" else "missed" if meets == "false" else "not measured"))
    return Verdict(all(r.passed for r in results), results)


@dataclass(frozen=True)
class AuditEntry:
    at: str
    action: str
    alias: str
    version: str
    previous: str | None
    by: str
    reason: str
    gates: str = ""


def audit_trail(registry: ModelRegistry, name: str) -> list[AuditEntry]:
    """Every entry, oldest first: those of the list tag earlier versions wrote,
    then one per tag (their keys sort by the time they were written)."""
    tags = registry.get_model_tags(name)
    entries = json.loads(tags[AUDIT_TAG]) if AUDIT_TAG in tags else []
    entries += [json.loads(tags[key]) for key in sorted(tags) if key.startswith(AUDIT_PREFIX)]
    return [AuditEntry(**entry) for entry in entries]


def superseded(registry: ModelRegistry, name: str, version: str, alias: str, by: str) -> AuditEntry | None:
    """The recorded move of the alias that came after `by` promoted the
    version to it, if any. A promotion is made once: an object whose version
    was promoted and then replaced (an optimised model promoted over it, a
    rollback) must not take the alias back when it is reconciled again."""
    moves = [e for e in audit_trail(registry, name) if e.alias == alias and e.action in ("promote", "rollback")]
    ours = [i for i, e in enumerate(moves) if e.action == "promote" and e.version == str(version) and e.by == by]
    return moves[-1] if ours and ours[-1] < len(moves) - 1 else None


def _record(registry: ModelRegistry, name: str, entry: AuditEntry) -> None:
    registry.set_model_tag(name, f"{AUDIT_PREFIX}{time.time_ns():020d}-{uuid.uuid4().hex[:8]}", _json(entry))
    _tag_version(registry, name, entry)


def _tag_version(registry: ModelRegistry, name: str, entry: AuditEntry) -> None:
    registry.set_version_tag(name, entry.version, f"kubeloop.{entry.action}.{entry.alias}", _json(entry))


def _json(entry: AuditEntry) -> str:
    return json.dumps(asdict(entry), separators=(",", ":"))


def _now() -> str:
    return iso(time.time())


def promote(registry: ModelRegistry, name: str, version: str, to: str, by: str, reason: str,
            verdict: Verdict | None = None) -> AuditEntry:
    """Move the alias (or a legacy stage's alias) to the version, and record it."""
    alias = alias_for(to)
    previous = registry.get_alias(name, alias)
    if registry.get_version(name, version) is None:
        raise KeyError(f"{name} has no version {version}")
    last = next((e for e in reversed(audit_trail(registry, name))
                 if e.alias == alias and e.action in ("promote", "rollback")), None)
    if last is not None and last.version == str(version):
        if previous is not None and previous.version == str(version):
            return last  # a retried reconcile or a repeated command: recorded once
        if last.action == "promote" and last.by == by:
            # Recorded, then interrupted (registry down, operator killed) before the move.
            _tag_version(registry, name, last)
            registry.set_alias(name, alias, version)
            return last
    # Recorded first, then moved: an interruption between the two leaves an
    # entry the retry completes (above), never a move nobody recorded.
    entry = AuditEntry(_now(), "promote", alias, str(version), previous.version if previous else None, by, reason,
                       verdict.summary() if verdict else "")
    _record(registry, name, entry)
    registry.set_alias(name, alias, version)
    return entry


def reject(registry: ModelRegistry, name: str, version: str, alias: str, by: str, reason: str,
           verdict: Verdict | None = None) -> AuditEntry:
    """Record that a version was not promoted to the alias, and why (once)."""
    recorded = next((e for e in audit_trail(registry, name)
                     if e.action == "reject" and e.alias == alias_for(alias) and e.version == str(version)), None)
    if recorded:
        if f"kubeloop.reject.{recorded.alias}" not in registry.get_version(name, version).tags:
            _tag_version(registry, name, recorded)  # the entry was written, the version's tag not yet
        return recorded
    current = registry.get_alias(name, alias_for(alias))
    entry = AuditEntry(_now(), "reject", alias_for(alias), str(version), current.version if current else None, by,
                       reason, verdict.summary() if verdict else "")
    _record(registry, name, entry)
    return entry


def rollback(registry: ModelRegistry, name: str, alias: str, by: str, reason: str) -> AuditEntry:
    """Point the alias back at the version it pointed at before its last promotion."""
    alias = alias_for(alias)
    current = registry.get_alias(name, alias)
    moves = [e for e in audit_trail(registry, name) if e.alias == alias and e.action in ("promote", "rollback")]
    if current and moves and moves[-1].action == "rollback" and moves[-1].previous == current.version:
        # Recorded, then interrupted before the move (as promote, above): finish
        # that rollback rather than record a second one.
        _tag_version(registry, name, moves[-1])
        registry.set_alias(name, alias, moves[-1].version)
        return moves[-1]
    last = next((e for e in reversed(moves) if e.action == "promote" and current and e.version == current.version),
                None)
    if current is None or last is None or last.previous is None:
        raise LookupError(f"the audit trail of {name} has no earlier version for {alias}")
    entry = AuditEntry(_now(), "rollback", alias, last.previous, current.version, by, reason)
    _record(registry, name, entry)
    registry.set_alias(name, alias, last.previous)
    return entry


