"""The OUTLETS objective: L = w_sd * L_SD + lambda * L_len + gamma * ||theta_len||^2.

L_SD is SpecForge's EAGLE-3 loss, unchanged. L_len is fitted on z = log(1 + remaining tokens) at
every labelled position of every training-time-test step, pooled: the mean squared error in log
space for the regression head, cross-entropy over length buckets for the bucket ablation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from specforge_outlets.data.labels import NO_LABEL
from specforge_outlets.model.length_head import LengthHead, bucket_index, log_remaining_to_tokens


@dataclass(frozen=True)
class LengthFit:
    """The length term of one batch and the sums behind its metrics (pooled over TTT steps)."""

    loss: torch.Tensor  # scalar, differentiable
    squared_error_sum: torch.Tensor  # of z, in log space
    abs_error_tokens_sum: torch.Tensor
    count: torch.Tensor


def fit_length(
    head: LengthHead,
    raw_outputs: Sequence[torch.Tensor],  # per TTT step: [B, T, out]
    labels: Sequence[torch.Tensor],  # per TTT step: [B, T] remaining tokens, NO_LABEL = unlabelled
    bucket_edges: Sequence[int] | None,
) -> LengthFit:
    raw = torch.cat([r[l != NO_LABEL] for r, l in zip(raw_outputs, labels)])  # [N, out]
    remaining = torch.cat([l[l != NO_LABEL] for l in labels])  # [N]
    count = remaining.new_tensor(remaining.numel(), dtype=torch.float32)
    z_true = torch.log1p(remaining.float())
    z_pred = head.log_remaining(raw).float()
    if remaining.numel() == 0:  # a batch of prompts only: no length signal, keep the graph
        zero = raw.sum() * 0.0
        return LengthFit(zero, zero.detach(), zero.detach(), count)
    if bucket_edges is None:
        loss = F.mse_loss(z_pred, z_true)
    else:
        loss = F.cross_entropy(raw.float(), bucket_index(remaining, bucket_edges))
    with torch.no_grad():
        squared = ((z_pred - z_true) ** 2).sum()
        abs_tokens = (log_remaining_to_tokens(z_pred) - remaining.float()).abs().sum()
    return LengthFit(loss, squared, abs_tokens, count)


def l2_penalty(head: LengthHead) -> torch.Tensor:
    """||theta_len||^2 over every parameter of the length MLP."""
    return sum((p.float() ** 2).sum() for p in head.parameters())


def total_loss(
    sd_loss: torch.Tensor,
    length_loss: torch.Tensor,
    l2: torch.Tensor,
    *,
    sd_loss_weight: float,
    length_loss_weight: float,
    length_l2_weight: float,
) -> torch.Tensor:
    return sd_loss_weight * sd_loss + length_loss_weight * length_loss + length_l2_weight * l2
