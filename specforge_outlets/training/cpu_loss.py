"""A torch path for SpecForge's EAGLE-3 loss where its Triton kernel cannot run (CPU tensors).

``LogSoftmaxLoss`` computes, per position, -sum_v p_target(v) * log softmax(logits)(v) where the
position mask is set (0 elsewhere) and averages over all B * T positions; its backward is the
gradient of that expression. The dispatcher keeps the kernel for CUDA tensors and uses the same
formula in plain torch otherwise; CUDA training is unchanged.
"""

from __future__ import annotations

import torch
from specforge.algorithms.eagle3 import model as eagle3_model
from specforge.core.loss import LogSoftmaxLoss


def reference_log_softmax_loss(
    logits: torch.Tensor,  # [B, T, V]
    target: torch.Tensor,  # [B, T, V] target probabilities
    position_mask: torch.Tensor,  # [B, T, 1]
) -> torch.Tensor:
    per_position = -(target.float() * torch.log_softmax(logits.float(), dim=-1)).sum(-1)  # [B, T]
    mask = position_mask.reshape(per_position.shape).bool()
    return torch.where(mask, per_position, torch.zeros_like(per_position)).mean()


class DeviceDispatchLogSoftmaxLoss:
    """Drop-in for ``LogSoftmaxLoss``: the Triton kernel on CUDA, the reference formula elsewhere."""

    @staticmethod
    def apply(logits: torch.Tensor, target: torch.Tensor, position_mask: torch.Tensor) -> torch.Tensor:
        if logits.is_cuda:
            return LogSoftmaxLoss.apply(logits, target, position_mask)
        return reference_log_softmax_loss(logits, target, position_mask)


def install_cpu_loss() -> None:
    """Point SpecForge's EAGLE-3 step at the dispatcher (idempotent)."""
    eagle3_model.LogSoftmaxLoss = DeviceDispatchLogSoftmaxLoss
