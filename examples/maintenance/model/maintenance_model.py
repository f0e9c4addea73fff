"""The maintenance team's own network: a residual multi-layer perceptron.

kubeloop calls build(n_inputs, n_outputs, **parameters) and wraps the module
it returns (standardisation in front, softmax behind). The module maps a
standardised float32 batch [B, n_inputs] to raw class scores [B, n_outputs].
Pre-norm residual blocks keep the sensors' interactions (vibration with speed,
temperature with load) trainable at depth; no data-dependent control flow,
so ONNX export traces it as is.
"""

from __future__ import annotations

import torch
from torch import nn


class ResidualBlock(nn.Module):
    """x + MLP(LayerNorm(x)), with a widening hidden layer."""

    def __init__(self, width: int, dropout: float) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.GELU(),
                                  nn.Dropout(dropout), nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class MaintenanceNet(nn.Module):
    """Inputs projected to `hidden`, `blocks` residual blocks, a normalised head."""

    def __init__(self, n_inputs: int, n_outputs: int, hidden: int, blocks: int, dropout: float) -> None:
        super().__init__()
        self.stem = nn.Linear(n_inputs, hidden)
        self.blocks = nn.Sequential(*(ResidualBlock(hidden, dropout) for _ in range(blocks)))
        self.head = nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, n_outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


def build(n_inputs: int, n_outputs: int, hidden: int = 128, blocks: int = 2, dropout: float = 0.1) -> nn.Module:
    """The factory kubeloop calls (spec.model.factory: maintenance_model:build)."""
    if n_inputs < 1 or n_outputs < 1:
        raise ValueError(f"maintenance_model needs n_inputs >= 1 and n_outputs >= 1, got {n_inputs}, {n_outputs}")
    if hidden < 1 or blocks < 0 or not 0 <= dropout < 1:
        raise ValueError(f"maintenance_model: hidden must be >= 1, blocks >= 0 and 0 <= dropout < 1; "
                         f"got hidden={hidden}, blocks={blocks}, dropout={dropout}")
    return MaintenanceNet(n_inputs, n_outputs, hidden, blocks, dropout)
