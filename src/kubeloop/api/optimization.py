"""OptimizedModel: build faster variants of a registered model, measure each,
and register the fastest one that stays within the accuracy budget."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from kubeloop.api.base import BaseStatus, KubeModel, ModelRef, RegisteredModel
from kubeloop.api.promotion import PromotionPolicy
from kubeloop.api.schema import cel, cel_list
from kubeloop.api.training import PipelineBackendName

OptimizationPhase = Literal["Pending", "Running", "Succeeded", "Failed"]

Technique = Literal[
    "dynamic-int8",
    "static-int8",
    "structured-pruning",
    "unstructured-pruning",
    "distillation",
    "onnx",
    "onnx-int8",
    "torch-compile",
    "fp16",
    "bf16",
    "tensorrt-fp16",
    "tensorrt-int8",
    "sparsity-2to4",
]
# Techniques that need a GPU target; the rest run on CPU as well.
GPU_ONLY_TECHNIQUES = ("fp16", "bf16", "tensorrt-fp16", "tensorrt-int8", "sparsity-2to4")


class OptimizationTarget(KubeModel):
    """The hardware the model will be served on; variants are measured there."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            ("!has(self.gpuProduct) || self.device == 'gpu'",
             "gpuProduct applies only to device gpu", "gpuProduct"),
        )
    )

    device: Literal["cpu", "gpu"] = "cpu"
    """cpu, or gpu (the variants are built and measured on a GPU)."""
    gpu_product: str | None = Field(default=None, max_length=128)
    """The GPU product (its nvidia.com/gpu.product label) the model will serve
    on; decides precision support (bf16, 2:4 sparsity, TensorRT)."""


class AccuracyBudget(KubeModel):
    """How much accuracy a variant may lose."""

    metric: str | None = Field(default=None, min_length=1, max_length=64)
    """The held-out metric compared against the source model; it must be one the
    source's task produces (binary auc, multiclass accuracy, regression rmse, ...).
    Omitted means the task's primary metric (auc, macro_f1, rmse)."""
    max_drop: float = Field(default=0.01, ge=0)
    """The largest acceptable loss in that metric, in its own direction (a fall in
    AUC, a rise in RMSE). 0 accepts only variants whose outputs match the
    source's (to 1e-4; for regression, 1e-4 of the outputs' spread), such as a
    graph compiler's."""


class LatencySLO(KubeModel):
    """The latency the served model must meet; it picks the winner."""

    percentile: Literal["p50", "p99"] = "p99"
    """Which latency percentile the objective applies to."""
    milliseconds: float = Field(default=10.0, gt=0, le=60000)
    """The latency bound per batch."""
    batch_size: int = Field(default=32, ge=1, le=4096)
    """The batch size at which the bound applies."""


class PruningSettings(KubeModel):
    """Settings of the pruning techniques."""

    sparsity: float = Field(default=0.5, gt=0, lt=1)
    """Fraction of weights (unstructured) or hidden channels (structured) removed."""
    finetune_epochs: int = Field(default=2, ge=0, le=100)
    """Epochs of fine-tuning after pruning."""


class DistillationSettings(KubeModel):
    """Knowledge distillation into a smaller student network."""

    temperature: float = Field(default=4.0, gt=0, le=100)
    """Softening temperature of the teacher's logits."""
    alpha: float = Field(default=0.5, ge=0, le=1)
    """Weight of the distillation loss against the hard-label loss."""
    width_ratio: float = Field(default=0.25, gt=0, le=1)
    """Student hidden widths as a fraction of the teacher's."""
    epochs: int = Field(default=5, ge=1, le=1000)
    """Student training epochs."""


class OptimizedModelSpec(KubeModel):
    """A source model and how to look for a faster equivalent."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (f"self.target.device == 'gpu' || !self.techniques.exists(t, t in {cel_list(GPU_ONLY_TECHNIQUES)})",
             f"{', '.join(GPU_ONLY_TECHNIQUES)} need target.device gpu", "techniques"),
            ("self.latencySLO.batchSize in self.batchSizes",
             "latencySLO.batchSize must be one of batchSizes", "latencySLO.batchSize"),
        )
    )

    source: ModelRef
    """The registered model version (or alias) to optimise."""
    target: OptimizationTarget = Field(default_factory=OptimizationTarget)
    """Where the model will be served."""
    techniques: list[Technique] = Field(
        default_factory=lambda: ["dynamic-int8", "static-int8", "onnx", "onnx-int8",
                                 "structured-pruning", "distillation"],
        min_length=1, max_length=13,
    )
    """Techniques to try; each yields one measured variant."""
    accuracy_budget: AccuracyBudget = Field(default_factory=AccuracyBudget)
    """Variants that lose more than this are rejected."""
    latency_slo: LatencySLO = Field(default_factory=LatencySLO, alias="latencySLO")
    """The latency objective that chooses among accepted variants."""
    batch_sizes: list[int] = Field(default_factory=lambda: [1, 8, 32], min_length=1, max_length=8)
    """Batch sizes to profile."""
    calibration_samples: int = Field(default=2048, ge=16, le=1_000_000)
    """Rows of training data used to calibrate static quantisation."""
    pruning: PruningSettings = Field(default_factory=PruningSettings)
    """Pruning settings."""
    distillation: DistillationSettings = Field(default_factory=DistillationSettings)
    """Distillation settings."""
    registered_name: str | None = Field(default=None, max_length=253)
    """Registered model name for the winner; omitted means the source's name."""
    promotion: PromotionPolicy | None = None
    """Aliases to give the registered winner, and the gates before promotion."""
    backend: PipelineBackendName | None = None
    """Where the optimisation pipeline runs (trainer: one Job on the cluster); omitted means the operator's
    default."""


class Interval(KubeModel):
    """A confidence interval (95%) around a measured figure."""

    low: float
    """Lower bound."""
    high: float
    """Upper bound."""


class Variant(KubeModel):
    """One measured variant. Latencies are per call at the SLO batch size,
    timed interleaved with the other variants over 30 rounds; on a CPU target
    by the calling thread's CPU clock (one thread per runtime), on a GPU by
    the wall clock. Calls shorter than half a millisecond are timed in groups
    that long. Each percentile is that of a typical round (the median over
    rounds), so a few rounds disturbed by other work on the machine do not
    decide it."""

    technique: str
    """The technique that built it (source is the unmodified model)."""
    runtime: str | None = None
    """Where it ran: torch, onnxruntime, torch-compile or tensorrt."""
    note: str | None = None
    """What the technique did (kept widths, sparsity, calibration rows...)."""
    latency_p50_ms: float | None = None
    """Median latency at the SLO batch size."""
    latency_p50_interval_ms: Interval | None = None
    """The median's confidence interval."""
    latency_p99_ms: float | None = None
    """99th-percentile latency at the SLO batch size."""
    latency_p99_interval_ms: Interval | None = None
    """The 99th percentile's confidence interval."""
    speedup: float | None = None
    """Source latency over variant latency at the SLO percentile and batch size."""
    speedup_interval: Interval | None = None
    """The speedup the two latency intervals allow, lowest to highest."""
    throughput: float | None = None
    """Rows per second at the SLO batch size."""
    size_mb: float | None = None
    """Serialized model size."""
    accuracy_delta: float | None = None
    """Variant metric minus source metric on the held-out set."""
    divergence: float | None = None
    """The largest change of the source's outputs on the held-out set
    (probability; for regression, in units of the outputs' spread); when
    latency intervals overlap, the variant that changes least wins."""
    accepted: bool = False
    """Whether the variant is within the accuracy budget."""
    reason: str | None = None
    """Why it was rejected, or not built."""


class ChosenVariant(KubeModel):
    """The winner."""

    technique: str
    """The winning variant's technique."""
    speedup: float
    """Its speedup against the source."""
    speedup_interval: Interval | None = None
    """The speedup the latency intervals allow, lowest to highest."""
    meets_slo: bool
    """Whether it meets the latency SLO."""


class OptimizedModelStatus(BaseStatus):
    """What the optimisation measured and chose."""

    phase: OptimizationPhase = "Pending"
    """Pending, Running, Succeeded or Failed."""
    run_id: str | None = None
    """The optimisation pipeline run."""
    spec_hash: str | None = None
    """Hash of the spec the run was submitted for."""
    source_version: str | None = None
    """The concrete source version optimised: the one spec.source names or its
    alias points at, or, when the alias points at a version this object
    registered (it promotes to the alias it optimises), the version that one
    was optimised from."""
    variants: list[Variant] = Field(default_factory=list, max_length=32)
    """Every variant with its measurements."""
    chosen: ChosenVariant | None = None
    """The variant that was registered."""
    model: RegisteredModel | None = None
    """The registered version of the winner."""
    gpu_memory_mib: int | None = None
    """The winner's GPU memory footprint (measured on GPU, estimated on CPU);
    serving places the model by it."""
    batching: str | None = None
    """The dynamic batching chosen for Triton from the latency profile, and why."""
