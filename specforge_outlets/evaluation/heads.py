"""The one fitting recipe every learned baseline uses: an MLP (or linear) head on fixed features.

Sharing it is what makes the comparison fair: no baseline gets more care than another.

- inputs are standardised with the training mean and standard deviation;
- the output starts at the mean training target (zero last-layer weights; regression bias = the
  weighted mean target, classification bias = the log of the smoothed class frequencies), so
  epoch 0 is the best constant and training can only be kept if it beats it;
- the number of epochs is chosen on a validation share of the training *requests* (all positions
  of a request fall on the same side, so the probe cannot validate on its own training
  responses): train on the rest, keep the epoch with the lowest validation loss (stopping
  ``patience`` epochs after it), then refit on the whole training split for that many epochs;
- one seed drives the validation split, the initialisation and the minibatch order;
- rows marked ``censored`` (a response cut by the token limit: its target is a lower bound) are
  fitted one-sided, as OUTLETS' own head is with ``outlets.length_censored: one_sided``: penalised
  only below the bound (regression: ``relu(y - out)^2``; classes: ``-log P(class >= y)``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from specforge_outlets.errors import OutletsError
from specforge_outlets.model.length_head import tail_log_probability
from specforge_outlets.model.quantile_head import QuantileHead, constant_quantiles, pinball_rows, raw_for_quantiles


@dataclass(frozen=True)
class HeadSettings:
    hidden: Tuple[int, ...] = ()  # hidden widths; () is a linear head
    outputs: int = 1  # 1: regression (MSE); more: classification (cross-entropy) over that many classes
    max_epochs: int = 300
    patience: int = 20  # epochs without a better validation loss before stopping
    lr: float = 1e-3
    weight_decay: float = 1e-2
    batch_size: int = 256
    validation_share: float = 0.2  # of the training requests


@dataclass
class FittedHead:
    model: nn.Module
    epochs: int  # chosen on validation; 0 means the mean target was never beaten
    validation_loss: float
    validation_requests: int

    def info(self) -> Dict[str, Any]:
        return {"epochs": self.epochs, "validation_loss": round(self.validation_loss, 6),
                "validation_requests": self.validation_requests}


class Standardised(nn.Module):
    def __init__(self, inputs: torch.Tensor, body: nn.Module) -> None:
        super().__init__()
        self.register_buffer("mean", inputs.mean(0))
        self.register_buffer("std", inputs.std(0, unbiased=False).clamp_min(1e-6))
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body((x.float() - self.mean) / self.std)

    @torch.no_grad()
    def folded(self) -> nn.Sequential:
        """A copy of the body that reads raw inputs: the standardisation folded into its first layer
        (``W' = W / std``, ``b' = b - W' mean``), for a module that must keep the body's shape."""
        body = copy.deepcopy(self.body)
        first = body[0]
        assert isinstance(first, nn.Linear), first
        first.weight.div_(self.std[None, :])
        first.bias.sub_(first.weight @ self.mean)
        return body


def mlp(inputs: int, hidden: Sequence[int], outputs: int) -> nn.Sequential:
    layers, width = [], inputs
    for size in hidden:
        layers += [nn.Linear(width, size), nn.ReLU()]
        width = size
    layers.append(nn.Linear(width, outputs))
    return nn.Sequential(*layers)


class HeadLoss:
    """A head's training loss per row, and the constant output it starts from."""

    outputs: int

    def rows(self, out: torch.Tensor, y: torch.Tensor, censored: torch.Tensor) -> torch.Tensor:
        """[N, outputs] outputs, [N] targets and censoring flags -> [N] losses."""
        raise NotImplementedError

    def initialise(self, last: nn.Linear, y: torch.Tensor, weights: torch.Tensor) -> None:
        """Set the output layer's bias to the best constant of these (uncensored) targets."""
        raise NotImplementedError


class SquaredError(HeadLoss):
    """Regression: ``(out - y)^2``; censored rows ``relu(y - out)^2``."""

    outputs = 1

    def rows(self, out, y, censored):
        error = out.squeeze(-1) - y.float()
        return torch.where(censored, nn.functional.relu(-error), error) ** 2

    def initialise(self, last, y, weights):
        last.bias.fill_(float((y.float() * weights).sum() / weights.sum()))


class CrossEntropy(HeadLoss):
    """Classes: ``-log P(y)``; censored rows ``-log P(class >= y)``."""

    def __init__(self, outputs: int) -> None:
        self.outputs = outputs

    def rows(self, out, y, censored):
        log_p = nn.functional.log_softmax(out, dim=-1)
        return -torch.where(censored, tail_log_probability(log_p, y.long()), log_p.gather(-1, y.long()[:, None]).squeeze(-1))

    def initialise(self, last, y, weights):  # Laplace-smoothed, so a class absent from training stays reachable
        counts = torch.bincount(y.long(), weights=weights, minlength=self.outputs).float()
        last.bias.copy_(torch.log((counts + 1) / (counts.sum() + self.outputs)))


class Pinball(HeadLoss):
    """Quantiles of the target at ``levels``, with the output form and loss of OUTLETS' quantile head (``model/quantile_head.py``):
    non-crossing outputs, the pinball loss, censored rows one-sided."""

    def __init__(self, levels: Sequence[float]) -> None:
        self.levels = tuple(levels)
        self.outputs = len(self.levels)

    @staticmethod
    def quantiles(out: torch.Tensor) -> torch.Tensor:  # [N, K] raw -> [N, K] non-decreasing
        return QuantileHead.log_remaining_quantiles(out)

    def rows(self, out, y, censored):
        return pinball_rows(self.quantiles(out), y, self.levels, censored)

    def initialise(self, last, y, weights):
        last.bias.copy_(raw_for_quantiles(constant_quantiles(y.float(), weights, self.levels)))


def fit_head(
    x: torch.Tensor,  # [N, D]
    y: torch.Tensor,  # [N] float targets (regression) or int64 classes
    settings: HeadSettings,
    *,
    seed: int,
    groups: Optional[torch.Tensor] = None,  # [N] request index of each row (default: one request per row)
    sample_weight: Optional[torch.Tensor] = None,  # [N]
    censored: Optional[torch.Tensor] = None,  # [N] bool: y is a lower bound
    loss: Optional[HeadLoss] = None,  # default: squared error for 1 output, cross-entropy for more
) -> FittedHead:
    loss = loss or (SquaredError() if settings.outputs == 1 else CrossEntropy(settings.outputs))
    assert loss.outputs == settings.outputs, (loss.outputs, settings.outputs)
    x = x.float()
    groups = torch.arange(len(x)) if groups is None else groups
    weights = torch.ones(len(x)) if sample_weight is None else sample_weight.float()
    censored = torch.zeros(len(x), dtype=torch.bool) if censored is None else censored.bool()
    held = validation_rows(groups, settings.validation_share, seed)
    kept = ~held
    _, losses = _train(x[kept], y[kept], weights[kept], censored[kept], settings, loss, seed, settings.max_epochs,
                       validation=(x[held], y[held], weights[held], censored[held]))
    best = min(range(len(losses)), key=losses.__getitem__)
    model, _ = _train(x, y, weights, censored, settings, loss, seed, best)
    return FittedHead(model, best, losses[best], int(groups[held].unique().numel()))


def validation_rows(groups: torch.Tensor, share: float, seed: int) -> torch.Tensor:
    """A boolean mask of the rows of a seeded ``share`` of the groups (at least one group)."""
    unique = groups.unique()
    if unique.numel() < 2:
        raise OutletsError(
            f"the training split has {unique.numel()} labelled request(s): choosing epochs on validation needs "
            "at least 2; capture more training responses (--train-features)"
        )
    count = min(max(1, round(share * unique.numel())), unique.numel() - 1)
    chosen = unique[torch.randperm(unique.numel(), generator=torch.Generator().manual_seed(seed))[:count]]
    return torch.isin(groups, chosen)


def _weighted(loss: HeadLoss, out, y, weights, censored) -> torch.Tensor:
    return (loss.rows(out, y, censored) * weights).sum() / weights.sum()


def _train(x, y, weights, censored, settings: HeadSettings, loss: HeadLoss, seed: int, epochs: int,
           validation: Optional[Tuple[torch.Tensor, ...]] = None) -> Tuple[nn.Module, List[float]]:
    """Train for ``epochs``; with ``validation``, its loss after each epoch (index 0: before training)."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = Standardised(x, mlp(x.shape[1], settings.hidden, settings.outputs))
    with torch.no_grad():  # start at the best constant: zero last-layer weights, the constant's bias
        model.body[-1].weight.zero_()
        loss.initialise(model.body[-1], y[~censored], weights[~censored])
    optimiser = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    losses: List[float] = []

    def validate() -> bool:
        """Record the validation loss; False once ``patience`` epochs passed without a better one."""
        if validation is None:
            return True
        with torch.no_grad():
            losses.append(float(_weighted(loss, model(validation[0]), *validation[1:])))
        best = min(range(len(losses)), key=losses.__getitem__)
        return len(losses) - 1 - best < settings.patience

    validate()
    for _ in range(epochs):
        for batch in torch.randperm(len(x), generator=generator).split(settings.batch_size):
            batch_loss = _weighted(loss, model(x[batch]), y[batch], weights[batch], censored[batch])
            optimiser.zero_grad()
            batch_loss.backward()
            optimiser.step()
        if not validate():
            break
    return model.eval(), losses
