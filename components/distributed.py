"""Training entry point of a Kubeflow Trainer TrainJob's nodes
(kubeloop.components.trainjob's runtime runs it under torchrun on every node).

The run comes from the environment (kubeloop.components.trainer_run): the
data its dataset initializer prepared, checkpoints below its prefix. Rank 0
publishes a checkpoint every epoch, and a node Pod started again (killed,
evicted, its JobSet restarted) resumes from the last one instead of the
first epoch. Then rank 0 either leaves the model and what the run did where
the run's output says (the kfp backend's steps evaluate and register it), or
evaluates the model on the hold-out and registers it, once per pipeline run:
a rank 0 started again after it registered finds the version and registers
nothing more."""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from kubeloop.api.training import TrainingJobSpec
from kubeloop.components.data import SPLIT, DatasetInfo, model_inputs, target
from kubeloop.components.model import save_model
from kubeloop.components.objects import download, upload
from kubeloop.components.steps import architecture_for
from kubeloop.components.trainer_run import DATASET, INFO, VALIDATION, TrainerRun
from kubeloop.components.training import SHARED_CHECKPOINT, TrainResult, TrainSettings, train_rank

log = logging.getLogger("kubeloop.components.distributed")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trainer-run", action="store_true", required=True,
                        help="the run, read from the environment (a TrainJob's node)")
    parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _pipeline_node(TrainerRun.from_environment())


def _train(spec: TrainingJobSpec, info: DatasetInfo, dataset: Path, checkpoints: str,
           tmp: Path) -> TrainResult | None:
    """This rank's share of the training; the result on rank 0 only."""
    x, y = _training_rows(dataset, info)
    settings = TrainSettings.from_spec(spec.hyperparameters, spec.seed)
    gpus = spec.resources.gpu.count if spec.resources.gpu else 0
    local, shared = tmp / "checkpoints", f"{checkpoints.rstrip('/')}/{SHARED_CHECKPOINT}"
    download(shared, local / SHARED_CHECKPOINT, missing_ok=True)
    return train_rank(x, y, settings, gpus, local, architecture_for(spec, info),
                      publish_checkpoint=partial(upload, uri=shared))


def _pipeline_node(run: TrainerRun) -> None:
    spec = TrainingJobSpec.from_json(run.spec)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name in (DATASET, INFO, VALIDATION):
            download(f"{run.data}/{name}", folder / name)
        info = DatasetInfo.from_json((folder / INFO).read_text())
        result = _train(spec, info, folder / DATASET, run.checkpoints, folder)
        if result is None:  # not rank 0
            return
        if run.output:
            _write_result(result, folder / "model", run.output.rstrip("/"))
        else:
            _evaluate_and_register(run, spec, info, result, folder)


def _evaluate_and_register(run: TrainerRun, spec: TrainingJobSpec, info: DatasetInfo, result: TrainResult,
                           folder: Path) -> None:
    """Rank 0's end of the run: what the local backend's train, evaluate and
    register steps record, on the model the nodes trained."""
    from kubeloop.components import registration
    from kubeloop.components.data import load_split
    from kubeloop.components.steps import evaluate_step, register_step
    from kubeloop.registry import tags

    existing = registration.find_registered(run.tracking_uri, spec.model_name, run.pipeline_run)
    if existing is not None:
        log.info("version %s was registered by this run before this rank 0 started: nothing more to do",
                 existing.version)
        return
    run_id = registration.start_run(run.tracking_uri, spec, run.pipeline_run, run.owner, run.spec_hash, run.git_sha)
    registration.log_validation(run.tracking_uri, run_id, (folder / VALIDATION).read_text())
    frame, _ = load_split(folder / DATASET, info, "train")
    registration.log_reference(run.tracking_uri, run_id, frame[info.feature_columns], seed=spec.seed)
    registration.log_training(run.tracking_uri, run_id, info, result.history, {
        "train.trainjob": run.trainjob, "train.device": result.device, "train.precision": result.precision,
        "train.processes": spec.distributed.nodes * spec.distributed.processes_per_node,
        "train.resumed_from_epoch": result.resumed_from_epoch})
    model, info_json = folder / "model", info.to_json()
    save_model(result.model, model)
    evaluation = evaluate_step(run.spec, str(folder / DATASET), info_json, str(model), run.tracking_uri, run_id)
    registered = register_step(run.spec, info_json, str(model), evaluation, run.tracking_uri, run_id,
                               run.pipeline_run, run.owner, run.git_sha, lineage={tags.TRAINJOB: run.trainjob})
    log.info("registered %s", registered["model"]["uri"])


def _training_rows(dataset: Path, info: DatasetInfo) -> tuple[np.ndarray, np.ndarray]:
    frame = pd.read_parquet(dataset)
    rows = model_inputs(frame[frame[SPLIT] == "train"], info)
    return rows[info.feature_columns].to_numpy(np.float32), target(info, rows[info.label])


def _write_result(result: TrainResult, local: Path, output: str) -> None:
    """The model, and what the run did (the epoch it resumed from, each
    epoch's loss and speed), in output."""
    save_model(result.model, local)
    upload(local / "state.pt", f"{output}/state.pt")
    (local / "result.json").write_text(json.dumps({"resumed_from_epoch": result.resumed_from_epoch,
                                                   "history": result.history,
                                                   "samples_per_second": result.samples_per_second}))
    upload(local / "result.json", f"{output}/result.json")


if __name__ == "__main__":
    main()
