"""Gates, promotion and rollback through the registry port, with an audit trail."""

from __future__ import annotations

import re
import pytest

from kubeloop.api.promotion import MetricGate, PromotionGates, PromotionPolicy
from kubeloop.api.refs import ObjectRef
from kubeloop.api.training import TrainingJobStatus
from kubeloop.operator.reconcilers.common import Event
from kubeloop.operator.reconcilers.promotion import promote_when_gated, record_run
from kubeloop.pipelines.backends.base import RunStatus
from kubeloop.registry.base import RegistryUnavailable
from kubeloop.registry.memory import InMemoryRegistry
from kubeloop.registry.promotion import audit_trail, check_gates, promote, rollback


@pytest.fixture
def registry():
    reg = InMemoryRegistry()
    reg.add_version("fraud", "s3://1", tags={"metric.auc": "0.850"})
    reg.add_version("fraud", "s3://2", tags={"metric.auc": "0.870", "gate.champion.auc": "0.860",
                                             "gate.champion.version": "1", "kubeloop.meets_slo": "true"})
    reg.add_version("fraud", "s3://3", tags={"metric.auc": "0.840", "gate.champion.auc": "0.860"})
    reg.set_alias("fraud", "champion", "1")
    return reg


def test_gates_read_the_versions_evidence(registry):
    gates = PromotionGates(metrics=[MetricGate(metric="auc", min=0.8)], require_latency_slo=True)
    good = check_gates(gates, registry.get_version("fraud", "2"), registry.get_alias("fraud", "champion"))
    assert good.passed and "0.8700 vs champion version 1 0.8600 on the same data" in good.summary()
    bad = check_gates(gates, registry.get_version("fraud", "3"), registry.get_alias("fraud", "champion"))
    assert not bad.passed
    assert [r.gate for r in bad.results if not r.passed] == ["not worse than champion", "latency SLO"]


def test_without_the_champion_gate_a_worse_version_passes_on_its_bounds(registry):
    gates = PromotionGates.model_validate({"notWorseThanChampion": False, "metrics": [{"metric": "auc", "min": 0.8}]})
    verdict = check_gates(gates, registry.get_version("fraud", "3"), registry.get_alias("fraud", "champion"))
    assert verdict.passed and [r.gate for r in verdict.results] == ["auc in [0.8, None]"]


def test_tolerance_allows_a_small_regression(registry):
    gates = PromotionGates(tolerance=0.05)
    assert check_gates(gates, registry.get_version("fraud", "3"), registry.get_alias("fraud", "champion")).passed


def test_promotion_and_rollback_are_audited(registry):
    promote(registry, "fraud", "2", "Production", by="alice", reason="better")
    assert registry.get_alias("fraud", "champion").version == "2"
    entry = rollback(registry, "fraud", "champion", by="bob", reason="incident")
    assert (entry.version, entry.previous) == ("1", "2")
    assert registry.get_alias("fraud", "champion").version == "1"
    trail = audit_trail(registry, "fraud")
    assert [(e.action, e.by, e.alias, e.version) for e in trail] == [
        ("promote", "alice", "champion", "2"), ("rollback", "bob", "champion", "1")]
    # One UTC spelling in audit entries and statuses alike (RFC 3339, Z).
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", e.at) for e in trail), [e.at for e in trail]
    assert "kubeloop.promote.champion" in registry.get_version("fraud", "2").tags
    with pytest.raises(LookupError):
        rollback(registry, "fraud", "champion", by="bob", reason="again")


def test_declarative_promotion_happens_once_and_a_failed_gate_sticks(registry):
    policy = PromotionPolicy(promote_to="champion", gates=PromotionGates())
    obs = promote_when_gated(registry, "fraud", "2", policy, by="TrainingJob ml/fraud")
    assert (obs.status, obs.reason) == ("True", "Promoted")
    again = promote_when_gated(registry, "fraud", "2", policy, by="TrainingJob ml/fraud")
    assert again.status == "True" and len(audit_trail(registry, "fraud")) == 1
    failed = promote_when_gated(registry, "fraud", "3", policy, by="TrainingJob ml/other")
    assert (failed.status, failed.reason) == ("False", "GateFailed")
    assert registry.get_alias("fraud", "champion").version == "2", "a failed gate leaves the champion"
    assert "kubeloop.gate.champion" in registry.get_version("fraud", "3").tags


def test_a_promotion_replaced_since_is_not_made_again(registry):
    """A Succeeded TrainingJob resumed after an OptimizedModel promoted its
    optimised version (the e2e kill test found the champion moved back), or
    after a rollback: its promotion happened once and stays done."""
    policy = PromotionPolicy(promote_to="champion", gates=PromotionGates())
    promote_when_gated(registry, "fraud", "2", policy, by="TrainingJob ml/fraud")
    promote(registry, "fraud", "3", "champion", by="OptimizedModel ml/fraud-cpu", reason="gates passed")
    again = promote_when_gated(registry, "fraud", "2", policy, by="TrainingJob ml/fraud")
    assert again.status == "True" and "since moved it to version 3" in again.message
    assert registry.get_alias("fraud", "champion").version == "3"
    rollback(registry, "fraud", "champion", by="someone", reason="by hand")
    assert promote_when_gated(registry, "fraud", "3", policy, by="OptimizedModel ml/fraud-cpu").status == "True"
    assert registry.get_alias("fraud", "champion").version == "2"


def test_a_repeated_promotion_or_rejection_is_recorded_once(registry):
    """A reconcile that runs again on a status from before its own write
    repeats the call; the trail (which rollback reads) must not."""
    from kubeloop.registry.promotion import reject

    first = promote(registry, "fraud", "2", "champion", by="op", reason="canary healthy")
    assert promote(registry, "fraud", "2", "champion", by="op", reason="canary healthy") == first
    reject(registry, "fraud", "3", "champion", by="op", reason="gates failed")
    reject(registry, "fraud", "3", "champion", by="op", reason="gates failed")
    assert [(e.action, e.version, e.previous) for e in audit_trail(registry, "fraud")] == [
        ("promote", "2", "1"), ("reject", "3", "2")]
    assert rollback(registry, "fraud", "champion", by="op", reason="incident").version == "1"


class Interleaving(InMemoryRegistry):
    """Two promotions that read the registry before either writes (as two
    operators, or an operator and a person, can)."""

    def __init__(self):
        super().__init__()
        self.barrier = None

    def get_model_tags(self, name):  # noqa: ANN001
        tags = super().get_model_tags(name)
        if self.barrier is not None:
            self.barrier.wait()
        return tags


def test_two_promotions_at_once_both_stay_in_the_trail():
    """Local and cluster (the registry port): a read-modify-write of one audit tag lost an entry."""
    import threading

    registry = Interleaving()
    for i in (1, 2, 3):
        registry.add_version("fraud", f"s3://{i}")
    registry.barrier = threading.Barrier(2, timeout=10)
    threads = [threading.Thread(target=promote, args=(registry, "fraud", v, alias), kwargs={"by": by, "reason": "r"})
               for v, alias, by in (("2", "champion", "alice"), ("3", "challenger", "bob"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    registry.barrier = None
    assert sorted((e.by, e.alias, e.version) for e in audit_trail(registry, "fraud")) == [
        ("alice", "champion", "2"), ("bob", "challenger", "3")]


class FailingWrite(InMemoryRegistry):
    """A registry that goes away at the fail_at-th write of a promotion or
    rollback (counted once `writes` is set)."""

    def __init__(self, fail_at: int = 2):
        super().__init__()
        self.writes = None
        self.fail_at = fail_at

    def _write(self) -> None:
        if self.writes is not None:
            self.writes += 1
            if self.writes == self.fail_at:
                from kubeloop.registry.base import RegistryUnavailable

                raise RegistryUnavailable("MLflow went away")

    def set_alias(self, name, alias, version):  # noqa: ANN001
        self._write()
        super().set_alias(name, alias, version)

    def set_model_tag(self, name, key, value):  # noqa: ANN001
        self._write()
        super().set_model_tag(name, key, value)

    def set_version_tag(self, name, version, key, value):  # noqa: ANN001
        self._write()
        super().set_version_tag(name, version, key, value)


def test_a_promotion_interrupted_between_its_writes_is_recorded_once():
    """Local and cluster: the retry finishes the move without a second entry or a wrong 'previous'."""
    from kubeloop.registry.base import RegistryUnavailable

    registry = FailingWrite()
    registry.add_version("fraud", "s3://1")
    registry.add_version("fraud", "s3://2")
    registry.set_alias("fraud", "champion", "1")
    registry.writes = 0
    with pytest.raises(RegistryUnavailable):
        promote(registry, "fraud", "2", "champion", by="op", reason="r")
    entry = promote(registry, "fraud", "2", "champion", by="op", reason="r")
    assert registry.get_alias("fraud", "champion").version == "2"
    assert [(e.action, e.version, e.previous) for e in audit_trail(registry, "fraud")] == [("promote", "2", "1")]
    assert entry.previous == "1"


@pytest.mark.parametrize("fail_at", [2, 3], ids=["before-the-version-tag", "before-the-move"])
def test_a_rollback_interrupted_between_its_writes_is_recorded_once(fail_at):
    """Local and cluster (the registry port): the retry recorded a second
    rollback; now it finishes the recorded one."""
    from kubeloop.registry.base import RegistryUnavailable

    registry = FailingWrite(fail_at)
    registry.add_version("fraud", "s3://1")
    registry.add_version("fraud", "s3://2")
    registry.set_alias("fraud", "champion", "1")
    promote(registry, "fraud", "2", "champion", by="op", reason="r")
    registry.writes = 0
    with pytest.raises(RegistryUnavailable):
        rollback(registry, "fraud", "champion", by="bob", reason="incident")
    assert registry.get_alias("fraud", "champion").version == "2", "interrupted before the move"
    entry = rollback(registry, "fraud", "champion", by="bob", reason="incident")
    assert registry.get_alias("fraud", "champion").version == "1"
    assert [(e.action, e.version, e.previous) for e in audit_trail(registry, "fraud")] == [
        ("promote", "2", "1"), ("rollback", "1", "2")]
    assert (entry.action, entry.version) == ("rollback", "1")
    assert "kubeloop.rollback.champion" in registry.get_version("fraud", "1").tags


# -- the tail TrainingJob and OptimizedModel share ------------------------------

def _record(registry, run, registers: bool = True, **kwargs):
    policy = PromotionPolicy(promote_to="champion", gates=PromotionGates())
    ref = ObjectRef("TrainingJob", "ml", "fraud", "uid-1", generation=1)
    return record_run(ref, TrainingJobStatus(), run, registry, 3, required=["RunSucceeded"], observations=[],
                      fields={"run_id": run.run_id}, registers=registers, policy=policy, metric="auc", **kwargs)


def _conditions(status) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in status.conditions}


def test_a_succeeded_runs_model_is_recorded_and_promoted_once_its_gates_pass(registry):
    run = RunStatus("r", "Succeeded", outputs={"model": {"name": "fraud", "version": 2, "run_url": "http://m/2"}})
    out = _record(registry, run)
    assert out.status.phase == "Succeeded"
    assert (out.status.model.version, out.status.model.run_url) == ("2", "http://m/2")
    assert _conditions(out.status)["ModelRegistered"] == ("True", "Registered")
    assert _conditions(out.status)["Promoted"] == ("True", "Promoted")
    assert registry.get_alias("fraud", "champion").version == "2"


@pytest.mark.parametrize("phase, outputs, registers, expected", [
    ("Succeeded", {}, True, ("Failed", ("False", "NoModel"))),
    ("Running", {}, True, ("Running", ("Unknown", "AwaitingRun"))),
    ("Failed", {}, True, ("Failed", ("Unknown", "AwaitingRun"))),
    ("Succeeded", {"noop": True}, False, ("Succeeded", None)),
])
def test_without_a_registered_model_nothing_is_promoted(registry, phase, outputs, registers, expected):
    """A run that should have registered a version and did not failed; one
    that registers none (the no-op backend) has no ModelRegistered at all."""
    out = _record(registry, RunStatus("r", phase, outputs=outputs), registers=registers)
    assert (out.status.phase, _conditions(out.status).get("ModelRegistered")) == expected
    assert "Promoted" not in _conditions(out.status) and out.status.model is None
    assert registry.get_alias("fraud", "champion").version == "1"


def test_a_registry_out_of_reach_is_retried_soon_without_the_events(registry):
    def unavailable(*args):
        raise RegistryUnavailable("mlflow is down")

    registry.get_alias = unavailable
    run = RunStatus("r", "Succeeded", outputs={"model": {"name": "fraud", "version": "2"}})
    events = [Event("Normal", "Superseded", "cancelled run q of the previous spec")]
    out = _record(registry, run, events=events)
    assert _conditions(out.status)["Promoted"] == ("Unknown", "RegistryUnavailable")
    assert out.status.phase == "Succeeded" and out.retry_after == 16 and out.retry_reason == "mlflow is down"
    assert out.events == []
    assert _record(InMemoryRegistry(), RunStatus("r", "Running"), events=events).events == events
