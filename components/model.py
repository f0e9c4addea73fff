"""The fraud model: a multi-layer perceptron that takes raw feature values.

Standardisation is part of the network (fixed buffers computed on the
training split), so every exported form (TorchScript, ONNX, a Triton model)
takes the same raw feature vector a caller gets from the feature store.
"""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class FraudNet(nn.Module):
    def __init__(self, n_features: int, hidden_units: list[int], dropout: float = 0.1,
                 activation_checkpointing: bool = False):
        super().__init__()
        self.register_buffer("mean", torch.zeros(n_features))
        self.register_buffer("scale", torch.ones(n_features))
        widths = [n_features, *hidden_units]
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(w_in, w_out), nn.ReLU(), nn.Dropout(dropout))
            for w_in, w_out in itertools.pairwise(widths)
        )
        self.head = nn.Linear(widths[-1], 1)
        self.activation_checkpointing = activation_checkpointing

    def set_normalisation(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.mean.copy_(mean)
        self.scale.copy_(torch.where(std > 1e-6, 1.0 / std, torch.ones_like(std)))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        h = (x - self.mean) * self.scale
        for block in self.blocks:
            if self.activation_checkpointing and self.training and h.requires_grad:
                h = checkpoint(block, h, use_reentrant=False)
            else:
                h = block(h)
        return self.head(h).squeeze(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Fraud probability per row."""
        return torch.sigmoid(self.logits(x))


def build_model(n_features: int, hidden_units: list[int], dropout: float,
                activation_checkpointing: bool = False) -> FraudNet:
    return FraudNet(n_features, list(hidden_units), dropout, activation_checkpointing)


def export_torchscript(model: nn.Module, n_features: int, path: Path) -> Path:
    model = model.eval().cpu()
    traced = torch.jit.trace(model, torch.zeros(2, n_features), check_trace=False)
    traced.save(str(path))
    return path


class _Column(nn.Module):
    """Probabilities as a [batch, 1] column, the shape Triton's config declares."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x).unsqueeze(-1)


def export_onnx(model: nn.Module, n_features: int, path: Path) -> Path:
    """ONNX with a dynamic batch dimension: input "features" [batch, n],
    output "probability" [batch, 1]."""
    model = _Column(model.eval().cpu())
    with warnings.catch_warnings():  # the TorchScript-based exporter announces its deprecation
        warnings.simplefilter("ignore", (DeprecationWarning, FutureWarning, UserWarning))
        _export(model, n_features, path)
    return path


def _export(model: nn.Module, n_features: int, path: Path) -> None:
    torch.onnx.export(
        model, (torch.zeros(2, n_features),), str(path), input_names=["features"],
        output_names=["probability"], dynamic_axes={"features": {0: "batch"}, "probability": {0: "batch"}},
        opset_version=17, dynamo=False,
    )
