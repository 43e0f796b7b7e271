"""The length head: a small MLP on the draft state that predicts z_t = log(1 + remaining tokens).

Widths shrink progressively (default H -> H/2 -> H/4 -> out) with ReLU between. Two output kinds
share one interface, so the ablation is a setting and not a code path: regression outputs z
directly; bucket classification outputs logits over length buckets and z is their expectation.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn as nn


class LengthHead(nn.Module):
    def __init__(self, widths: Sequence[int], bucket_edges: Sequence[int] | None = None):
        super().__init__()
        widths = list(widths)
        assert len(widths) >= 2 and all(w > 0 for w in widths), widths
        self.num_buckets = 0 if bucket_edges is None else len(bucket_edges) + 1
        outputs = self.num_buckets or 1
        layers: list[nn.Module] = []
        for width_in, width_out in zip(widths, widths[1:]):
            layers += [nn.Linear(width_in, width_out), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], outputs))
        self.mlp = nn.Sequential(*layers)
        if bucket_edges is not None:
            self.register_buffer(
                "bucket_log_centers", bucket_log_centers(bucket_edges), persistent=False
            )

    @torch.no_grad()
    def init_output_bias(self, bias: torch.Tensor) -> None:
        """Start the head at a constant prediction (``training.objective.constant_fit``)."""
        output = self.mlp[-1]
        output.bias.copy_(bias.to(output.bias))

    def forward(self, state: torch.Tensor) -> torch.Tensor:  # [B, T, H] -> [B, T, out]
        return self.mlp(state)

    def log_remaining(self, raw: torch.Tensor) -> torch.Tensor:  # [B, T, out] -> [B, T]
        """Predicted z = log(1 + remaining tokens)."""
        if self.num_buckets == 0:
            return raw.squeeze(-1)
        probs = torch.softmax(raw.float(), dim=-1)
        return probs @ self.bucket_log_centers.to(probs.device)


def bucket_log_centers(edges: Sequence[int]) -> torch.Tensor:
    """log(1 + r) at the geometric centre of each bucket [0, e0), [e0, e1), ..., [e_last, 2 e_last)."""
    edges = [int(e) for e in edges]
    assert edges == sorted(set(edges)) and edges[0] > 0, f"bucket edges must increase: {edges}"
    bounds = [1, *edges, 2 * edges[-1]]
    centers = [math.sqrt(lo * hi) for lo, hi in zip(bounds, bounds[1:])]
    return torch.tensor([math.log1p(c) for c in centers], dtype=torch.float32)


def bucket_index(remaining: torch.Tensor, edges: Sequence[int]) -> torch.Tensor:
    """The bucket of each true remaining length (int64, same shape)."""
    return torch.bucketize(remaining, torch.tensor(list(edges), device=remaining.device), right=True)


def tail_log_probability(log_p: torch.Tensor, buckets: torch.Tensor) -> torch.Tensor:
    """``log P(bucket >= buckets[i])`` per row of ``[N, K]`` log-probabilities: a censored length's likelihood."""
    at_or_above = torch.arange(log_p.shape[-1], device=log_p.device)[None, :] >= buckets[:, None]
    return torch.logsumexp(log_p.masked_fill(~at_or_above, float("-inf")), dim=-1)


def log_remaining_to_tokens(z: torch.Tensor) -> torch.Tensor:
    """Invert z = log(1 + r), clamped at zero tokens."""
    return torch.expm1(z.float()).clamp_min(0.0)
