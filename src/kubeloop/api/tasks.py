"""The kinds of problem a TrainingJob can solve, and what each one produces:
its metrics, which of them are better when lower, and the metric that
decides when none is named (tuning, not-worse-than-champion, the
optimiser's accuracy budget). The one place these facts live: the API's CEL
rules, the evaluation, the gates and the optimiser all read them."""

from __future__ import annotations

from typing import Literal

Task = Literal["binary", "multiclass", "regression"]
TASKS: tuple[str, ...] = ("binary", "multiclass", "regression")

METRICS: dict[str, tuple[str, ...]] = {
    "binary": ("auc", "average_precision", "log_loss", "brier", "ece", "accuracy", "precision", "recall", "f1",
               "positive_rate"),
    "multiclass": ("accuracy", "macro_f1", "log_loss", "top_k_accuracy"),
    "regression": ("rmse", "mae", "r2"),
}
"""Metrics each task's evaluation reports (multiclass adds recall.<class> per class)."""

PER_CLASS_PREFIX = "recall."
"""Multiclass: recall.<class label> for every class."""

PRIMARY: dict[str, str] = {"binary": "auc", "multiclass": "macro_f1", "regression": "rmse"}
"""The metric used where a spec names none."""

LOWER_IS_BETTER = frozenset({"log_loss", "brier", "ece", "rmse", "mae"})

INPUT = "features"
OUTPUTS = {"binary": "probability", "multiclass": "probabilities", "regression": "value"}
"""The model's input tensor and each task's output tensor (api.signature
describes them); here, free of pydantic, so the trainer and the exporters
import them on a machine that holds only torch (the GPU benchmark)."""


def produces(task: str, metric: str) -> bool:
    """Whether the task's evaluation reports the metric."""
    return metric in METRICS[task] or (task == "multiclass" and metric.startswith(PER_CLASS_PREFIX))


def improvement(metric: str, candidate: float, reference: float) -> float:
    """How much better the candidate is than the reference, in the metric's
    own direction (negative when worse)."""
    return reference - candidate if metric in LOWER_IS_BETTER else candidate - reference


def cel_metric_rule(task_expr: str, metric_expr: str) -> str:
    """A CEL expression: metric_expr names a metric the task in task_expr produces."""
    clauses = [f"({task_expr} == '{task}' && {metric_expr} in [{', '.join(repr(m) for m in METRICS[task])}])"
               for task in TASKS]
    clauses.append(f"({task_expr} == 'multiclass' && {metric_expr}.startsWith('{PER_CLASS_PREFIX}'))")
    return " || ".join(clauses)
