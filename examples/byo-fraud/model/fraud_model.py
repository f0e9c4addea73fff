"""A fraud team's own network for kubeloop's card-transaction features: wide
and deep.

The wide part is one linear layer over the raw inputs, so a strong single
signal (an amount far above the card's average) reaches the score directly;
the deep part is a stack of gated layers (a sigmoid gate times a linear
transform) that learns the interactions (night-time online spending at a new
card). Their logits add up. kubeloop calls build(n_inputs, n_outputs,
**parameters) with n_outputs = 1 for a binary task and puts the sigmoid
behind the module's raw logit [B, 1].
"""

from __future__ import annotations

import torch
from torch import nn


class GatedLayer(nn.Module):
    """Linear(x) * sigmoid(Linear(x)), then dropout."""

    def __init__(self, n_in: int, n_out: int, dropout: float) -> None:
        super().__init__()
        self.value = nn.Linear(n_in, n_out)
        self.gate = nn.Linear(n_in, n_out)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.value(x) * torch.sigmoid(self.gate(x)))


class WideAndDeep(nn.Module):
    def __init__(self, n_inputs: int, n_outputs: int, width: int, depth: int, dropout: float) -> None:
        super().__init__()
        self.wide = nn.Linear(n_inputs, n_outputs)
        widths = [n_inputs, *([width] * depth)]
        self.deep = nn.Sequential(*(GatedLayer(a, b, dropout) for a, b in zip(widths, widths[1:], strict=False)),
                                  nn.Linear(widths[-1], n_outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wide(x) + self.deep(x)


def build(n_inputs: int, n_outputs: int, width: int = 64, depth: int = 2, dropout: float = 0.1) -> nn.Module:
    """The factory kubeloop calls (spec.model.factory: fraud_model:build)."""
    if n_inputs < 1 or n_outputs < 1:
        raise ValueError(f"fraud_model needs n_inputs >= 1 and n_outputs >= 1, got {n_inputs}, {n_outputs}")
    if width < 1 or depth < 1 or not 0 <= dropout < 1:
        raise ValueError(f"fraud_model: width and depth must be >= 1 and 0 <= dropout < 1; "
                         f"got width={width}, depth={depth}, dropout={dropout}")
    return WideAndDeep(n_inputs, n_outputs, width, depth, dropout)
