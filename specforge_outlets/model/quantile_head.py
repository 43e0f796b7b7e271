"""The quantile head: quantiles of z = log(1 + remaining tokens) at fixed levels, from the draft state.

Why a distribution and not one number: SmolLM2 at temperature 0.7 answers one prompt with lengths
so far apart that the median of a prompt's other samples predicts a sample barely better than a
global constant (docs/results.md), so a point estimate cannot get much better; a scheduler can
still use the spread (how long the tail may run, how much KV to hold). Quantiles (pinball loss)
rather than a parametric law: they need no assumption about the shape, which here is skewed and
cut at the token limit, and a censored response enters them exactly (:func:`pinball_rows`).

Non-crossing by construction: the head outputs the lowest quantile and softplus increments, so
q_1 <= q_2 <= ... at every input, not only on the training data. Widths shrink as the length
head's (H -> H/2 -> H/4 -> K).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F


def check_levels(levels: Sequence[float]) -> tuple:
    """Quantile levels as a tuple, or a ValueError: strictly increasing, inside (0, 1)."""
    levels = tuple(float(level) for level in levels)
    if len(levels) < 2 or list(levels) != sorted(set(levels)) or not all(0 < level < 1 for level in levels):
        raise ValueError(f"quantile levels must be at least two strictly increasing numbers in (0, 1), got {list(levels)}")
    return levels


class QuantileHead(nn.Module):
    def __init__(self, widths: Sequence[int], levels: Sequence[float], shifts: Optional[Sequence[float]] = None):
        """``shifts``: per level, added to z when served (``outlets_config.quantile_shifts``: the split-conformal
        correction ``outlets fit-quantile-head --calibration-features`` fits); training reads the raw quantiles."""
        super().__init__()
        widths = list(widths)
        assert len(widths) >= 2 and all(w > 0 for w in widths), widths
        self.levels = check_levels(levels)
        shifts = [0.0] * len(self.levels) if shifts is None else [float(shift) for shift in shifts]
        assert len(shifts) == len(self.levels), (shifts, self.levels)
        self.register_buffer("shifts", torch.tensor(shifts, dtype=torch.float32), persistent=False)  # [K], not a weight
        layers: list[nn.Module] = []
        for width_in, width_out in zip(widths, widths[1:]):
            layers += [nn.Linear(width_in, width_out), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], len(self.levels)))
        self.mlp = nn.Sequential(*layers)

    @torch.no_grad()
    def init_output_bias(self, z_quantiles: torch.Tensor) -> None:
        """Start at these constant z quantiles (non-decreasing [K]): the best constant of the pinball loss."""
        assert z_quantiles.shape == (len(self.levels),), z_quantiles
        self.mlp[-1].bias.copy_(raw_for_quantiles(z_quantiles).to(self.mlp[-1].bias))

    def forward(self, state: torch.Tensor) -> torch.Tensor:  # [B, T, H] -> [B, T, K] raw
        return self.mlp(state)

    def served_quantiles(self, raw: torch.Tensor) -> torch.Tensor:  # [..., K] -> [..., K] non-decreasing z
        """The z quantiles a scheduler reads: the raw ones shifted, kept non-decreasing (shifts differ by level)."""
        shifted = self.log_remaining_quantiles(raw) + self.shifts.float().to(raw.device)
        return torch.cummax(shifted, dim=-1).values

    @staticmethod
    def log_remaining_quantiles(raw: torch.Tensor) -> torch.Tensor:  # [..., K] -> [..., K] non-decreasing z
        """z quantiles: the lowest, then cumulative softplus steps."""
        raw = raw.float()
        return torch.cat([raw[..., :1], raw[..., :1] + torch.cumsum(F.softplus(raw[..., 1:]), dim=-1)], dim=-1)


def raw_for_quantiles(z_quantiles: torch.Tensor) -> torch.Tensor:  # [K] -> [K]
    """The raw outputs whose ``log_remaining_quantiles`` are these non-decreasing z quantiles."""
    z = z_quantiles.float()
    assert bool((z[1:] >= z[:-1]).all()), z
    steps = (z[1:] - z[:-1]).clamp_min(1e-3)
    return torch.cat([z[:1], steps + torch.log(-torch.expm1(-steps))])  # softplus^-1 of each step


def pinball_rows(z_pred: torch.Tensor, z_true: torch.Tensor, levels: Sequence[float],
                 censored: torch.Tensor) -> torch.Tensor:
    """[N, K] predicted z quantiles, [N] targets and censoring flags -> [N] pinball losses, summed over levels.

    A censored row's target is a lower bound c (the response was cut at the token limit): only a
    quantile below c is penalised, tau (c - q); above c nothing is known. With one cap for every
    response this is Powell's censored quantile regression, whose minimiser is the true quantile
    wherever it lies below the cap.
    """
    tau = torch.tensor(list(levels), dtype=torch.float32, device=z_pred.device)[None, :]  # [1, K]
    error = z_true.float()[:, None] - z_pred.float()  # [N, K]: > 0 when the quantile is below the target
    loss = torch.maximum(tau * error, (tau - 1) * error)
    one_sided = tau * F.relu(error)
    return torch.where(censored[:, None], one_sided, loss).sum(-1)


def constant_quantiles(z: torch.Tensor, weights: torch.Tensor, levels: Sequence[float]) -> torch.Tensor:
    """Weighted empirical quantiles of z at ``levels`` [K] (the constant that minimises the pinball loss)."""
    order = torch.argsort(z.double())
    z, weights = z.double()[order], weights.double()[order]
    cumulative = torch.cumsum(weights, 0) / weights.sum()
    index = torch.searchsorted(cumulative, torch.tensor(list(levels), dtype=torch.float64)).clamp_max(len(z) - 1)
    return z[index].float()
