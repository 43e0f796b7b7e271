"""Pooling the target's prefill states by token importance: what EGTP and ESTP read.

A probe reads one state (the last prompt position). EGTP and ESTP pool every prompt position,
weighting a token by how much it says about the answer: its entropy (the target's uncertainty
about the next token there, ``H_i = -sum_v p_v log p_v`` from the target's own LM head on the
state) and, for ESTP, the attention later tokens pay it. A running pool (cumulative sums, so
position ``j`` pools ``0 .. j``) extends the same weighting over the tokens generated so far, for
EGTP's progressive re-prediction.

Entropies need the whole vocabulary at every position, the costliest step; ``EntropyCache``
computes a file's once for both predictors.
"""

from __future__ import annotations

from typing import Dict

import torch

# Positions whose entropies are computed at once (bounds the [chunk, vocab] logits in memory).
ENTROPY_CHUNK = 512


class EntropyCache:
    """Per feature file, the entropy of the target's next-token distribution at every position."""

    def __init__(self, target_path: str) -> None:
        from specforge_outlets.evaluation.drafting import load_target_head

        self.head = load_target_head(target_path)
        self.by_file: Dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def entropies(self, path: str, hidden_state: torch.Tensor) -> torch.Tensor:
        """[T, H] last hidden states (after the final norm) -> [T] entropies in nats."""
        if path not in self.by_file:
            parts = []
            for chunk in hidden_state.float().split(ENTROPY_CHUNK):
                log_p = torch.log_softmax(self.head.fc(chunk), dim=-1)  # [chunk, V]
                parts.append(-(log_p.exp() * log_p).sum(-1))
            self.by_file[path] = torch.cat(parts)
        return self.by_file[path]


def pool(states: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """[T, H] states, [T] non-negative weights -> [H] their weighted mean."""
    assert states.shape[0] == weights.shape[0] and bool((weights >= 0).all())
    return (weights[:, None] * states.float()).sum(0) / weights.sum().clamp_min(1e-12)


def running_pool(states: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """[T, H], [T] -> [T, H]: row ``j`` is ``pool(states[: j + 1], weights[: j + 1])``."""
    numerator = torch.cumsum(weights[:, None] * states.float(), dim=0)
    return numerator / torch.cumsum(weights, dim=0)[:, None].clamp_min(1e-12)


def entropy_weights(entropies: torch.Tensor) -> torch.Tensor:
    """EGTP's weights: ``softmax(H)`` over the pooled positions, as unnormalised ``exp(H - max H)``."""
    return torch.exp(entropies - entropies.max())
