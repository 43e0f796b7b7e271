"""Length predictions of an OUTLETS draft over captured features, outside training.

One draft step over the whole sequence, the way EAGLE-3 runs at prefill: position j reads the
target's fused features at j and the embedding of token j + 1, so its ``log_remaining`` is z of r̂ for the
label at j + 1 (the state at the last prompt position predicts the full response length, r̂₀).
"""

from __future__ import annotations

import torch

from specforge_outlets.data.labels import shift_left
from specforge_outlets.model.draft_config import HeadInput


@torch.no_grad()
def draft_states(draft, input_ids: torch.Tensor, aux_hidden_state: torch.Tensor) -> torch.Tensor:
    """[B, T] ids and [B, T, 3H_target] draft input (``target_features.draft_input``) -> [B, T, H] states the
    length head reads."""
    fused = draft.project_hidden_states(aux_hidden_state.to(draft.fc.weight.dtype))  # [B, T, H]
    if draft.outlets.head_input is HeadInput.FUSED:
        return fused
    batch, seq_len, _ = fused.shape
    next_ids = shift_left(input_ids, 1).clamp_min(0)  # token j + 1 at position j (0 past the end)
    embeds = draft.embed_input_ids(next_ids).to(fused.dtype)
    mask = draft.prepare_decoder_attention_mask(
        attention_mask=torch.ones(batch, seq_len, dtype=torch.bool, device=fused.device),
        hidden_states=fused,
        batch_size=batch,
        seq_length=seq_len,
        past_key_values_length=0,
    )
    positions = torch.arange(seq_len, device=fused.device).unsqueeze(0)
    return draft.backbone(
        input_embeds=embeds,
        hidden_states=fused,
        cache_hidden=[[], []],
        attention_mask=mask,
        position_ids=positions,
    )


@torch.no_grad()
def predict_log_remaining(draft, input_ids: torch.Tensor, aux_hidden_state: torch.Tensor) -> torch.Tensor:
    """[B, T] z = log(1 + predicted remaining tokens); compare with ``shift_left(labels, 1)``."""
    return draft.predict_log_remaining(draft_states(draft, input_ids, aux_hidden_state)).float()


@torch.no_grad()
def labelled_predictions(draft, features: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(predicted remaining tokens, true remaining tokens) at the labelled positions of one file."""
    from specforge_outlets.data.labels import NO_LABEL
    from specforge_outlets.model.length_head import log_remaining_to_tokens

    from specforge_outlets.model.target_features import captured_input

    z = predict_log_remaining(draft, features["input_ids"][None], captured_input(features, draft.outlets))[0]
    labels = shift_left(features["remaining_length"][None], 1)[0]
    labelled = labels != NO_LABEL
    return log_remaining_to_tokens(z[labelled]), labels[labelled]
