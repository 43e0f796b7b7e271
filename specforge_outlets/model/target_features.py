"""What the draft reads from the target: the fused depths (the method) or the last layer alone (ablation).

EAGLE-1/2 drafted from the target's last layer; EAGLE-3 fuses three depths. The ablation keeps the
draft's shape and SpecForge's classes: the last layer fills the top third of the fused input and
the lower two thirds are zero, so the fc columns that read them get no gradient and the draft is an
H -> H map of the last layer followed by the same decoder. Training, evaluation and the refitted
heads all build the input here, so a draft is always read the way it was trained.
"""

from __future__ import annotations

from typing import Dict

import torch

from specforge_outlets.model.draft_config import OutletsDraftConfig, TargetFeatures


def draft_input(aux_hidden_state: torch.Tensor, last_hidden_state: torch.Tensor,
                which: TargetFeatures) -> torch.Tensor:
    """[..., 3H] fused depths and [..., H] last layer -> the [..., 3H] input of the draft's fc."""
    if which is TargetFeatures.FUSED:
        return aux_hidden_state
    hidden = last_hidden_state.shape[-1]
    assert aux_hidden_state.shape[-1] == 3 * hidden, f"{tuple(aux_hidden_state.shape)} is not 3 x {hidden} wide"
    lower = torch.zeros(*last_hidden_state.shape[:-1], 2 * hidden, dtype=aux_hidden_state.dtype,
                        device=aux_hidden_state.device)
    return torch.cat([lower, last_hidden_state.to(aux_hidden_state.dtype)], dim=-1)  # [..., 3H]


def captured_input(features: Dict[str, torch.Tensor], outlets: OutletsDraftConfig) -> torch.Tensor:
    """The draft's [1, T, 3H] input from a capture file (``data/features.py``: hidden_state is the last layer)."""
    return draft_input(features["aux_hidden_state"], features["hidden_state"], outlets.target_features)
