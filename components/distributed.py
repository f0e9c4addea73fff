"""Training entry point of a Kubeflow Trainer TrainJob: the torch runtime
runs it under torchrun on every node; rank 0 writes the model and what the
run did. With --checkpoints, rank 0 publishes a checkpoint every epoch and a
node Pod started again (killed, evicted, its JobSet restarted) resumes from
the last one instead of the first epoch."""

from __future__ import annotations

import argparse
import json
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
from kubeloop.components.training import SHARED_CHECKPOINT, TrainResult, TrainSettings, train_rank


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", required=True, help="parquet written by the training-data step (path or s3://)")
    parser.add_argument("--dataset-info", required=True)
    parser.add_argument("--output", required=True, help="folder (path or s3://) for the model")
    parser.add_argument("--spec", required=True, help="the TrainingJob spec as JSON")
    parser.add_argument("--checkpoints", help="folder (path or s3://) for the checkpoint a restarted node resumes from")
    args = parser.parse_args(argv)
    spec = TrainingJobSpec.from_json(args.spec)
    info = DatasetInfo.from_json(args.dataset_info)
    x, y = _training_rows(args.dataset, info)
    settings = TrainSettings.from_spec(spec.hyperparameters, spec.seed)
    gpus = spec.resources.gpu.count if spec.resources.gpu else 0
    with tempfile.TemporaryDirectory() as tmp:
        checkpoints, publish = Path(tmp) / "checkpoints", None
        if args.checkpoints:
            shared = f"{args.checkpoints.rstrip('/')}/{SHARED_CHECKPOINT}"
            download(shared, checkpoints / SHARED_CHECKPOINT, missing_ok=True)
            publish = partial(upload, uri=shared)
        result = train_rank(x, y, settings, gpus, checkpoints, architecture_for(spec, info),
                            publish_checkpoint=publish)
        if result is not None:
            _write_result(result, Path(tmp) / "model", args.output.rstrip("/"))


def _training_rows(dataset: str, info: DatasetInfo) -> tuple[np.ndarray, np.ndarray]:
    with tempfile.TemporaryDirectory() as tmp:
        frame = pd.read_parquet(download(dataset, Path(tmp) / "dataset.parquet"))
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
