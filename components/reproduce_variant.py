"""Rebuild an optimised version (an OptimizedModel's winner) from its
lineage and compare (`kubeloop reproduce` of a version tagged
kubeloop.source).

The version names its source version, the technique the optimiser chose and
the OptimizedModel spec. The rebuild runs the optimisation pipeline's own
data step (the source's rows rebuilt from its store, its network fetched)
and builds that one technique's variant with the optimiser's builder and
seed, as a new MLflow run tagged kubeloop.reproduces; nothing is registered.
The optimiser's timing run is not repeated: which technique wins depends on
the machine's timings, so the chosen one is rebuilt. The registered and the
rebuilt ONNX models (what Triton serves) then score the same hold-out rows,
and components.comparison judges the dataset hash, the budget metric and the
outputs as it does for a trained version.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kubeloop.api.optimization import OptimizedModelSpec
from kubeloop.api.training import TrainingJobSpec
from kubeloop.components.comparison import Build, Report, Tolerance, compare, output_gap
from kubeloop.components.data import DatasetInfo, load_split
from kubeloop.components.reproduce import LineageError, log_report, require_lineage
from kubeloop.registry import tags


@dataclass(frozen=True)
class VariantLineage:
    """What an optimised version recorded about how it was made."""

    model: str
    version: str
    run_id: str
    """The optimisation run, whose exported/model.onnx Triton serves."""
    source: tuple[str, str]
    """The source model and version it was built from."""
    technique: str
    spec: OptimizedModelSpec
    training: TrainingJobSpec
    """The source's TrainingJob spec (its task, evaluation and window)."""
    metric: str
    """The accuracy budget's metric, the one the version recorded for itself."""
    recorded: Build


def read_variant_lineage(model: str, version: str, vtags: dict) -> VariantLineage:
    """An optimised version's lineage from its tags; LineageError when a part is missing."""
    from kubeloop.components.optimize import budget_metric

    require_lineage(model, version, vtags, (tags.SOURCE, tags.TECHNIQUE, tags.OPTIMIZATION_SPEC, tags.TRAINING_SPEC,
                                            "run_id"),
                    "it is optimised, by an older kubeloop; run its OptimizedModel again and reproduce the version "
                    "that registers")
    try:
        spec = OptimizedModelSpec.model_validate_json(vtags[tags.OPTIMIZATION_SPEC])
        training = TrainingJobSpec.model_validate_json(vtags[tags.TRAINING_SPEC])
    except ValueError as exc:
        raise LineageError(f"{model} version {version}: its recorded specs ({tags.OPTIMIZATION_SPEC}, "
                           f"{tags.TRAINING_SPEC}) no longer validate against this kubeloop's API: {exc}") from None
    name, _, number = vtags[tags.SOURCE].rpartition("/")
    metric = budget_metric(spec, training.task)
    recorded_metric = vtags.get(f"{tags.METRIC_PREFIX}{metric}")
    code = {"git sha": vtags.get("git_sha"), "factory": vtags.get(tags.FACTORY),
            "factory code": vtags.get(tags.FACTORY_CODE), "technique": vtags[tags.TECHNIQUE]}
    recorded = Build(vtags.get("dataset_hash", ""), None, json.loads(vtags.get("feature_views", "{}")),
                     json.loads(vtags.get(tags.VIEW_HASHES, "{}")), {k: v for k, v in code.items() if v},
                     {metric: float(recorded_metric)} if recorded_metric else {})
    return VariantLineage(model, str(version), vtags["run_id"], (name, number), vtags[tags.TECHNIQUE], spec, training,
                          metric, recorded)


def reproduce_variant(tracking_uri: str, lineage: VariantLineage, feast_repo: str, work: Path,
                      tolerance: Tolerance) -> Report:
    """Rebuild the variant as a new MLflow run and compare it with the record."""
    from mlflow import MlflowClient

    from kubeloop.components.optimize import optimization_data_step
    from kubeloop.version import git_sha

    work.mkdir(parents=True, exist_ok=True)
    info = DatasetInfo.from_json(optimization_data_step(
        lineage.spec.to_json(), lineage.source[1], tracking_uri, feast_repo, str(work / "dataset.parquet"),
        str(work / "source")))
    x_hold, rebuilt_outputs, rebuilt_score = _rebuild(lineage, info, work)
    registered = _registered_outputs(tracking_uri, lineage, work, x_hold)
    client = MlflowClient(tracking_uri)
    run_id = _run(client, lineage)
    rebuilt = Build(info.dataset_hash, info.rows, info.feature_views, info.view_hashes,
                    _code(lineage, git_sha()), {lineage.metric: rebuilt_score})
    report = compare(lineage.model, lineage.version, run_id, lineage.recorded, rebuilt,
                     output_gap(registered, rebuilt_outputs, info.task), tolerance,
                     [f"the optimiser's timing run is not repeated: the technique it chose ({lineage.technique}) is "
                      f"rebuilt from {lineage.source[0]} version {lineage.source[1]}"])
    log_report(client, run_id, report)
    return report


def _rebuild(lineage: VariantLineage, info: DatasetInfo, work: Path) -> tuple[np.ndarray, np.ndarray, float]:
    """The hold-out rows, the rebuilt variant's served outputs on them and
    its budget metric, built as optimize_step builds it."""
    import torch

    from kubeloop.components.model import load_model
    from kubeloop.components.optimize import scorer
    from kubeloop.components.variants import BUILDERS, BuildContext, NotBuilt, ort_predict, ort_session, source

    torch.set_num_threads(1)  # as the optimiser built it
    data = work / "dataset.parquet"
    train_frame, y_train = load_split(data, info, "train")
    hold_frame, y_hold = load_split(data, info, "holdout")
    cols = info.feature_columns
    x_train, x_hold = train_frame[cols].to_numpy(np.float32), hold_frame[cols].to_numpy(np.float32)
    ctx = BuildContext(load_model(work / "source"), x_train, y_train, lineage.spec, work / "variants",
                       torch.device("cpu"), seed=0)
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    builder = source if lineage.technique == "source" else BUILDERS.get(lineage.technique)
    if builder is None:
        raise LineageError(f"{lineage.model} version {lineage.version} was built with {lineage.technique}, which "
                           "this kubeloop's optimiser no longer has")
    try:
        variant = builder(ctx)
    except NotBuilt as exc:
        raise LineageError(f"{lineage.technique} cannot be built here: {exc}") from None
    score = scorer(info, lineage.training, lineage.metric)(y_hold, variant.predict(x_hold))
    served = ort_predict(ort_session(variant.onnx, ctx.device)) if variant.onnx else variant.predict
    return x_hold, served(x_hold), float(score)


def _code(lineage: VariantLineage, sha: str) -> dict[str, str]:
    """What rebuilt it: this checkout, the factory's code as it reads now, the technique built."""
    from kubeloop.components.model import factory_code

    factory = lineage.recorded.code.get("factory", "")
    path = lineage.training.model.path if lineage.training.model else None
    code = {"git sha": sha, "factory": factory, "factory code": factory_code(factory, path) if factory else "",
            "technique": lineage.technique}
    return {k: v for k, v in code.items() if v}


def _registered_outputs(tracking_uri: str, lineage: VariantLineage, work: Path, x: np.ndarray) -> np.ndarray:
    """The registered version's ONNX model, as Triton serves it, on the rows."""
    import mlflow
    import torch

    from kubeloop.components.registration import EXPORTED
    from kubeloop.components.variants import ort_predict, ort_session

    mlflow.set_tracking_uri(tracking_uri)
    path = mlflow.artifacts.download_artifacts(f"runs:/{lineage.run_id}/{EXPORTED}/model.onnx",
                                               dst_path=str(work / "registered"))
    return ort_predict(ort_session(Path(path), torch.device("cpu")))(x)


def _run(client, lineage: VariantLineage) -> str:  # noqa: ANN001 - MlflowClient
    """A run of its own for the rebuild, beside the optimisation runs of the model."""
    name = f"kubeloop/{lineage.model}/optimization"
    found = client.get_experiment_by_name(name)
    experiment = found.experiment_id if found else client.create_experiment(name)
    run = client.create_run(experiment, run_name=f"reproduce-{lineage.model}-{lineage.version}-{uuid.uuid4().hex[:8]}",
                            tags={tags.REPRODUCES: f"{lineage.model}/{lineage.version}",
                                  tags.TECHNIQUE: lineage.technique})
    client.set_terminated(run.info.run_id)
    return run.info.run_id

