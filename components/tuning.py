"""Hyper-parameter search with Optuna: every trial trains on the older part
of the training split and is scored on its newest part (never on the
hold-out), and is reported to a callback (a nested MLflow run)."""

from __future__ import annotations

import logging
from typing import Callable

import numpy as np
import optuna

from kubeloop.api.tasks import LOWER_IS_BETTER
from kubeloop.api.training import Hyperparameters, TrainingJobSpec
from kubeloop.components.data import DatasetInfo
from kubeloop.components.evaluation import evaluate
from kubeloop.components.training import TrainSettings, predict, train

log = logging.getLogger(__name__)
INTEGER = {"batchSize", "epochs", "gradientAccumulationSteps"}
TrialCallback = Callable[[int, dict, float], None]


def _sampler(spec: TrainingJobSpec) -> optuna.samplers.BaseSampler:
    tuning = spec.tuning
    if tuning.algorithm == "grid":
        return optuna.samplers.GridSampler({k: list(v.choices) for k, v in tuning.parameters.items()},
                                           seed=spec.seed)
    if tuning.algorithm == "random":
        return optuna.samplers.RandomSampler(seed=spec.seed)
    return optuna.samplers.TPESampler(seed=spec.seed)


def _suggest(trial: optuna.Trial, name: str, dim) -> float | int:  # noqa: ANN001 - SearchDimension
    if dim.choices:
        value = trial.suggest_categorical(name, list(dim.choices))
    elif name in INTEGER:
        value = trial.suggest_int(name, int(dim.min), int(dim.max), log=dim.log)
    else:
        value = trial.suggest_float(name, dim.min, dim.max, log=dim.log)
    return int(value) if name in INTEGER else value


def with_overrides(hp: Hyperparameters, overrides: dict) -> Hyperparameters:
    """The hyper-parameters with camelCase overrides applied (and validated)."""
    return Hyperparameters.model_validate({**hp.to_wire(), **overrides})


def tune(x: np.ndarray, y: np.ndarray, spec: TrainingJobSpec, info: DatasetInfo,
         on_trial: TrialCallback | None = None) -> tuple[Hyperparameters, list[dict]]:
    """The best hyper-parameters of spec.tuning.trials trials, and every trial
    (each trial's network is the job's architecture with the trial's settings)."""
    from kubeloop.components.steps import architecture_for, evaluation_options

    cut = int(len(y) * 0.8)
    metric = spec.tuning_metric
    trials: list[dict] = []

    def objective(trial: optuna.Trial) -> float:
        overrides = {name: _suggest(trial, name, dim) for name, dim in spec.tuning.parameters.items()}
        hp = with_overrides(spec.hyperparameters, overrides)
        result = train(x[:cut], y[:cut], None, None, TrainSettings.from_spec(hp, spec.seed),
                       architecture=architecture_for(spec, info, hp))
        score = evaluate(info.task, y[cut:], predict(result.model, x[cut:]), **evaluation_options(spec, info))[metric]
        trials.append({"number": trial.number, "params": overrides, metric: score})
        if on_trial:
            on_trial(trial.number, overrides, score)
        log.info("trial %d: %s -> %s %.4f", trial.number, overrides, metric, score)
        return score

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize" if metric in LOWER_IS_BETTER else "maximize",
                                sampler=_sampler(spec))
    study.optimize(objective, n_trials=spec.tuning.trials)
    best = {k: (int(v) if k in INTEGER else v) for k, v in study.best_params.items()}
    return with_overrides(spec.hyperparameters, best), trials
