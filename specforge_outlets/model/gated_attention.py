"""Gated attention, "G1" variant (Qiu et al. 2025, "Gated Attention for Large Language Models").

The attention output, before ``o_proj``, is multiplied elementwise by sigmoid(W_g x + b_g), one
gate per head channel, where x is the attention layer's input. SpecForge's EAGLE-3 draft has four
attention backends (sdpa, flex, flash, USP) that all end in ``self.o_proj(attn_output)``; gating
at the input of ``o_proj`` covers every backend without copying any of them.
"""

from __future__ import annotations

import torch
import torch.nn as nn


class GatedOutputProjection(nn.Linear):
    """``o_proj`` that multiplies its input by the gate its attention layer computed for this call.

    A subclass of ``nn.Linear`` so the weight keeps its EAGLE-3 name (``self_attn.o_proj.weight``).
    """

    pending_gate: torch.Tensor | None = None

    def forward(self, attn_output: torch.Tensor) -> torch.Tensor:  # [B, T, n_heads * head_dim]
        gate, self.pending_gate = self.pending_gate, None
        assert gate is not None, "o_proj called outside its gated attention layer's forward"
        assert gate.shape == attn_output.shape, (gate.shape, attn_output.shape)
        return super().forward(attn_output * gate)


def _compute_gate(attention: nn.Module, args: tuple, kwargs: dict) -> None:
    hidden_states = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]  # [B, T, 2H]
    attention.o_proj.pending_gate = torch.sigmoid(attention.gate_proj(hidden_states))


def add_output_gate(attention: nn.Module, input_size: int) -> None:
    """Give an EAGLE-3 attention module a head-specific sigmoid output gate, in place."""
    o_proj = attention.o_proj
    gated = GatedOutputProjection(
        o_proj.in_features, o_proj.out_features, bias=o_proj.bias is not None,
        device=o_proj.weight.device, dtype=o_proj.weight.dtype,
    )
    gated.load_state_dict(o_proj.state_dict())
    attention.o_proj = gated
    attention.gate_proj = nn.Linear(
        input_size, o_proj.in_features, bias=True,
        device=o_proj.weight.device, dtype=o_proj.weight.dtype,
    )
    attention.register_forward_pre_hook(_compute_gate, with_kwargs=True)
