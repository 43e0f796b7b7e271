"""The OUTLETS draft model: SpecForge's EAGLE-3 Llama draft + gated attention + a length head.

Subclassing (not copying) ``LlamaForCausalLMEagle3`` keeps SpecForge's optimizer, checkpointing,
FSDP wrapping and vocabulary mapping in charge of the new parameters: they are ordinary
submodules of the draft.
"""

from __future__ import annotations

import os

import torch
from safetensors.torch import load_file
from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3
from specforge.modeling.draft.registry import register_draft
from transformers import LlamaConfig

from specforge_outlets.errors import OutletsError
from specforge_outlets.model.draft_config import QuantileMode, read_outlets_config
from specforge_outlets.model.gated_attention import add_output_gate
from specforge_outlets.model.length_head import LengthHead
from specforge_outlets.model.quantile_head import QuantileHead
from specforge_outlets.model.ttt_attention import use_ttt_cache_attention

DRAFT_ARCHITECTURE = "OutletsLlamaForCausalLMEagle3"


@register_draft(name=DRAFT_ARCHITECTURE)
class OutletsLlamaForCausalLMEagle3(LlamaForCausalLMEagle3):
    config_class = LlamaConfig
    # Set by the training model while its TTT forward runs: compute_logits then hands the state
    # through, and the loss applies the LM head only at the rows it reads (training/loss_rows.py).
    defer_logits: bool = False

    def __init__(self, config, quant_config=None, attention_backend="sdpa") -> None:
        super().__init__(config, quant_config=quant_config, attention_backend=attention_backend)
        self.outlets = read_outlets_config(config)
        if attention_backend == "sdpa":
            use_ttt_cache_attention(self.midlayer.self_attn)
        if self.outlets.gated_attention:
            add_output_gate(self.midlayer.self_attn, input_size=2 * config.hidden_size)
        self.length_head = LengthHead(self.outlets.head_widths, self.outlets.bucket_edges)
        levels = self.outlets.quantile_levels
        self.quantile_head = QuantileHead(self.outlets.head_widths, levels, self.outlets.quantile_shifts) if levels else None
        assert self.outlets.head_widths[0] == config.hidden_size, self.outlets.head_widths
        self._init_outlets_weights()

    def _init_outlets_weights(self) -> None:
        """Initialise only the modules added after ``post_init``, the way the draft's own are."""
        added = [self.length_head] + ([self.quantile_head] if self.quantile_head is not None else [])
        if self.outlets.gated_attention:
            added.append(self.midlayer.self_attn.gate_proj)
        for module in added:
            module.apply(self._init_weights)

    @classmethod
    def from_export(
        cls, directory: str, *, target_model_path: str | None = None, dtype: torch.dtype = torch.float32
    ) -> "OutletsLlamaForCausalLMEagle3":
        """Load an ``outlets export`` directory in plain PyTorch.

        Built eagerly rather than through ``from_pretrained``, whose meta-device initialisation
        leaves SpecForge's non-persistent rotary buffers unset. The embedding is the target's
        (exports omit it, as SGLang takes it from the target): pass ``target_model_path``.
        """
        weights = os.path.join(directory, "model.safetensors")
        if not os.path.isfile(weights):
            raise OutletsError(f"{directory} has no model.safetensors; is it an `outlets export` directory?")
        model = cls(LlamaConfig.from_pretrained(directory)).to(dtype)
        try:
            missing, unexpected = model.load_state_dict(load_file(weights), strict=False)
        except RuntimeError as exc:  # a tensor of another shape than config.json gives it (head widths, sizes)
            shapes = "; ".join(line.strip() for line in str(exc).splitlines()[1:])
            raise OutletsError(f"{weights} does not match its config.json: {shapes}; export it again") from None
        if unexpected or [key for key in missing if "embed" not in key]:
            raise OutletsError(f"{weights} does not match its config.json: missing {missing}, unexpected {unexpected}")
        if target_model_path is not None:
            model.load_embedding(target_model_path)
        return model.eval()

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:  # [B, T, H] -> [B, T, V'] (or [B, T, H])
        return hidden_states if self.defer_logits else super().compute_logits(hidden_states)

    def logits_at(self, states: torch.Tensor) -> torch.Tensor:  # [N, H] -> [N, V']
        """SpecForge's LM head on the rows a loss reads."""
        return super().compute_logits(states)

    def normalized_state(self, state: torch.Tensor) -> torch.Tensor:  # [B, T, H]
        """The state the LM head reads (``compute_logits``); the length head reads the same."""
        return self.norm(state) if self.norm_output else state

    def length_outputs(self, state: torch.Tensor) -> torch.Tensor:  # [B, T, H] -> [B, T, out]
        return self.length_head(self.normalized_state(state))

    def predict_log_remaining(self, state: torch.Tensor) -> torch.Tensor:  # [B, T, H] -> [B, T]
        """z_t = log(1 + predicted remaining tokens) from draft states (or fused features)."""
        return self.length_head.log_remaining(self.length_outputs(state))

    def quantile_outputs(self, state: torch.Tensor) -> torch.Tensor:  # [B, T, H] -> [B, T, K] raw
        """The quantile head on the normalised state; ``quantile_mode: detached`` stops the gradient there."""
        assert self.quantile_head is not None, "the draft has no quantile head (outlets.quantile_levels)"
        normalized = self.normalized_state(state)
        return self.quantile_head(normalized.detach() if self.outlets.quantile_mode is QuantileMode.DETACHED else normalized)

    def predict_log_remaining_quantiles(self, state: torch.Tensor) -> torch.Tensor:  # [B, T, H] -> [B, T, K]
        """Served z quantiles at ``outlets.quantile_levels`` from draft states, non-decreasing."""
        return self.quantile_head.served_quantiles(self.quantile_outputs(state))
