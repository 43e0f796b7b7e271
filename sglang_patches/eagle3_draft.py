"""The OUTLETS draft as an SGLang model class: ``OutletsLlamaForCausalLMEagle3`` (SGLang 0.5.23).

An ``outlets export`` directory names this architecture in its config.json. The class subclasses
SGLang's own EAGLE-3 draft (``sglang.srt.models.llama_eagle3.LlamaForCausalLMEagle3``) and adds
only what OUTLETS trained on top of it:

- the **G1 gate** (``outlets_config.gated_attention``): ``self_attn.gate_proj``, an SGLang
  ``ColumnParallelLinear`` (2H -> heads * head_dim, bias) on the same attention input as q/k/v;
  ``sigmoid(gate_proj(x))`` multiplies the attention output elementwise at the input of
  ``o_proj``. As on the training side (``specforge_outlets/model/gated_attention.py``) the gate is
  applied by hooks around the stock attention (a pre-hook on ``self_attn`` computes it, a pre-hook
  on ``o_proj`` applies it), so no attention code is copied and every attention backend is covered.
  No gate module exists when the export was trained without one.
- the **length head** ``length_head.mlp`` (Linear/ReLU stack from ``outlets_config.head_widths``,
  one output, or one logit per bucket for ``bucket_edges``), reading the same final-normed draft
  state as the LM head; :meth:`OutletsLlamaForCausalLMEagle3.length_log_remaining` turns that state
  into ``z = log(1 + remaining tokens)``.
- the **quantile head** ``quantile_head.mlp`` (a predicted length distribution; only when
  ``outlets_config.quantile_levels`` is set), on the same state:
  :meth:`OutletsLlamaForCausalLMEagle3.log_remaining_quantiles_from_draft_state` gives the z quantiles of
  the remaining length at those levels.
- **weight routing**: SGLang's EAGLE-3 ``load_weights`` would rename ``self_attn.gate_proj`` to the
  MLP's ``gate_up_proj`` and skip it, and skips ``length_head.*`` (and ``quantile_head.*``) silently; here those names are
  loaded into this class's modules and the rest go to the stock loader. A missing weight of the
  export (gate, length head, or a stock EAGLE-3 weight) is refused with a message naming it.

:func:`register` adds the class to SGLang's ``ModelRegistry`` (``ModelRegistry.models[name] = cls``,
SGLang's documented way to register an external model implementation); the plugin's
:func:`sglang_patches.load` calls it in every process SGLang starts.
"""

from __future__ import annotations

import logging
from typing import Iterable, List, Optional, Set, Tuple

import torch
from torch import nn

from sglang.srt.layers.linear import ColumnParallelLinear
from sglang.srt.layers.quantization.base_config import QuantizationConfig
from sglang.srt.model_loader.weight_utils import default_weight_loader
from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3
from sglang.srt.utils import add_prefix

from specforge_outlets.model.draft_config import OutletsDraftConfig
from specforge_outlets.model.length_head import LengthHead
from specforge_outlets.model.quantile_head import QuantileHead
from specforge_outlets.model.draft_modes import eagle3_refusal, target_features_refusal
from sglang_patches.settings import DRAFT_ARCHITECTURE

logger = logging.getLogger("sglang_patches")

ARCHITECTURE = DRAFT_ARCHITECTURE

# Names of the export's stock EAGLE-3 tensors (``outlets export`` / SpecForge's serving state).
_STOCK_LAYER_WEIGHTS = (
    "midlayer.hidden_norm.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.post_attention_layernorm.weight",
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
)
GATE_WEIGHTS = ("midlayer.self_attn.gate_proj.weight", "midlayer.self_attn.gate_proj.bias")
_PENDING_GATE = "outlets_pending_gate"


class OutletsDraftError(ValueError):
    """An OUTLETS export that this class cannot load (config or weights)."""


def _outlets_config(config) -> OutletsDraftConfig:
    outlets = getattr(config, "outlets_config", None)
    if not isinstance(outlets, dict):
        raise OutletsDraftError(
            f"{ARCHITECTURE}: config.json has no outlets_config (not an `outlets export` directory)"
        )
    try:
        return OutletsDraftConfig.from_dict(outlets)  # the one parser of the block
    except (KeyError, TypeError, ValueError, AssertionError) as error:
        raise OutletsDraftError(f"{ARCHITECTURE}: outlets_config {outlets} is malformed ({type(error).__name__}: "
                                f"{error}); re-export the draft with `outlets export`") from None


def _compute_gate(attention: nn.Module, args: tuple, kwargs: dict) -> None:
    # SGLang's LlamaAttention.forward(positions, hidden_states, forward_batch); the EAGLE-3 layer
    # passes keywords. hidden_states is the [tokens, 2H] concat(embeds, hidden) q/k/v read.
    hidden_states = kwargs["hidden_states"] if "hidden_states" in kwargs else args[1]
    gate, _ = attention.gate_proj(hidden_states)
    setattr(attention.o_proj, _PENDING_GATE, torch.sigmoid(gate))


def _apply_gate(o_proj: nn.Module, args: tuple) -> tuple:
    gate = getattr(o_proj, _PENDING_GATE, None)
    if gate is None:
        raise RuntimeError(f"{ARCHITECTURE}: o_proj called outside its gated attention's forward")
    setattr(o_proj, _PENDING_GATE, None)
    attn_output = args[0]  # [tokens, heads * head_dim / tp]
    if gate.shape != attn_output.shape:
        raise RuntimeError(f"{ARCHITECTURE}: gate shape {tuple(gate.shape)} != attention output "
                           f"{tuple(attn_output.shape)}")
    return (attn_output * gate, *args[1:])


def add_output_gate(attention: nn.Module, input_size: int, prefix: str = "") -> None:
    """Give SGLang's LlamaAttention a G1 output gate, in place (gate_proj + hooks around o_proj)."""
    attention.gate_proj = ColumnParallelLinear(
        input_size,
        attention.total_num_heads * attention.head_dim,
        bias=True,
        gather_output=False,  # sharded by heads like q, matching o_proj's (row-parallel) input
        quant_config=None,  # the gate is trained and exported unquantised
        prefix=add_prefix("gate_proj", prefix),
    )
    setattr(attention.o_proj, _PENDING_GATE, None)
    attention.register_forward_pre_hook(_compute_gate, with_kwargs=True)
    attention.o_proj.register_forward_pre_hook(_apply_gate)


class OutletsLlamaForCausalLMEagle3(LlamaForCausalLMEagle3):
    """SGLang's Llama EAGLE-3 draft + the OUTLETS gate and length head (see the module docstring)."""

    def __init__(
        self,
        config,
        quant_config: Optional[QuantizationConfig] = None,
        prefix: str = "",
    ) -> None:
        outlets = _outlets_config(config)
        refusal = target_features_refusal(outlets)  # drafting itself would read the wrong input: no mode serves it
        if refusal is not None:
            raise OutletsDraftError(f"{ARCHITECTURE}: {refusal}")
        if int(getattr(config, "num_hidden_layers", 1)) != 1:
            raise OutletsDraftError(
                f"{ARCHITECTURE}: OUTLETS drafts have one decoder layer, config has "
                f"num_hidden_layers={config.num_hidden_layers}"
            )
        super().__init__(config, quant_config=quant_config, prefix=prefix)
        self.outlets_config = outlets
        self.gated_attention = outlets.gated_attention
        if self.gated_attention:
            layer = self.model.layers[0]
            add_output_gate(
                layer.self_attn,
                2 * config.hidden_size,  # the input layer's attention reads concat(embeds, hidden)
                prefix=add_prefix("layers.0.self_attn", add_prefix("model", prefix)),
            )
        hidden = int(config.hidden_size)
        widths = list(outlets.head_widths)
        if int(widths[0]) != hidden:
            raise OutletsDraftError(
                f"{ARCHITECTURE}: outlets_config.head_widths={list(widths)} must start at hidden_size {hidden}"
            )
        if len(widths) < 2 or any(int(w) <= 0 for w in widths):
            raise OutletsDraftError(f"{ARCHITECTURE}: outlets_config.head_widths={list(widths)} is not a valid MLP")
        # the training module itself (torch only), so that the names and the maths cannot drift
        self.length_head = LengthHead([int(w) for w in widths], outlets.bucket_edges)
        # the quantile head (the remaining length's quantiles), the training module too; None for an export without one
        self.quantile_head = (QuantileHead([int(w) for w in widths], outlets.quantile_levels, outlets.quantile_shifts)
                              if outlets.quantile_levels else None)

    # -- weights ----------------------------------------------------------------------------------------
    def expected_export_weights(self) -> List[str]:
        """The tensor names an `outlets export` of this config must contain.

        ``d2t`` (draft -> target token ids) is required when the draft vocabulary is smaller than the
        target's: without it every drafted id would be read as a target id."""
        names = ["fc.weight", "norm.weight", *_STOCK_LAYER_WEIGHTS]
        draft_vocab = getattr(self.config, "draft_vocab_size", None)
        if draft_vocab is not None and int(draft_vocab) < int(self.config.vocab_size):
            names.append("d2t")
        if self.model.fc_norm is not None:
            names += [f"fc_norm.{i}.weight" for i in range(len(self.model.fc_norm))]
        if not self.config.tie_word_embeddings and not self.load_lm_head_from_target:
            names.append("lm_head.weight")
        if self.gated_attention:
            names += list(GATE_WEIGHTS)
        names += [f"length_head.{name}" for name, _ in self.length_head.named_parameters()]
        if self.quantile_head is not None:
            names += [f"quantile_head.{name}" for name, _ in self.quantile_head.named_parameters()]
        return names

    def _outlets_param(self, name: str) -> Optional[str]:
        """Parameter name of an OUTLETS-only weight (gate, length head); None for stock weights."""
        if name.startswith("length_head."):
            return name
        if name.startswith("quantile_head."):
            if self.quantile_head is None:
                raise OutletsDraftError(
                    f"{ARCHITECTURE}: the weights hold {name} but outlets_config has no quantile_levels")
            return name
        if ".self_attn.gate_proj." in name:
            if not self.gated_attention:
                raise OutletsDraftError(
                    f"{ARCHITECTURE}: the weights hold {name} but outlets_config.gated_attention is false"
                )
            name = name.replace("midlayer.", "layers.0.")
            return name if name.startswith("model.") else f"model.{name}"
        return None

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters())
        seen: Set[str] = set()

        def stock_weights():
            for name, tensor in weights:
                seen.add(name)
                own = self._outlets_param(name)
                if own is None:
                    yield name, tensor
                    continue
                param = params.get(own)
                if param is None:
                    raise OutletsDraftError(
                        f"{ARCHITECTURE}: unexpected weight {name} (shape {tuple(tensor.shape)}) for "
                        f"outlets_config {self.outlets_config}"
                    )
                if tuple(param.shape) != tuple(tensor.shape) and not hasattr(param, "weight_loader"):
                    raise OutletsDraftError(
                        f"{ARCHITECTURE}: weight {name} has shape {tuple(tensor.shape)}, the model expects "
                        f"{tuple(param.shape)} (outlets_config.head_widths / bucket_edges)"
                    )
                getattr(param, "weight_loader", default_weight_loader)(param, tensor)

        super().load_weights(stock_weights())
        # Compare in the export's naming (``midlayer.``; SGLang also accepts ``[model.]layers.0.``).
        given = {name.removeprefix("model.").replace("layers.0.", "midlayer.") for name in seen}
        missing = [name for name in self.expected_export_weights() if name not in given]
        if missing:
            raise OutletsDraftError(
                f"{ARCHITECTURE}: the export lacks {missing} (outlets_config: "
                f"gated_attention={self.gated_attention}, head_widths={list(self.outlets_config.head_widths)}); "
                "re-export the checkpoint with `outlets export`"
            )

    # -- the length prediction --------------------------------------------------------------------------
    def length_log_remaining(self, states: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [...] z = log(1 + predicted remaining tokens), float32.

        ``states`` must be what the head was trained on, the state the LM head reads
        (``specforge_outlets.model.draft.normalized_state``): for ``head_input: draft`` (the default,
        with SpecForge's ``norm_output``) the final-normed draft state, i.e. the first output of
        ``self.model(...)``; for ``head_input: fused`` the ``fc`` projection of the target features,
        normed the same way.
        """
        raw = self.length_head(states.to(self.length_head.mlp[0].weight.dtype))
        return self.length_head.log_remaining(raw).float()

    def log_remaining_from_draft_state(self, draft_states: torch.Tensor) -> torch.Tensor:
        """[B, H] the recurrent draft state SGLang's EAGLE worker keeps -> [B] z, float32.

        The worker keeps what ``self.model`` returns as its aux output: the state before the final
        norm unless the config sets ``norm_output``. The head reads the normed state, one RMSNorm
        away, so EAGLE-3 mode costs this norm and the head's MLP per request, no second forward.
        Only a ``head_input: draft`` head reads this state (see :meth:`require_draft_state_head`).
        """
        states = draft_states if self.model.norm_output else self.model.norm(draft_states)
        return self.length_log_remaining(states)

    def log_remaining_quantiles_from_draft_state(self, draft_states: torch.Tensor) -> torch.Tensor:
        """[B, H] the worker's recurrent draft state -> [B, K] z quantiles of the remaining length, float32,
        at ``outlets_config.quantile_levels`` (non-decreasing; the export must have a quantile head)."""
        if self.quantile_head is None:
            raise OutletsDraftError(f"{ARCHITECTURE}: this export has no quantile head (outlets_config.quantile_levels)")
        states = draft_states if self.model.norm_output else self.model.norm(draft_states)
        raw = self.quantile_head(states.to(self.quantile_head.mlp[0].weight.dtype))
        return self.quantile_head.served_quantiles(raw).float()

    def require_draft_state_head(self) -> None:
        """Refuse EAGLE-3 mode for a head the speculative worker's draft state cannot feed (trained on the fused
        target features)."""
        refusal = eagle3_refusal(self.outlets_config)  # the rule `outlets export` prints its modes by
        if refusal is not None:
            raise OutletsDraftError(f"{ARCHITECTURE}: {refusal}")


def register() -> None:
    """Add the class to SGLang's ModelRegistry (resolved from the draft config's ``architectures``)."""
    from sglang.srt.models.registry import ModelRegistry

    ModelRegistry.models[ARCHITECTURE] = OutletsLlamaForCausalLMEagle3
