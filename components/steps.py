"""The training pipeline's steps as plain functions of plain arguments and
file paths: what the KFP components in kubeloop.components.ops call, and
what the tests call directly. The spec is the TrainingJob's as JSON text
(KubeModel.to_json).

Each step runs in a fresh process, so heavy libraries are imported inside
the step that needs them (Feast alone takes seconds to import).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path

import numpy as np

from kubeloop.api.training import TrainingJobSpec
from kubeloop.components.data import DatasetInfo, build_dataset, load_split

log = logging.getLogger(__name__)


def training_data_step(spec: str, feature_store: str, feast_repo: str, dataset_path: str,
                       feature_store_file: str = "") -> str:
    """Point-in-time training data from Feast; returns the DatasetInfo as JSON.
    The store is the job's: its feature_store.yaml mounted at
    feature_store_file (on a cluster), or given as feature_store
    (StoreLocation JSON, the local backend); neither means the default
    repository feast_repo."""
    from kubeloop.featurestore.store import StoreLocation

    store = StoreLocation.resolve(feature_store, feast_repo, feature_store_file).to_json()
    info = build_dataset(TrainingJobSpec.from_json(spec), store, Path(dataset_path))
    log.info("training data: %d rows (%d dropped by ttl), hash %s", info.rows, info.dropped_by_ttl,
             info.dataset_hash)
    return info.to_json()


def validate_step(spec: str, dataset_path: str, info_json: str, tracking_uri: str, pipeline_run: str,
                  owner: str) -> str:
    """Check the training data against spec.validation and the champion's
    training data; returns the report (JSON) for the training run and the
    version. In fail mode a finding fails the step (and the run), naming
    the column, the rule and the values; the report is then logged on a
    failed MLflow run of the job's experiment."""
    import pandas as pd

    from kubeloop.components import validation as checks

    job = TrainingJobSpec.from_json(spec)
    info = DatasetInfo.from_json(info_json)
    frame = pd.read_parquet(dataset_path)  # features without a value still NaN
    columns = [*info.feature_columns, *([info.slice_column] if info.slice_column else [])]
    schema = checks.infer_schema(frame, columns, info.label, info.task)
    settings = job.validation
    report = checks.Report(mode=settings.mode if settings else "off", schema=schema)
    if settings is not None:
        report.findings = checks.check_spec(frame, info.label, info.task, settings)
        if settings.champion.enabled:
            report.champion, found = _compare_with_champion(job, info, tracking_uri, dataset_path, frame, schema)
            report.findings += found
    log.info("data validation: %s", report.summary())
    if report.mode == "fail" and report.findings:
        # Here, not above: MLflow and torch cost a validation that passes seconds of start-up.
        from kubeloop.components import registration

        registration.log_failed_validation(tracking_uri, job, pipeline_run, owner, report.to_json())
        raise checks.DataValidationError(f"data validation failed, {checks.describe(report.findings)}")
    return report.to_json()


def champion_alias(job: TrainingJobSpec) -> str:
    """The alias of the version the job competes with: the one it promotes to."""
    from kubeloop.api.promotion import alias_for

    return alias_for((job.promotion.promote_to if job.promotion else None) or "champion")


def _compare_with_champion(job: TrainingJobSpec, info: DatasetInfo, tracking_uri: str, dataset_path: str,
                           frame, schema: dict) -> tuple[dict | None, list]:  # noqa: ANN001 - a DataFrame
    """The rows against the champion's schema, and each feature's PSI
    against its training sample; (what was compared, the findings)."""
    from kubeloop.components import registration
    from kubeloop.components import validation as checks
    from kubeloop.components.distributions import column_drift
    from kubeloop.registry.mlflow import MlflowRegistry

    champion = MlflowRegistry(tracking_uri).get_alias(job.model_name, champion_alias(job))
    if champion is None:
        return None, []
    limits = job.validation.champion
    before, reference = registration.champion_baseline(tracking_uri, champion)
    found = []
    if before is not None:
        found += checks.compare_schemas(schema, before, limits, champion.version)
        found += checks.out_of_range(frame, before, limits, champion.version)
    psi = {}
    features = [c for c in info.feature_columns if reference is not None and c in reference.columns]
    if features:
        train, _ = load_split(Path(dataset_path), info, "train")
        psi = column_drift(reference, train, features, method="psi", threshold=limits.psi_threshold).scores
        found += checks.psi_findings(psi, limits.psi_threshold, champion.version)
    return {"version": champion.version, "schema": before is not None, "reference": reference is not None,
            "psi": psi}, found


def architecture_for(job: TrainingJobSpec, info: DatasetInfo, hp=None):  # noqa: ANN001, ANN201 - Hyperparameters, Architecture
    """The network the job trains: its own factory, or the built-in perceptron."""
    from kubeloop.components.model import Architecture
    from kubeloop.components.training import TrainSettings

    n_inputs, n_outputs = len(info.feature_columns), len(info.classes) if info.task == "multiclass" else 1
    if job.model is None:
        return TrainSettings.from_spec(hp or job.hyperparameters, job.seed).builtin(info.task, n_inputs, n_outputs)
    return Architecture(info.task, n_inputs, n_outputs, job.model.factory, dict(job.model.parameters),
                        job.model.path)


def train_step(spec: str, dataset_path: str, info_json: str, model_dir: str, tracking_uri: str,
               pipeline_run: str, owner: str, spec_hash: str, git_sha: str, validation: str = "") -> str:
    """Tune (if asked), train and checkpoint, recording where the loop's
    time went (registration.log_bottleneck); returns the MLflow run id.
    validation: the validation step's report, logged on the run."""
    from kubeloop.components import registration
    from kubeloop.components.model import build_model, save_model
    from kubeloop.components.training import TrainSettings, train, train_distributed
    from kubeloop.components.tuning import tune

    job = TrainingJobSpec.from_json(spec)
    info = DatasetInfo.from_json(info_json)
    frame, y = load_split(Path(dataset_path), info, "train")
    x = frame[info.feature_columns].to_numpy(np.float32)
    build_model(architecture_for(job, info))  # a factory that cannot build fails before any run is started
    run_id = registration.start_run(tracking_uri, job, pipeline_run, owner, spec_hash, git_sha)
    if validation:
        registration.log_validation(tracking_uri, run_id, validation)
    hp = job.hyperparameters
    if job.tuning.trials > 1:
        hp, trials = tune(x, y, job, info, lambda n, params, score: registration.log_trial(
            tracking_uri, run_id, n, params, job.tuning_metric, score))
        log.info("best of %d trials: %s", len(trials), hp.to_wire())
    settings = TrainSettings.from_spec(hp, job.seed)
    architecture = architecture_for(job, info, hp)
    gpus = job.resources.gpu.count if job.resources.gpu else 0
    processes = job.distributed.processes_per_node * job.distributed.nodes
    workdir = Path(model_dir).parent / f"{Path(model_dir).name}-work"
    if processes > 1:
        result = train_distributed(x, y, settings, processes, workdir, gpus=gpus, architecture=architecture)
    else:
        result = train(x, y, None, None, settings, gpus=gpus, checkpoint_dir=workdir / "checkpoints",
                       profile_dir=workdir / "profile", architecture=architecture,
                       progress=lambda r: log.info("epoch %d: loss %.4f, %.0f samples/s", r["epoch"], r["loss"],
                                                   r["samples_per_second"]))
    save_model(result.model, Path(model_dir))
    registration.log_reference(tracking_uri, run_id, frame[info.feature_columns], seed=job.seed)
    registration.log_training(tracking_uri, run_id, info, result.history, {
        "train.precision": result.precision, "train.device": result.device, "train.processes": processes,
        "train.resumed_from_epoch": result.resumed_from_epoch,
        "train.best_hyperparameters": json.dumps(hp.to_wire(), sort_keys=True),
        "model.factory": architecture.factory, "model.parameters": json.dumps(architecture.parameters, sort_keys=True),
        **{f"dataloader.{k}": v for k, v in asdict(result.loader).items()},
    })
    if result.bottleneck is not None:
        registration.log_bottleneck(tracking_uri, run_id, result.bottleneck, result.trace)
        log.info("%s", result.bottleneck["advice"])
    return run_id


def evaluation_options(job: TrainingJobSpec, info: DatasetInfo) -> dict:
    return {"threshold": job.evaluation.threshold, "classes": info.classes, "top_k": job.evaluation.top_k}


def evaluate_step(spec: str, dataset_path: str, info_json: str, model_dir: str, tracking_uri: str,
                  run_id: str) -> str:
    """Hold-out metrics (and per-slice metrics); returns them as JSON."""
    from kubeloop.components import registration
    from kubeloop.components.evaluation import evaluate, evaluate_slices
    from kubeloop.components.model import load_model
    from kubeloop.components.training import predict

    job = TrainingJobSpec.from_json(spec)
    info = DatasetInfo.from_json(info_json)
    frame, y = load_split(Path(dataset_path), info, "holdout")
    x = frame[info.feature_columns].to_numpy(np.float32)
    outputs = predict(load_model(Path(model_dir)), x)
    options = evaluation_options(job, info)
    metrics = evaluate(info.task, y, outputs, **options)
    slices = (evaluate_slices(info.task, y, outputs, frame[info.slice_column].to_numpy(), **options)
              if info.slice_column else {})
    registration.log_evaluation(tracking_uri, run_id, metrics, slices)
    champion = _evaluate_champion(job, info, tracking_uri, x, y)
    return json.dumps({"metrics": metrics, "slices": slices, "champion": champion})


def _evaluate_champion(job: TrainingJobSpec, info: DatasetInfo, tracking_uri: str, x: np.ndarray,
                       y: np.ndarray) -> dict | None:
    """The current champion scored on the same hold-out, when a gate will
    compare with it."""
    from kubeloop.components.evaluation import evaluate
    from kubeloop.registry.mlflow import MlflowRegistry
    from kubeloop.components.scoring import score_version

    if not job.promotion or not job.promotion.gates.not_worse_than_champion:
        return None
    champion = MlflowRegistry(tracking_uri).get_alias(job.model_name, champion_alias(job))
    if champion is None:
        return None
    outputs = score_version(tracking_uri, champion, x)
    return {"version": champion.version, "metrics": evaluate(info.task, y, outputs, **evaluation_options(job, info))}


def register_step(spec: str, info_json: str, model_dir: str, evaluation_json: str, tracking_uri: str,
                  run_id: str, pipeline_run: str, owner: str, git_sha: str, lineage: dict | None = None) -> dict:
    """Register the model; returns what the operator reports in status.
    lineage: more tags of where the version came from."""
    from kubeloop.components import registration
    from kubeloop.components.model import load_model

    job = TrainingJobSpec.from_json(spec)
    info = DatasetInfo.from_json(info_json)
    evaluation = json.loads(evaluation_json)
    metrics = evaluation["metrics"]
    model = registration.register(tracking_uri, run_id, load_model(Path(model_dir)), job, info, metrics,
                                  pipeline_run, owner, git_sha, champion=evaluation.get("champion"), lineage=lineage)
    shown = {k: round(v, 6) for k, v in metrics.items() if v == v and k not in ("rows", "positives")}
    return {"model": model, "metrics": shown, "dataset_hash": info.dataset_hash,
            "dropped_by_ttl": info.dropped_by_ttl, "rows": info.rows,
            "bottleneck": registration.bottleneck_of(tracking_uri, run_id)}


def train_on_trainer_step(spec: str, dataset_path: str, info_json: str, validation: str, model_dir: str,
                          tracking_uri: str, pipeline_run: str, owner: str, spec_hash: str, git_sha: str,
                          namespace: str, trainer: str, timeout: float = 24 * 3600) -> str:
    """Multi-node training on a real cluster: the pipeline's data below the
    run's prefix, then the trainer backend's TrainJob on it (its initializer
    keeps that data, rank 0 leaves the model instead of registering); waits
    for it and returns the MLflow run id like train_step. trainer: the
    TrainerSettings fields (image, bucket, Secrets) as JSON."""
    import tempfile

    from kubeloop.components import registration
    from kubeloop.components.initializer import publish_data
    from kubeloop.components.objects import download
    from kubeloop.components.trainjob import (TRAINER_API_VERSION, TrainerSettings, build_run_trainjob, plan_run,
                                              trainjob_finished)
    from kubeloop.kube import Kube, KubeError
    from kubeloop.polling import wait_for

    job = TrainingJobSpec.from_json(spec)
    settings = TrainerSettings(**json.loads(trainer), tracking_uri=tracking_uri, git_sha=git_sha)
    run = plan_run(settings, namespace, pipeline_run, spec, owner, spec_hash, leave_model=True)
    with tempfile.TemporaryDirectory() as tmp:
        publish_data(Path(tmp), Path(dataset_path), info_json, validation, run.data)
    name = run.trainjob.split("/", 1)[1]
    kube = Kube.from_environment()
    try:
        kube.create(build_run_trainjob(run, job, settings, None, {"kubeloop.dev/pipeline-run": pipeline_run}, []))
    except KubeError as exc:
        if exc.status != 409:  # 409: this step started again, its TrainJob already there
            raise

    def finished() -> bool:
        done, error = trainjob_finished(kube.get(TRAINER_API_VERSION, "TrainJob", name, namespace) or {})
        if done and error:
            raise RuntimeError(f"TrainJob {run.trainjob}: {error}")
        return done

    wait_for(finished, timeout, f"TrainJob {run.trainjob} finishing", interval=15)
    download(f"{run.output}/state.pt", Path(model_dir) / "state.pt")
    result = json.loads(download(f"{run.output}/result.json", Path(model_dir) / "result.json").read_text())
    run_id = registration.start_run(tracking_uri, job, pipeline_run, owner, spec_hash, git_sha)
    if validation:
        registration.log_validation(tracking_uri, run_id, validation)
    registration.log_training(tracking_uri, run_id, DatasetInfo.from_json(info_json), result["history"], {
        "train.trainjob": run.trainjob, "train.resumed_from_epoch": result["resumed_from_epoch"],
        "train.processes": job.distributed.nodes * job.distributed.processes_per_node})
    return run_id
