"""Components (no cluster): the TrainingJob fields weightDecay,
gradientAccumulationSteps, activationCheckpointing (spec.hyperparameters) and
holdoutFraction (spec.evaluation) do what their CRD descriptions promise when
they reach the real torch trainer and the real Feast data step. Specs are
built through the pydantic models from camelCase keys, as the API server
hands them over."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from kubeloop.api.training import TrainingJobSpec
from kubeloop.components.data import build_dataset, load_split
from kubeloop.components.training import TrainSettings, train
from kubeloop.featurestore.store import StoreLocation
from tests.components.conftest import VIEWS


def spec_with(hyperparameters: dict) -> TrainingJobSpec:
    return TrainingJobSpec.model_validate({
        "modelName": "fields", "seed": 7,
        "features": {"featureViews": VIEWS, "labels": {"source": "transactions", "column": "is_fraud"}},
        "hyperparameters": hyperparameters,
    })


def settings_of(spec: TrainingJobSpec) -> TrainSettings:
    # The same conversion train_step and the tuner apply to the spec.
    return TrainSettings.from_spec(spec.hyperparameters, spec.seed)


def toy_data(rows: int = 64) -> tuple[np.ndarray, np.ndarray]:
    # A few synthetic rows keep each run to milliseconds; the Feast data set is not needed here.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 4)).astype(np.float32)
    return x, (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.float32)


def saved_optimizer(checkpoint_dir: Path) -> dict:
    # train() returns no optimizer; its checkpoint holds the optimizer state it really used.
    return torch.load(checkpoint_dir / "rank0.pt", weights_only=True)["optimizer"]


def weights(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_weight_decay_is_adamws_decay_and_shrinks_the_weights(tmp_path):
    x, y = toy_data()
    common = {"epochs": 5, "batchSize": 16, "learningRate": 0.05, "dropout": 0.0}
    decayed = train(x, y, None, None, settings_of(spec_with({**common, "weightDecay": 1.0})),
                    checkpoint_dir=tmp_path / "decayed")
    free = train(x, y, None, None, settings_of(spec_with({**common, "weightDecay": 0.0})),
                 checkpoint_dir=tmp_path / "free")

    groups = saved_optimizer(tmp_path / "decayed")["param_groups"]
    assert [g["weight_decay"] for g in groups] == [1.0] * len(groups)
    assert [g["weight_decay"] for g in saved_optimizer(tmp_path / "free")["param_groups"]] == [0.0] * len(groups)
    # Decoupled decay pulls every weight towards zero each step (lr * decay = 5% here).
    assert weights(decayed.model).norm() < 0.9 * weights(free.model).norm()


def test_gradient_accumulation_steps_sums_micro_batches_into_one_optimiser_step(tmp_path):
    x, y = toy_data(64)
    # No dropout: the micro-batch and the big-batch runs must see identical forward passes.
    common = {"epochs": 2, "learningRate": 0.01, "dropout": 0.0}
    accumulated = train(x, y, None, None,
                        settings_of(spec_with({**common, "batchSize": 8, "gradientAccumulationSteps": 4})),
                        checkpoint_dir=tmp_path / "accumulated")
    big_batch = train(x, y, None, None, settings_of(spec_with({**common, "batchSize": 32})),
                      checkpoint_dir=tmp_path / "big")

    # 64 rows in micro-batches of 8 are 8 backward passes per epoch but, 4 per step, only 2 optimiser steps.
    state = saved_optimizer(tmp_path / "accumulated")["state"]
    assert {float(s["step"]) for s in state.values()} == {2 * 2}
    # The sampler's order does not depend on the batch size, so 4 micro-batches of 8 are the batch of 32.
    assert torch.allclose(weights(accumulated.model), weights(big_batch.model), atol=1e-5)


def test_activation_checkpointing_recomputes_hidden_blocks_in_backward_with_the_same_result():
    x, y = toy_data()
    common = {"epochs": 2, "batchSize": 16, "hiddenUnits": [8, 8, 4], "dropout": 0.0}
    checkpointed = train(x, y, None, None, settings_of(spec_with({**common, "activationCheckpointing": True}))).model
    plain = train(x, y, None, None, settings_of(spec_with(common))).model

    assert checkpointed.body.activation_checkpointing is True
    assert plain.body.activation_checkpointing is False
    # Recomputation must not change the arithmetic: the same seed trains the same weights.
    assert torch.allclose(weights(checkpointed), weights(plain), atol=1e-6)

    def forward_calls_in_backward(model: torch.nn.Module) -> int:
        # A block whose activations were dropped runs its layers again while gradients are computed
        # (torch's recomputation skips the hooks of the checkpointed block itself, not of its layers).
        calls = [0]
        layers = [m for m in model.body.blocks.modules() if isinstance(m, torch.nn.Linear)]
        hooks = [m.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1)) for m in layers]
        try:
            model.train()
            out = model(torch.as_tensor(x))
            before = calls[0]
            out.sum().backward()
            return calls[0] - before
        finally:
            for h in hooks:
                h.remove()
            model.eval()

    assert forward_calls_in_backward(plain) == 0
    assert forward_calls_in_backward(checkpointed) > 0


def test_holdout_fraction_is_the_most_recent_share_of_rows(feature_repo, job_spec, tmp_path):
    wire = job_spec.to_wire()
    spec = TrainingJobSpec.model_validate({**wire, "evaluation": {**wire["evaluation"], "holdoutFraction": 0.35}})
    path = tmp_path / "data.parquet"
    info = build_dataset(spec, StoreLocation(path=str(feature_repo)).to_json(), path)

    # The default fraction is 0.2, so a build that ignored the field lands far from 0.35.
    assert info.holdout_rows == info.rows - round(info.rows * 0.65)
    assert abs(info.holdout_rows / info.rows - 0.35) < 0.01
    frame = pd.read_parquet(path)
    holdout, _ = load_split(path, info, "holdout")
    assert len(holdout) == info.holdout_rows
    assert frame[frame.split == "train"].event_timestamp.max() <= holdout.event_timestamp.min()
