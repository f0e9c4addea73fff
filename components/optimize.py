"""The optimisation pipeline's steps: rebuild the source's data, build and
measure every variant, register the winner with a Triton repository.

Like components.steps, every step is a plain function of plain arguments
and paths, and imports its heavy libraries itself. The spec is the
OptimizedModel's as JSON text (KubeModel.to_json).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

import numpy as np

from kubeloop.api.optimization import OptimizedModelSpec
from kubeloop.components.data import DatasetInfo, load_split
from kubeloop.registry import tags

log = logging.getLogger(__name__)
# Timing budgets per variant (CPU seconds, samples, rounds) at the SLO's batch
# size and at the others. At the SLO's, 1.5 s of half-millisecond samples give
# each of 30 rounds the 100 its own p99 needs (components.intervals).
SLO_BUDGET = {"seconds": 1.5, "rounds": 30, "min_samples": 600, "max_samples": 6000}
OTHER_BUDGET = {"seconds": 0.2, "rounds": 20, "min_samples": 200, "max_samples": 3000}


def optimization_data_step(spec: str, source_version: str, tracking_uri: str, feast_repo: str,
                           dataset_path: str, source_dir: str) -> str:
    """The source model and the data it was trained on (rebuilt from Feast)."""
    import mlflow
    from mlflow import MlflowClient

    from kubeloop.api.training import TrainingJobSpec
    from kubeloop.components.data import build_dataset
    from kubeloop.components.registration import EXPORTED

    from kubeloop.featurestore.store import StoreLocation

    job = OptimizedModelSpec.from_json(spec)
    version = MlflowClient(tracking_uri).get_model_version(job.source.name, source_version)
    if tags.TRAINING_SPEC not in version.tags:
        raise ValueError(f"{job.source.name} version {source_version} has no {tags.TRAINING_SPEC} tag: only "
                         "versions registered by a TrainingJob (or an OptimizedModel) can be optimised")
    training = TrainingJobSpec.model_validate_json(version.tags[tags.TRAINING_SPEC])
    budget_metric(job, training.task)  # a metric the task lacks fails before any work
    store = version.tags.get(tags.FEATURE_STORE) or StoreLocation.resolve("", feast_repo).to_json()
    info = build_dataset(training, store, Path(dataset_path))
    mlflow.set_tracking_uri(tracking_uri)
    Path(source_dir).mkdir(parents=True, exist_ok=True)
    try:
        local = mlflow.artifacts.download_artifacts(f"runs:/{version.run_id}/{EXPORTED}/state.pt", dst_path=source_dir)
    except mlflow.exceptions.MlflowException as exc:
        raise ValueError(f"{job.source.name} version {source_version} has no {EXPORTED}/state.pt: it is not a "
                         "network kubeloop trained (an optimised version cannot be optimised again)") from exc
    if Path(local) != Path(source_dir) / "state.pt":
        shutil.move(local, Path(source_dir) / "state.pt")
    return info.to_json()


def _device(spec: OptimizedModelSpec):  # noqa: ANN202 - torch.device
    import torch

    if spec.target.device == "gpu":
        if not torch.cuda.is_available():
            raise RuntimeError("target.device is gpu but no GPU is visible where the pipeline runs; "
                               "run it on a GPU node (backend kfp) or target cpu")
        return torch.device("cuda")
    return torch.device("cpu")


def budget_metric(job: OptimizedModelSpec, task: str) -> str:
    """The accuracy budget's metric: the one named, or the task's primary metric."""
    from kubeloop.api.tasks import METRICS, PRIMARY, produces

    metric = job.accuracy_budget.metric or PRIMARY[task]
    if not produces(task, metric):
        raise ValueError(f"spec.accuracyBudget.metric '{metric}' is not a metric of the source's task {task}; "
                         f"use one of {', '.join(METRICS[task])}")
    return metric


def scorer(info: DatasetInfo, training, metric: str):  # noqa: ANN001, ANN202 - TrainingJobSpec
    """The budget metric of a variant's outputs on the hold-out."""
    from kubeloop.components.evaluation import evaluate

    options = {"threshold": training.evaluation.threshold, "classes": info.classes,
               "top_k": training.evaluation.top_k}
    return lambda y, outputs: evaluate(info.task, y, outputs, **options)[metric]


def divergence(outputs: np.ndarray, reference: np.ndarray, task: str) -> float:
    """The largest difference from the source's outputs: in probability for
    classifiers, in units of the source's spread for regression (so "the
    same model" does not depend on the label's scale)."""
    gap = float(np.max(np.abs(outputs - reference)))
    return gap / max(float(np.std(reference)), 1e-12) if task == "regression" else gap


def measure_variants(ctx, techniques: list[str], batch_sizes: list[int], score, x_hold: np.ndarray,
                     y_hold: np.ndarray, on_variant=None) -> tuple[list, dict]:  # noqa: ANN001
    """Build the source and every technique's variant, then measure them
    together: latency per batch size on hold-out rows (interleaved, with
    intervals; see components.benchmark), the budget metric (score(y,
    outputs)), size, and peak device memory. Techniques that cannot run here
    become rows that say why."""
    from kubeloop.components.benchmark import measure_interleaved, measuring, peak_memory_mib
    from kubeloop.components.selection import Measured
    from kubeloop.components.variants import BUILDERS, NotBuilt, source

    pool = x_hold[: max(4096, 8 * max(batch_sizes))]
    variants, errors = {}, {}
    for technique in ["source", *techniques]:
        builder = source if technique == "source" else BUILDERS[technique]
        log.info("building %s", technique)
        try:
            variants[technique] = builder(ctx)
        except NotBuilt as exc:
            errors[technique] = str(exc)
    predicts = {t: v.predict for t, v in variants.items()}
    with measuring() as how:
        log.info("measuring %d variants interleaved: %s", len(predicts), how)
        # The SLO's batch size picks the winner: its tail gets the most calls;
        # the others only shape the batching plan.
        slo_batch = ctx.spec.latency_slo.batch_size
        latency = {b: measure_interleaved(predicts, pool, b, device=ctx.device,
                                          **(SLO_BUDGET if b == slo_batch else OTHER_BUDGET))
                   for b in batch_sizes}
    reference = variants["source"].predict(x_hold)
    rows = []
    for technique in ["source", *techniques]:
        if technique in errors:
            rows.append(Measured(technique, "-", error=errors[technique]))
            continue
        variant = variants[technique]
        scores = variant.predict(x_hold)
        row = Measured(technique, variant.runtime, {b: (latency[b][technique].p50, latency[b][technique].p99)
                                                    for b in batch_sizes},
                       score(y_hold, scores), round(variant.artifact.stat().st_size / 1e6, 4),
                       variant.onnx is not None, variant.note,
                       peak_memory_mib=peak_memory_mib(variant.predict, pool[: max(batch_sizes)], ctx.device),
                       divergence=divergence(scores, reference, ctx.source.task))
        rows.append(row)
        if on_variant:
            on_variant(row, variant)
    return rows, variants


def optimize_step(spec: str, info_json: str, dataset_path: str, source_dir: str, tracking_uri: str,
                  source_version: str, pipeline_run: str, owner: str, work_dir: str, git_sha: str = "unknown") -> str:
    """Build and measure every variant; returns the results table as JSON."""
    import mlflow
    import torch

    from mlflow import MlflowClient

    from kubeloop.api.training import TrainingJobSpec
    from kubeloop.components.benchmark import footprint_mib
    from kubeloop.components.model import load_model
    from kubeloop.components.selection import choose
    from kubeloop.components.triton import plan_batching
    from kubeloop.components.variants import BuildContext

    job = OptimizedModelSpec.from_json(spec)
    info = DatasetInfo.from_json(info_json)
    training = TrainingJobSpec.model_validate_json(
        MlflowClient(tracking_uri).get_model_version(job.source.name, source_version).tags[tags.TRAINING_SPEC])
    metric = budget_metric(job, info.task)
    device = _device(job)
    torch.set_num_threads(1)  # every runtime gets one thread: the comparison is per core
    train_frame, y_train = load_split(Path(dataset_path), info, "train")
    hold_frame, y_hold = load_split(Path(dataset_path), info, "holdout")
    cols = info.feature_columns
    x_train, x_hold = train_frame[cols].to_numpy(np.float32), hold_frame[cols].to_numpy(np.float32)
    workdir = Path(work_dir)
    workdir.mkdir(parents=True, exist_ok=True)
    ctx = BuildContext(load_model(Path(source_dir)), x_train, y_train, job, workdir, device, seed=0)
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment(f"kubeloop/{job.registered_name or job.source.name}/optimization")
    run_tags = {tags.PIPELINE_RUN: pipeline_run, tags.OWNER: owner, "kubeloop.source_version": source_version,
                "git_sha": git_sha, "mlflow.source.git.commit": git_sha}
    with mlflow.start_run(run_name=pipeline_run, tags=run_tags) as parent:
        mlflow.log_params({"techniques": json.dumps(job.techniques), "target": job.target.device,
                           "budget.metric": metric, "budget.max_drop": job.accuracy_budget.max_drop,
                           "slo": json.dumps(job.latency_slo.to_wire()), "batch_sizes": json.dumps(job.batch_sizes)})

        def log_variant(row, variant) -> None:  # noqa: ANN001 - Measured, Variant
            with mlflow.start_run(run_name=row.technique, nested=True, tags={tags.TECHNIQUE: row.technique}):
                mlflow.log_metrics({metric: row.metric, "size_mb": row.size_mb, **_latency_metrics(row)})
                mlflow.log_params({"runtime": row.runtime, "note": row.note or "-"})

        score = scorer(info, training, metric)
        rows, variants = measure_variants(ctx, job.techniques, job.batch_sizes, score, x_hold, y_hold,
                                          on_variant=log_variant)
        choice = choose(rows, job.accuracy_budget, job.latency_slo, metric)
        source_metric = next(r.metric for r in rows if r.technique == "source")
        champion = _score_champion(job, tracking_uri, source_version, metric, source_metric, score, x_hold, y_hold)
        winner = variants[choice.winner.technique]
        shutil.copyfile(winner.onnx, workdir / "winner.onnx")
        plan = plan_batching(choice.winner.profile, job.latency_slo.milliseconds, job.target.device, os.cpu_count() or 1)
        footprint, source_of = footprint_mib(winner.predict, ctx.source, ctx.x_train, max(job.batch_sizes),
                                             ctx.device)
        speedup = choice.winner.speedup
        mlflow.log_metrics({"winner.speedup": speedup.value, "winner.speedup.low": speedup.low,
                            "winner.speedup.high": speedup.high})
        mlflow.set_tags({"kubeloop.winner": choice.winner.technique, tags.SELECTION: choice.why})
        parent_id = parent.info.run_id
    slo = job.latency_slo
    table = [_wire(r, slo) for r in choice.rows]
    return json.dumps({
        "variants": table, "plan": asdict(plan),
        "chosen": {"technique": choice.winner.technique, "speedup": round(choice.winner.speedup.value, 3),
                   "speedupInterval": _interval(choice.winner.speedup, 3), "meetsSlo": choice.meets_slo},
        "selection": {"reason": choice.basis, "message": choice.why},
        "gpu_memory_mib": footprint, "gpu_memory_source": source_of, "n_features": len(cols),
        "run_id": parent_id, "metric": {metric: choice.winner.metric}, "champion": champion,
    })


def _score_champion(job: OptimizedModelSpec, tracking_uri: str, source_version: str, metric: str,
                    source_metric: float, score, x: np.ndarray, y: np.ndarray) -> dict | None:  # noqa: ANN001
    """The current champion's budget metric on this hold-out, for the
    not-worse-than-champion gate (the source's own score when it is the champion)."""
    from kubeloop.registry.mlflow import MlflowRegistry
    from kubeloop.components.scoring import score_version

    champion = MlflowRegistry(tracking_uri).get_alias(job.source.name, "champion")
    if champion is None:
        return None
    value = source_metric if champion.version == source_version else score(y, score_version(tracking_uri, champion, x))
    return {"version": champion.version, "metrics": {metric: value}}


def _latency_metrics(row) -> dict[str, float]:  # noqa: ANN001 - Measured
    """A variant's latencies for its MLflow run: each figure with its interval."""
    out = {}
    for b, pair in row.latency.items():
        for name, est in zip(("p50_ms", "p99_ms"), pair, strict=True):
            out.update({f"{name}.b{b}": est.value, f"{name}.b{b}.low": est.low, f"{name}.b{b}.high": est.high})
    return out


def _wire(row, slo) -> dict:  # noqa: ANN001 - Measured, LatencySLO
    """A row as status.variants shows it (numbers rounded for reading)."""
    p50, p99 = row.latency.get(slo.batch_size, (None, None))
    out = {"technique": row.technique, "runtime": row.runtime, "note": row.note or None,
           "latencyP50Ms": _round(p50 and p50.value, 5), "latencyP50IntervalMs": _interval(p50, 5),
           "latencyP99Ms": _round(p99 and p99.value, 5), "latencyP99IntervalMs": _interval(p99, 5),
           "speedup": _round(row.speedup and row.speedup.value, 2), "speedupInterval": _interval(row.speedup, 2),
           "throughput": _round(slo.batch_size / p50.value * 1000 if p50 else None, 0),
           "sizeMb": _round(row.size_mb), "accuracyDelta": _round(row.accuracy_delta, 5),
           "divergence": _round(row.divergence, 7), "accepted": row.accepted, "reason": row.reason or None}
    return {k: v for k, v in out.items() if v is not None}


def _interval(est, digits: int) -> dict | None:  # noqa: ANN001 - Estimate
    return None if est is None else {"low": round(est.low, digits), "high": round(est.high, digits)}


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else round(value, digits)


def register_optimized_step(spec: str, source_version: str, results_json: str, work_dir: str, tracking_uri: str,
                            pipeline_run: str, owner: str) -> dict:
    """Register the winner as a new version, with Triton repositories and its
    lineage; a version this pipeline run registered before is returned."""
    import mlflow
    import onnx
    from mlflow import MlflowClient

    from kubeloop.api.promotion import alias_for
    from kubeloop.api.signature import TAG as SIGNATURE_TAG, ModelSignature
    from kubeloop.components.registration import EXPORTED, find_registered
    from kubeloop.registry.mlflow import run_url
    from kubeloop.components.triton import BACKENDS, BatchingPlan, write_repository

    job = OptimizedModelSpec.from_json(spec)
    results = json.loads(results_json)
    name = job.registered_name or job.source.name
    client = MlflowClient(tracking_uri)
    source = client.get_model_version(job.source.name, source_version)
    plan = BatchingPlan.from_dict(results["plan"])
    outcome = {"variants": results["variants"], "chosen": results["chosen"], "selection": results["selection"],
               "gpu_memory_mib": results["gpu_memory_mib"], "batching": plan.why}
    existing = find_registered(tracking_uri, name, pipeline_run)
    signature = ModelSignature.from_tags(source.tags)
    if existing is None:
        winner = Path(work_dir) / "winner.onnx"
        mlflow.set_tracking_uri(tracking_uri)
        with mlflow.start_run(run_id=results["run_id"]):
            info = mlflow.onnx.log_model(onnx.load(str(winner)), name="model", pip_requirements=["onnxruntime"])
            with tempfile.TemporaryDirectory() as tmp:
                folder = Path(tmp)
                for backend in BACKENDS:
                    write_repository(folder / "triton" / backend, name, winner, signature, plan, backend)
                (folder / EXPORTED).mkdir()
                shutil.copyfile(winner, folder / EXPORTED / "model.onnx")
                card = json.loads(Path(mlflow.artifacts.download_artifacts(
                    f"runs:/{source.run_id}/{EXPORTED}/model_card.json", dst_path=tmp)).read_text())
                card.update({"technique": results["chosen"]["technique"], "source_version": source_version})
                (folder / EXPORTED / "model_card.json").write_text(json.dumps(card, indent=2))
                for sub in ("triton", EXPORTED):
                    mlflow.log_artifacts(str(folder / sub), sub)
        run_id = results["run_id"]
        version_tags = {
            tags.PIPELINE_RUN: pipeline_run, tags.OWNER: owner, "run_id": run_id,
            tags.SOURCE: f"{job.source.name}/{source_version}",
            tags.TECHNIQUE: results["chosen"]["technique"],
            "kubeloop.speedup": str(results["chosen"]["speedup"]),
            tags.SPEEDUP_INTERVAL: "{low}..{high}".format(**results["chosen"]["speedupInterval"]),
            tags.SELECTION: results["selection"]["message"],
            tags.GPU_MEMORY_MIB: str(results["gpu_memory_mib"]),
            tags.GPU_MEMORY_SOURCE: results["gpu_memory_source"],
            tags.OUTCOME: json.dumps(outcome, separators=(",", ":")),
            "exported": f"runs:/{run_id}/{EXPORTED}", "triton": f"runs:/{run_id}/triton",
            tags.OPTIMIZATION_SPEC: job.model_dump_json(by_alias=True, exclude_none=True),
            **{k: source.tags[k] for k in (tags.TRAINING_SPEC, "feature_columns", "feature_views", "git_sha", "label",
                                           "threshold", tags.TASK, tags.FEATURE_STORE, tags.FACTORY, tags.REFERENCE,
                                           tags.FACTORY_CODE, tags.VIEW_HASHES, "dataset_hash")
               if k in source.tags},
            SIGNATURE_TAG: signature.to_json(),
            # Gate evidence: the source's metrics, the winner's own measured
            # budget metric over them, and the champion on the same hold-out.
            **{k: v for k, v in source.tags.items() if k.startswith(tags.METRIC_PREFIX)},
            **{f"{tags.METRIC_PREFIX}{k}": f"{v:.6f}" for k, v in results["metric"].items()},
            **({f"{tags.CHAMPION_PREFIX}version": results["champion"]["version"],
                **{f"{tags.CHAMPION_PREFIX}{k}": f"{v:.6f}" for k, v in results["champion"]["metrics"].items()}}
               if results.get("champion") else {}),
            tags.MEETS_SLO: str(results["chosen"]["meetsSlo"]).lower(),
        }
        existing = mlflow.register_model(info.model_uri, name, tags=version_tags)
    if job.promotion and job.promotion.register_as:
        client.set_registered_model_alias(name, alias_for(job.promotion.register_as), existing.version)
    return {**outcome, "model": {"name": name, "version": str(existing.version),
                                 "uri": f"models:/{name}/{existing.version}",
                                 "runUrl": run_url(tracking_uri, results["run_id"])}}
