"""OptimizedModel status from a finished optimisation run: the variants'
intervals and the VariantChosen condition (in-memory ports, local)."""

from __future__ import annotations

from kubeloop.api.optimization import OptimizedModelSpec, OptimizedModelStatus
from kubeloop.api.refs import ObjectRef
from kubeloop.operator.ports import Ports
from kubeloop.operator.reconcilers.optimization import reconcile_optimized_model
from kubeloop.registry.memory import InMemoryRegistry
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
