"""OptimizedModel: resolve the source version, check the techniques against
the target, run the optimisation pipeline and report its variants table."""

from __future__ import annotations

from kubeloop.api.conditions import OPTIMIZED_MODEL_CONDITIONS, ConditionType, Reason
from kubeloop.api.optimization import ChosenVariant, OptimizedModelSpec, OptimizedModelStatus, Variant
from kubeloop.api.refs import ObjectRef
from kubeloop.api.tasks import METRICS, produces
from kubeloop.gpu.catalog import gpu_model
from kubeloop.operator.builders.pipelines import build_optimization_run, owner, spec_hash
from kubeloop.operator.conditions import Observation
from kubeloop.operator.ports import Ports
from kubeloop.operator.reconcilers.common import Outcome, backoff, finish, follow_run
from kubeloop.operator.reconcilers.promotion import record_run
from kubeloop.registry.base import ModelRegistry, ModelVersion, RegistryUnavailable
from kubeloop.registry.tags import OWNER, SOURCE, TASK

KIND = "OptimizedModel"


def required_conditions(backend: str) -> list[str]:
    # The no-op backend registers nothing, so there is no model to wait for.
    return [c for c in OPTIMIZED_MODEL_CONDITIONS.required
            if not (backend == "noop" and c == ConditionType.MODEL_REGISTERED)]


def unsupported_techniques(spec: OptimizedModelSpec, tensorrt: bool = False) -> list[str]:
    """Why each requested technique cannot run on the target, if it cannot (pure)."""
    problems = []
    if spec.target.device == "cpu":
        return problems  # CEL already rejects GPU-only techniques on a CPU target.
    for technique in ("tensorrt-fp16", "tensorrt-int8"):
        if technique in spec.techniques and not tensorrt:
            problems.append(f"{technique} needs TensorRT in the components image; this operator is configured "
                            "without it (KUBELOOP_TENSORRT)")
    product = spec.target.gpu_product
    model = gpu_model(product) if product else None
    if product and model is None:
        return [f"target.gpuProduct {product} is not a GPU kubeloop knows; see `kubeloop gpus`"]
    if model is None:
        return problems
    if "bf16" in spec.techniques and not model.supports_bf16:
        problems.append(f"bf16 needs compute capability 8.0 or newer; {model.product} has "
                        f"{model.compute_capability[0]}.{model.compute_capability[1]}")
    if "sparsity-2to4" in spec.techniques and not model.supports_sparsity_2to4:
        problems.append(f"sparsity-2to4 needs sparse tensor cores (Ampere or newer); {model.product} is "
                        f"{model.family}")
    return problems


def metric_problems(spec: OptimizedModelSpec, task: str) -> list[str]:
    """Metrics the spec names that the source's task does not produce (pure)."""
    named = [("accuracyBudget.metric", spec.accuracy_budget.metric)] + [
        (f"promotion.gates.metrics[{i}].metric", g.metric)
        for i, g in enumerate(spec.promotion.gates.metrics if spec.promotion else [])]
    return [f"spec.{path} '{metric}' is not a metric of the source's task {task}; use one of "
            f"{', '.join(METRICS[task])}" for path, metric in named if metric and not produces(task, metric)]


def resolve_source(ref: ObjectRef, spec: OptimizedModelSpec,
                   registry: ModelRegistry) -> tuple[ModelVersion | None, str]:
    """The version to optimise and the SourceResolved message (or, when there
    is none, what does not exist); raises RegistryUnavailable.

    A version this OptimizedModel registered is never its own source: the
    source alias at one (the object promotes to the alias it optimises, as
    the shipped example does, or registers its winner under it) means the
    version that one was optimised from, read from its lineage tag. The
    pipeline writes that tag when it registers the version, so before any
    alias can point at it: a reconcile killed between the promotion and its
    status write, a resume of the Succeeded object, or any later reconcile
    resolves the source it started from, so finds the same run. An alias
    moved to any other version is a new source, and a new generation with
    the alias still at the object's own output optimises that output's source
    again. A source named by version is taken as named."""
    found = registry.resolve(spec.source.name, spec.source.version, spec.source.alias)
    if found is None:
        return None, f"{spec.source.uri} does not exist in the registry"
    said = f"{spec.source.uri} is version {found.version}"
    name, _, origin = found.tags.get(SOURCE, "").rpartition("/")
    if not spec.source.alias or found.tags.get(OWNER) != owner(ref) or name != spec.source.name or not origin:
        return found, said
    said += f", which this OptimizedModel registered from version {origin}"
    source = registry.get_version(name, origin)
    if source is None:
        return None, f"{said}; version {origin} does not exist in the registry"
    return source, f"{said}: version {origin} is the source"


def reconcile_optimized_model(ref: ObjectRef, spec: OptimizedModelSpec, status: OptimizedModelStatus,
                              ports: Ports, attempt: int = 0) -> Outcome[OptimizedModelStatus]:
    backend_name = spec.backend or ports.default_pipeline_backend
    required = required_conditions(backend_name)
    try:
        source, resolved = resolve_source(ref, spec, ports.registry)
    except RegistryUnavailable as exc:
        obs = [Observation(ConditionType.SOURCE_RESOLVED, "Unknown", Reason.REGISTRY_UNAVAILABLE, str(exc))]
        return Outcome(finish(status, obs, ref.generation, required), retry_after=backoff(attempt),
                       retry_reason=str(exc))
    if source is None:
        # Pending, not Failed: the source may be registered later (a TrainingJob
        # applied together with this object is still training).
        obs = [Observation(ConditionType.SOURCE_RESOLVED, "False", Reason.SOURCE_NOT_FOUND,
                           f"{resolved}: register it first (a TrainingJob does) or fix spec.source")]
        new = finish(status, obs, ref.generation, required, phase="Pending")
        return Outcome(new)
    observations = [Observation(ConditionType.SOURCE_RESOLVED, "True", Reason.RESOLVED, resolved)]
    task = source.tags.get(TASK, "binary")
    invalid = metric_problems(spec, task)
    if invalid:
        observations.append(Observation(ConditionType.TECHNIQUES_SUPPORTED, "False", Reason.INVALID_SPEC,
                                        "; ".join(invalid)))
        return Outcome(finish(status, observations, ref.generation, required, phase="Failed",
                              source_version=source.version))
    backend = ports.pipelines.get(backend_name)
    problems = unsupported_techniques(spec, backend is not None and backend.tensorrt)
    if problems:
        observations.append(Observation(ConditionType.TECHNIQUES_SUPPORTED, "False", Reason.UNSUPPORTED_TECHNIQUE,
                                        "; ".join(problems)))
        new = finish(status, observations, ref.generation, required, phase="Failed",
                     source_version=source.version)
        return Outcome(new)
    observations.append(Observation(ConditionType.TECHNIQUES_SUPPORTED, "True", Reason.SUPPORTED,
                                    ", ".join(spec.techniques)))
    if backend is None:
        observations.append(Observation(ConditionType.RUN_SUBMITTED, "False", Reason.BACKEND_NOT_CONFIGURED,
                                        f"the operator has no '{backend_name}' pipeline backend"))
        new = finish(status, observations, ref.generation, required, phase="Failed")
        return Outcome(new)
    # The source version is part of the run's identity (with the owner, the
    # generation and the spec: run_name): an alias that moved elsewhere means a
    # new source and so a new optimisation; one at the object's own output
    # means the same source (resolve_source), so the same run.
    digest = spec_hash(spec) + "-" + source.version
    progress = follow_run(backend, status.run_id, status.spec_hash, digest,
                          lambda: build_optimization_run(ref, spec, source.version, digest))
    observations += progress.observations
    if progress.unavailable:
        return Outcome(finish(status, observations, ref.generation, required), retry_after=backoff(attempt),
                       retry_reason=progress.unavailable)
    run = progress.run
    fields: dict = {"run_id": run.run_id, "spec_hash": digest, "source_version": source.version}
    if run.run_id != status.run_id:
        fields.update(variants=[], chosen=None, model=None, gpu_memory_mib=None, batching=None)
    if run.phase == "Succeeded" and not run.outputs.get("noop"):
        fields.update(variants_of(run.outputs))
        if run.outputs.get("selection"):
            # Why the winner won: measurably faster, or chosen among overlapping intervals.
            selection = run.outputs["selection"]
            observations.append(Observation(ConditionType.VARIANT_CHOSEN, "True", selection["reason"],
                                            selection["message"]))
    return record_run(ref, status, run, ports.registry, attempt, required=required, observations=observations,
                      fields=fields, registers=backend_name != "noop", policy=spec.promotion,
                      metric=spec.accuracy_budget.metric)


def variants_of(outputs: dict) -> dict:
    """The status fields a succeeded run's outputs give (pure): the variants
    table, the one chosen, what it needs and how it batches."""
    chosen = outputs.get("chosen")
    return {"variants": [Variant.model_validate(v) for v in outputs.get("variants", [])],
            **({"chosen": ChosenVariant.model_validate(chosen)} if chosen else {}),
            "gpu_memory_mib": outputs.get("gpu_memory_mib"), "batching": outputs.get("batching")}
