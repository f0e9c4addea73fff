"""OptimizedModel status from a finished optimisation run: the variants'
intervals and the VariantChosen condition (in-memory ports, local)."""

from __future__ import annotations

from kubeloop.api.optimization import OptimizedModelSpec, OptimizedModelStatus
from kubeloop.api.refs import ObjectRef
from kubeloop.operator.ports import Ports
from kubeloop.operator.reconcilers.optimization import reconcile_optimized_model
from kubeloop.registry.memory import InMemoryRegistry
from kubeloop.registry.tags import OWNER, PIPELINE_RUN, SOURCE, TASK
from tests.unit.fakes import ScriptedBackend

SPEC = OptimizedModelSpec.model_validate({"source": {"name": "fraud", "version": "1"}, "backend": "local"})
REF = ObjectRef("OptimizedModel", "ml", "fast", "uid-1", 1, {})
OUTPUTS = {
    "variants": [
        {"technique": "source", "latencyP99Ms": 0.2, "latencyP99IntervalMs": {"low": 0.19, "high": 0.21},
         "speedup": 1.0, "speedupInterval": {"low": 0.9, "high": 1.1}, "divergence": 0.0, "accepted": True},
        {"technique": "onnx", "latencyP99Ms": 0.05, "latencyP99IntervalMs": {"low": 0.048, "high": 0.052},
         "latencyP50Ms": 0.04, "latencyP50IntervalMs": {"low": 0.039, "high": 0.041}, "speedup": 4.0,
         "speedupInterval": {"low": 3.65, "high": 4.38}, "divergence": 1e-7, "accepted": True, "reason": "winner"}],
    "chosen": {"technique": "onnx", "speedup": 4.0, "speedupInterval": {"low": 3.65, "high": 4.38}, "meetsSlo": True},
    "selection": {"reason": "MeasurablyFaster", "message": "onnx: p99 at batch 32 0.05 [0.048, 0.052] ms lies below"},
    "model": {"name": "fraud", "version": "2", "uri": "models:/fraud/2"}, "gpu_memory_mib": 520, "batching": "b",
}


def test_a_finished_run_reports_intervals_and_why_the_winner_won():
    registry = InMemoryRegistry()
    registry.add_version("fraud", "s3://1", tags={})
    backend = ScriptedBackend()
    ports = Ports(registry=registry, pipelines={"local": backend})
    status = reconcile_optimized_model(REF, SPEC, OptimizedModelStatus(), ports).status
    backend.finish(status.run_id, outputs=OUTPUTS)
    status = reconcile_optimized_model(REF, SPEC, status, ports).status
    assert status.phase == "Succeeded"
    onnx = next(v for v in status.variants if v.technique == "onnx")
    assert (onnx.latency_p99_interval_ms.low, onnx.latency_p99_interval_ms.high) == (0.048, 0.052)
    assert onnx.latency_p50_interval_ms.high == 0.041 and onnx.divergence == 1e-7
    assert status.chosen.speedup_interval.low == 3.65
    chosen = next(c for c in status.conditions if c.type == "VariantChosen")
    assert chosen.status == "True" and chosen.reason == "MeasurablyFaster" and "lies below" in chosen.message


def test_tensorrt_techniques_need_a_pipeline_backend_that_has_tensorrt():
    """Whether TensorRT is there is the backend's to say (its image or
    machine), not a flag beside the ports."""
    registry = InMemoryRegistry()
    registry.add_version("fraud", "s3://1", tags={})
    spec = OptimizedModelSpec.model_validate({"source": {"name": "fraud", "version": "1"}, "backend": "local",
                                              "target": {"device": "gpu"}, "techniques": ["tensorrt-fp16"]})
    without, with_tensorrt = ScriptedBackend(), ScriptedBackend()
    with_tensorrt.tensorrt = True

    def techniques(backend) -> tuple[str, str]:
        status = reconcile_optimized_model(REF, spec, OptimizedModelStatus(),
                                           Ports(registry=registry, pipelines={"local": backend})).status
        condition = next(c for c in status.conditions if c.type == "TechniquesSupported")
        return condition.status, condition.reason

    assert techniques(without) == ("False", "UnsupportedTechnique")
    assert techniques(with_tensorrt) == ("True", "Supported")


# -- a source alias the object promotes to (the shipped example) ---------------------------------

SELF = OptimizedModelSpec.model_validate({"source": {"name": "fraud", "alias": "champion"}, "backend": "local",
                                          "promotion": {"promoteTo": "champion"}})


def _champion_and_run(spec: OptimizedModelSpec = SELF, alias: str = "champion") -> tuple[
        InMemoryRegistry, ScriptedBackend, Ports, OptimizedModelStatus]:
    """fraud version 1 is at the alias; the object's first reconcile started its run."""
    registry = InMemoryRegistry()
    registry.add_version("fraud", "s3://1", tags={TASK: "binary"})
    registry.set_alias("fraud", alias, "1")
    backend = ScriptedBackend()
    ports = Ports(registry=registry, pipelines={"local": backend})
    running = reconcile_optimized_model(REF, spec, OptimizedModelStatus(), ports).status
    assert running.phase == "Running" and running.source_version == "1"
    return registry, backend, ports, running


def _register_output(registry: InMemoryRegistry, backend: ScriptedBackend, run_id: str, source: str = "1",
                     owner: str = "ml/fast") -> str:
    """What the optimisation pipeline's register step does: a new version with
    its lineage, then the run succeeds reporting it."""
    version = registry.add_version("fraud", f"s3://opt-{run_id}", tags={
        TASK: "binary", OWNER: owner, PIPELINE_RUN: run_id, SOURCE: f"fraud/{source}",
        "metric.auc": "0.91", "gate.champion.auc": "0.90"}).version  # not worse than champion
    backend.finish(run_id, outputs={**OUTPUTS, "model": {"name": "fraud", "version": version,
                                                         "uri": f"models:/fraud/{version}"}})
    return version


def test_a_kill_between_promoting_its_own_source_alias_and_the_status_write_converges_without_a_second_run():
    """The alias the object optimises is the one it promotes to: the reconcile
    that promoted version 2 to champion was killed before its status write.
    The next one starts from the status before it, finds champion at its own
    output, and must neither optimise that nor end Failed."""
    registry, backend, ports, running = _champion_and_run()
    version = _register_output(registry, backend, running.run_id)
    killed = reconcile_optimized_model(REF, SELF, running, ports).status  # promotes, then its write is lost
    assert killed.phase == "Succeeded" and registry.get_alias("fraud", "champion").version == version == "2"

    status = reconcile_optimized_model(REF, SELF, running, ports).status
    assert {r.name for r in backend.requests} == {running.run_id}, "no second optimisation run"
    assert status.phase == "Succeeded" and status.run_id == running.run_id
    assert status.model.version == "2" and status.source_version == "1"
    promoted = next(c for c in status.conditions if c.type == "Promoted")
    assert promoted.status == "True" and registry.get_alias("fraud", "champion").version == "2"
    resolved = next(c for c in status.conditions if c.type == "SourceResolved")
    assert resolved.status == "True" and "registered from version 1" in resolved.message


def test_a_restart_after_promoting_its_own_source_alias_changes_nothing():
    """The same without a kill: a resume (or any later reconcile) of the
    Succeeded object finds champion at its own output and stays as it is."""
    registry, backend, ports, running = _champion_and_run()
    _register_output(registry, backend, running.run_id)
    done = reconcile_optimized_model(REF, SELF, running, ports).status
    again = reconcile_optimized_model(REF, SELF, done, ports).status
    assert {r.name for r in backend.requests} == {running.run_id}
    assert again.phase == "Succeeded" and again.model.version == "2" and again.source_version == "1"
    assert registry.get_alias("fraud", "champion").version == "2"


def test_an_alias_moved_by_something_else_still_starts_a_new_optimisation():
    """A version the object did not register (a TrainingJob promoted a new
    one) is a new source, so a new run; so is another object's output."""
    registry, backend, ports, running = _champion_and_run()
    _register_output(registry, backend, running.run_id)
    done = reconcile_optimized_model(REF, SELF, running, ports).status
    trained = registry.add_version("fraud", "s3://3", tags={TASK: "binary", OWNER: "ml/other-training"}).version
    registry.set_alias("fraud", "champion", trained)
    moved = reconcile_optimized_model(REF, SELF, done, ports).status
    assert moved.source_version == "3" and moved.phase == "Running" and moved.run_id != running.run_id
    assert [r.arguments["source_version"] for r in backend.requests if r.name == moved.run_id] == ["3"]


def test_a_new_generation_after_its_own_promotion_optimises_the_version_it_came_from():
    """A spec change is a new optimisation; with champion at the object's own
    output, of the version that output was optimised from (an optimised
    version cannot be optimised again)."""
    registry, backend, ports, running = _champion_and_run()
    _register_output(registry, backend, running.run_id)
    done = reconcile_optimized_model(REF, SELF, running, ports).status
    changed = SELF.model_copy(update={"techniques": ["onnx"]})
    ref = ObjectRef("OptimizedModel", "ml", "fast", "uid-1", 2, {})
    second = reconcile_optimized_model(ref, changed, done, ports).status
    assert second.phase == "Running" and second.run_id != running.run_id and second.source_version == "1"
    assert [r.arguments["source_version"] for r in backend.requests if r.name == second.run_id] == ["1"]


def test_a_source_alias_its_winner_is_registered_under_mid_run_is_not_a_new_source():
    """source challenger with registerAs challenger: the register step moves
    the alias to the winner before the run has finished; that is the object's
    own output, so its run goes on (it was cancelled for a second, doomed one)."""
    spec = OptimizedModelSpec.model_validate({"source": {"name": "fraud", "alias": "challenger"}, "backend": "local",
                                              "promotion": {"registerAs": "challenger"}})
    registry, backend, ports, running = _champion_and_run(spec, alias="challenger")
    winner = registry.add_version("fraud", "s3://2", tags={TASK: "binary", OWNER: "ml/fast",
                                                           PIPELINE_RUN: running.run_id, SOURCE: "fraud/1"}).version
    registry.set_alias("fraud", "challenger", winner)
    still = reconcile_optimized_model(REF, spec, running, ports).status
    assert still.run_id == running.run_id and still.phase == "Running" and not backend.cancelled
