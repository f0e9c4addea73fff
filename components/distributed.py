"""Training entry point of a Kubeflow Trainer TrainJob: the torch runtime
runs it under torchrun on every node; rank 0 writes the model."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import fsspec
import numpy as np
import pandas as pd

from kubeloop.api.training import TrainingJobSpec
from kubeloop.components.data import SPLIT, DatasetInfo, model_inputs, target
from kubeloop.components.model import save_model
from kubeloop.components.steps import architecture_for
from kubeloop.components.training import TrainSettings, train_rank


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", required=True, help="parquet written by the training-data step")
    parser.add_argument("--dataset-info", required=True)
    parser.add_argument("--output", required=True, help="folder (local or object store) for the model")
    parser.add_argument("--spec", required=True, help="the TrainingJob spec as JSON")
    args = parser.parse_args(argv)
    spec = TrainingJobSpec.from_json(args.spec)
    info = DatasetInfo.from_json(args.dataset_info)
    frame = pd.read_parquet(args.dataset)
    train_rows = model_inputs(frame[frame[SPLIT] == "train"], info)
    x = train_rows[info.feature_columns].to_numpy(np.float32)
    y = target(info, train_rows[info.label])
    settings = TrainSettings.from_spec(spec.hyperparameters, spec.seed)
    gpus = spec.resources.gpu.count if spec.resources.gpu else 0
    with tempfile.TemporaryDirectory() as tmp:
        result = train_rank(x, y, settings, gpus, Path(tmp) / "checkpoints", architecture_for(spec, info))
        if result is not None:
            local = Path(tmp) / "model"
            save_model(result.model, local)
            fs, root = fsspec.core.url_to_fs(args.output)
            fs.makedirs(root, exist_ok=True)
            fs.put_file(str(local / "state.pt"), f"{root.rstrip('/')}/state.pt")


if __name__ == "__main__":
    main()
