"""Small trainable heads for the baselines: an MLP regressor and a linear bucket classifier.

Inputs are standardised with the training mean and standard deviation; training is full-data
minibatch Adam for a fixed number of epochs (no early stopping: the splits are small).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn


class Standardised(nn.Module):
    def __init__(self, inputs: torch.Tensor, body: nn.Module) -> None:
        super().__init__()
        self.register_buffer("mean", inputs.mean(0))
        self.register_buffer("std", inputs.std(0, unbiased=False).clamp_min(1e-6))
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body((x.float() - self.mean) / self.std)


def mlp(inputs: int, hidden: Sequence[int], outputs: int) -> nn.Module:
    layers, width = [], inputs
    for size in hidden:
        layers += [nn.Linear(width, size), nn.ReLU()]
        width = size
    layers.append(nn.Linear(width, outputs))
    return nn.Sequential(*layers)


def train_head(
    x: torch.Tensor,  # [N, D]
    y: torch.Tensor,  # [N] float targets (regression) or int64 classes
    *,
    hidden: Sequence[int] = (),
    outputs: int = 1,
    epochs: int = 200,
    lr: float = 1e-3,
    weight_decay: float = 1e-4,
    batch_size: int = 256,
    seed: int = 0,
    sample_weight: torch.Tensor | None = None,
) -> nn.Module:
    """Regression (``outputs == 1``, MSE) or classification (CE over ``outputs`` classes)."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    x = x.float()
    model = Standardised(x, mlp(x.shape[1], hidden, outputs))
    if outputs == 1:  # start at the mean target: fewer epochs to converge
        with torch.no_grad():
            model.body[-1].bias.fill_(float(y.float().mean()))
    optimiser = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    weights = torch.ones(len(x)) if sample_weight is None else sample_weight.float()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for batch in order.split(batch_size):
            out = model(x[batch])
            if outputs == 1:
                losses = (out.squeeze(-1) - y[batch].float()) ** 2
            else:
                losses = nn.functional.cross_entropy(out, y[batch].long(), reduction="none")
            loss = (losses * weights[batch]).sum() / weights[batch].sum()
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    return model.eval()
