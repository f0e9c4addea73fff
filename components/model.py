"""The networks kubeloop trains: any PyTorch module built by a factory, wrapped
so that every exported form takes what the feature store gives and answers
in the task's terms.

A factory is `function(n_inputs, n_outputs, **parameters) -> nn.Module` whose
module maps a standardised batch [B, n_inputs] to raw scores [B, n_outputs].
`TaskModel` puts the standardisation in front (fixed buffers computed on the
training split) and the task's output behind: a probability for binary, a
probability per class for multiclass, the de-standardised value for
regression. The built-in perceptron (`mlp`) is the default factory.

Saved models are a state dict plus the factory's name and arguments, never
a pickled module: loading imports the factory again and fills its weights
(`torch.load(weights_only=True)`).
"""

from __future__ import annotations

import hashlib
import importlib
import itertools
import sys
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from kubeloop.api.tasks import INPUT, OUTPUTS

BUILTIN = "kubeloop.components.model:mlp"


class MLP(nn.Module):
    """The built-in perceptron: Linear-ReLU-Dropout blocks and a linear head."""

    def __init__(self, n_inputs: int, n_outputs: int, hidden_units: list[int], dropout: float = 0.1):
        super().__init__()
        widths = [n_inputs, *hidden_units]
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(w_in, w_out), nn.ReLU(), nn.Dropout(dropout))
            for w_in, w_out in itertools.pairwise(widths)
        )
        self.head = nn.Linear(widths[-1], n_outputs)
        self.activation_checkpointing = False

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            if self.activation_checkpointing and self.training and h.requires_grad:
                h = checkpoint(block, h, use_reentrant=False)
            else:
                h = block(h)
        return self.head(h)


def mlp(n_inputs: int, n_outputs: int, hidden_units: list[int] = (64, 32), dropout: float = 0.1) -> MLP:
    return MLP(n_inputs, n_outputs, list(hidden_units), dropout)


@dataclass(frozen=True)
class Architecture:
    """How to build the network again: the factory, its arguments and the task."""

    task: str
    n_inputs: int
    n_outputs: int
    factory: str = BUILTIN
    parameters: dict[str, Any] = field(default_factory=dict)
    path: str | None = None
    """A folder the factory's package is imported from."""


class FactoryError(ValueError):
    """The user's factory could not build a fitting module; the message says why."""


def load_factory(factory: str, path: str | None = None):  # noqa: ANN201 - the factory callable
    module_name, _, function = factory.partition(":")
    if path and path not in sys.path:
        sys.path.insert(0, path)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        where = f" (from {path})" if path else " (installed packages)"
        raise FactoryError(f"spec.model.factory {factory}: cannot import {module_name}{where}: "
                           f"{type(exc).__name__}: {exc}") from exc
    built = getattr(module, function, None)
    if not callable(built):
        raise FactoryError(f"spec.model.factory {factory}: {module_name} has no function {function}")
    return built


def factory_code(factory: str, path: str | None = None) -> str:
    """A hash of the source file of the factory's module ("" when it has
    none): lineage for the network's code, which the git sha misses when the
    factory lives in a user's package."""
    load_factory(factory, path)  # imports its module, from path when given
    source = getattr(sys.modules[factory.partition(":")[0]], "__file__", None)
    if not source or not Path(source).is_file():
        return ""
    return hashlib.sha256(Path(source).read_bytes()).hexdigest()[:12]


class TaskModel(nn.Module):
    """A body between the standardisation and the task's output."""

    def __init__(self, body: nn.Module, architecture: Architecture):
        super().__init__()
        n = architecture.n_inputs
        self.body = body
        self.task = architecture.task
        self.architecture = architecture
        self.register_buffer("mean", torch.zeros(n))
        self.register_buffer("scale", torch.ones(n))
        self.register_buffer("target_mean", torch.zeros(1))
        self.register_buffer("target_scale", torch.ones(1))

    def set_normalisation(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.mean.copy_(mean)
        self.scale.copy_(torch.where(std > 1e-6, 1.0 / std, torch.ones_like(std)))

    def set_target_normalisation(self, mean: float, std: float) -> None:
        """Regression learns the standardised label; the output undoes it."""
        self.target_mean.fill_(mean)
        self.target_scale.fill_(std if std > 1e-12 else 1.0)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The body's raw scores [B, n_outputs] on standardised inputs."""
        return self.body((x - self.mean) * self.scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The task's output, [B, n_outputs]."""
        raw = self.logits(x)
        if self.task == "binary":
            return torch.sigmoid(raw)
        if self.task == "multiclass":
            return torch.softmax(raw, dim=-1)
        return raw * self.target_scale + self.target_mean


def build_model(architecture: Architecture, activation_checkpointing: bool = False) -> TaskModel:
    """The architecture's network, its output shape checked on a probe batch."""
    factory = load_factory(architecture.factory, architecture.path)
    try:
        body = factory(architecture.n_inputs, architecture.n_outputs, **architecture.parameters)
    except Exception as exc:
        raise FactoryError(f"spec.model.factory {architecture.factory} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(body, nn.Module):
        raise FactoryError(f"spec.model.factory {architecture.factory} returned {type(body).__name__}, "
                           "not a torch.nn.Module")
    if activation_checkpointing and hasattr(body, "activation_checkpointing"):
        body.activation_checkpointing = True
    model = TaskModel(body, architecture)
    check_output(model)
    return model


def check_output(model: TaskModel) -> None:
    arch = model.architecture
    try:
        with torch.no_grad():
            out = model.eval().logits(torch.zeros(2, arch.n_inputs))
    except Exception as exc:
        raise FactoryError(f"spec.model.factory {arch.factory}: the module fails on a batch of shape "
                           f"[2, {arch.n_inputs}]: {type(exc).__name__}: {exc}") from exc
    if tuple(out.shape) != (2, arch.n_outputs):
        raise FactoryError(f"spec.model.factory {arch.factory}: the module maps [2, {arch.n_inputs}] to "
                           f"{list(out.shape)}; a {arch.task} model must answer [batch, {arch.n_outputs}]")
    model.train()


def save_model(model: TaskModel, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "state.pt"
    torch.save({"architecture": asdict(model.architecture), "state_dict": model.state_dict()}, path)
    return path


def load_model(folder: Path) -> TaskModel:
    saved = torch.load(Path(folder) / "state.pt", map_location="cpu", weights_only=True)
    model = build_model(Architecture(**saved["architecture"]))
    model.load_state_dict(saved["state_dict"])
    return model.eval()


def export_torchscript(model: nn.Module, n_inputs: int, path: Path) -> Path:
    model = model.eval().cpu()
    traced = torch.jit.trace(model, torch.zeros(2, n_inputs), check_trace=False)
    traced.save(str(path))
    return path


def export_onnx(model: TaskModel, path: Path) -> Path:
    """ONNX with a dynamic batch dimension: input "features" [batch, n], the
    task's output ("probability", "probabilities" or "value") [batch, n_outputs]."""
    model = model.eval().cpu()
    output = OUTPUTS[model.task]
    with warnings.catch_warnings():  # the TorchScript-based exporter announces its deprecation
        warnings.simplefilter("ignore", (DeprecationWarning, FutureWarning, UserWarning))
        torch.onnx.export(
            model, (torch.zeros(2, model.architecture.n_inputs),), str(path), input_names=[INPUT],
            output_names=[output], dynamic_axes={INPUT: {0: "batch"}, output: {0: "batch"}},
            opset_version=17, dynamo=False,
        )
    return path
