"""The OUTLETS draft's length prediction over a prompt, in plain PyTorch, from an `outlets export`.

Framework-free (torch and safetensors only): the serve environment has SGLang but not SpecForge
(their torch/transformers pins differ), so the draft's forward is written out here from the
export's config and weights: fc over the three fused target features (optional fc_norm), one
EAGLE-3 decoder layer (hidden_norm / input_layernorm, the
concatenated [embedding, hidden] attention input, rotary attention with grouped KV heads, the
OUTLETS sigmoid gate at the input of o_proj, MLP), the final norm, and the length head MLP. It
mirrors ``specforge_outlets.model.inference.draft_states`` (SpecForge's
``LlamaForCausalLMEagle3.backbone``) and is tested against it on the same export and features.
"""

from __future__ import annotations

import json
import math
import os
from typing import Dict

import torch
import torch.nn.functional as F

from specforge_outlets.errors import OutletsError
from specforge_outlets.model.draft_config import HeadInput, OutletsDraftConfig
from specforge_outlets.model.length_head import LengthHead, log_remaining_to_tokens
from specforge_outlets.model.quantile_head import QuantileHead


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope_theta(config: dict) -> float:
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        raise OutletsError(
            f"OUTLETS predictor-only mode supports default rotary embeddings; the draft uses {kind!r}"
        )
    return float(params.get("rope_theta") or config.get("rope_theta") or 10000.0)


def _loaded_head(head: torch.nn.Module, prefix: str, weights: Dict[str, torch.Tensor], directory: str, shape_field: str,
                 dtype: torch.dtype, device) -> torch.nn.Module:
    """``head`` with the export's ``prefix.*`` weights, on ``device``; a mismatch names the config fields that shape it."""
    own = {name[len(prefix) + 1:]: tensor for name, tensor in weights.items() if name.startswith(f"{prefix}.")}
    try:
        head.load_state_dict(own)
    except RuntimeError as error:
        raise OutletsError(f"--outlets-draft-path {directory}: {prefix.replace('_', ' ')} does not match "
                           f"outlets_config.head_widths / {shape_field} ({error})") from None
    return head.to(device=device, dtype=dtype)


class OutletsLengthPredictor:
    """Predicts the output length of a prompt from the target's fused features at prefill.

    Runs where the target runs: the draft's weights go to the device of ``embed_tokens``, the
    target's own token-embedding module, whose forward looks a token up in the full table (SGLang's
    ``VocabParallelEmbedding`` gathers it across tensor-parallel ranks; a weight slice would be one
    shard), so nothing is copied to the host on the scheduler's path.
    """

    def __init__(self, directory: str, embed_tokens: torch.nn.Module, dtype: torch.dtype = torch.float32) -> None:
        from safetensors.torch import load_file

        with open(os.path.join(directory, "config.json")) as handle:
            self.config = config = json.load(handle)
        self.outlets = OutletsDraftConfig.from_dict(config["outlets_config"])  # the one parser of the block
        self.fusion_layers = list(self.outlets.fusion_layers)
        self.head_input = self.outlets.head_input
        self.gated = self.outlets.gated_attention
        self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.kv_heads = int(config.get("num_key_value_heads") or self.heads)
        self.head_dim = int(config.get("head_dim") or self.hidden // self.heads)
        self.eps = float(config.get("rms_norm_eps", 1e-6))
        self.norm_output = bool(config.get("norm_output", True))
        self.theta = _rope_theta(config)
        self.target_hidden = int(config.get("target_hidden_size") or self.hidden)
        if config.get("hidden_act", "silu") != "silu":
            raise OutletsError(f"OUTLETS predictor-only mode supports silu drafts, got {config['hidden_act']!r}")
        weights = {}
        for name in sorted(os.listdir(directory)):
            if name.endswith(".safetensors"):
                weights.update(load_file(os.path.join(directory, name)))
        self.device = embed_tokens.weight.device
        required = ["fc.weight", "norm.weight", "length_head.mlp.0.weight", "midlayer.self_attn.q_proj.weight",
                    "midlayer.self_attn.o_proj.weight", "midlayer.mlp.down_proj.weight"]
        if self.gated:
            required.append("midlayer.self_attn.gate_proj.weight")
        missing = [key for key in required if key not in weights]
        if missing:
            raise OutletsError(f"--outlets-draft-path {directory}: weights lack {missing}")
        if int(embed_tokens.embedding_dim) != self.hidden:
            raise OutletsError(
                f"--outlets-draft-path {directory}: draft hidden size {self.hidden} != target embedding width "
                f"{embed_tokens.embedding_dim}"
            )
        self.embed_tokens = embed_tokens
        self.dtype = dtype
        # The training side's head modules, with the export's weights (the length head's bucket centres included).
        self.length_head = _loaded_head(LengthHead(list(self.outlets.head_widths), self.outlets.bucket_edges),
                                        "length_head", weights, directory, "bucket_edges", dtype, self.device)
        self.quantile_head = None  # an export trained with outlets.quantile_levels has one
        if self.outlets.quantile_levels:
            self.quantile_head = _loaded_head(
                QuantileHead(list(self.outlets.head_widths), self.outlets.quantile_levels, self.outlets.quantile_shifts),
                "quantile_head", weights,
                directory, "quantile_levels", dtype, self.device)
        # the rest of the draft, read by the forward below (the heads' tensors live in their modules only)
        self.w: Dict[str, torch.Tensor] = {
            k: v.to(device=self.device, dtype=dtype) for k, v in weights.items()
            if v.is_floating_point() and not k.startswith(("length_head.", "quantile_head."))}

    # -- the forward ------------------------------------------------------------------------------------
    def _linear(self, x, name, bias=False):
        weight = self.w[f"{name}.weight"]
        return F.linear(x, weight, self.w.get(f"{name}.bias") if bias else None)

    @torch.no_grad()
    def states(self, fused_features: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """[T, 3H_target] features and [T] ids of token j+1 -> [T, H] states the length head reads."""
        x = fused_features.to(self.dtype)
        if "fc_norm.0.weight" in self.w:
            chunks = x.chunk(3, dim=-1)
            x = torch.cat([_rms_norm(c, self.w[f"fc_norm.{i}.weight"], self.eps) for i, c in enumerate(chunks)], -1)
        fused = self._linear(x, "fc")  # [T, H]
        if self.head_input is HeadInput.FUSED:
            return fused
        T = fused.shape[0]
        emb = self.embed_tokens(next_ids.clamp_min(0)).to(self.dtype)
        p = "midlayer"
        residual = fused
        h = _rms_norm(fused, self.w[f"{p}.hidden_norm.weight"], self.eps)
        e = _rms_norm(emb, self.w[f"{p}.input_layernorm.weight"], self.eps)
        attn_in = torch.cat((e, h), dim=-1)  # [T, 2H]
        q = self._linear(attn_in, f"{p}.self_attn.q_proj").view(T, self.heads, self.head_dim).transpose(0, 1)
        k = self._linear(attn_in, f"{p}.self_attn.k_proj").view(T, self.kv_heads, self.head_dim).transpose(0, 1)
        v = self._linear(attn_in, f"{p}.self_attn.v_proj").view(T, self.kv_heads, self.head_dim).transpose(0, 1)
        device = fused.device
        steps = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device).float()
        inv_freq = 1.0 / (self.theta ** (steps / self.head_dim))
        freqs = torch.outer(torch.arange(T, dtype=torch.float32, device=device), inv_freq)
        emb_pos = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb_pos.cos().to(q.dtype), emb_pos.sin().to(q.dtype)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        groups = self.heads // self.kv_heads
        k = k.repeat_interleave(groups, dim=0)
        v = v.repeat_interleave(groups, dim=0)
        scores = (q @ k.transpose(1, 2)) / math.sqrt(self.head_dim)
        causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
        scores = scores.masked_fill(~causal, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        out = (probs @ v).transpose(0, 1).reshape(T, self.heads * self.head_dim)
        if self.gated:
            out = out * torch.sigmoid(self._linear(attn_in, f"{p}.self_attn.gate_proj", bias=True))
        h = residual + self._linear(out, f"{p}.self_attn.o_proj")
        residual = h
        m = _rms_norm(h, self.w[f"{p}.post_attention_layernorm.weight"], self.eps)
        m = self._linear(F.silu(self._linear(m, f"{p}.mlp.gate_proj")) * self._linear(m, f"{p}.mlp.up_proj"),
                         f"{p}.mlp.down_proj")
        return residual + m

    def normalized_state(self, states: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H]
        """The state the heads read (normalised as the LM head reads it)."""
        return _rms_norm(states, self.w["norm.weight"], self.eps) if self.norm_output else states

    @torch.no_grad()
    def log_remaining(self, states: torch.Tensor) -> torch.Tensor:
        """[T, H] -> [T] z = log(1 + predicted remaining tokens)."""
        return self.length_head.log_remaining(self.length_head(self.normalized_state(states))).float()

    @torch.no_grad()
    def log_remaining_quantiles(self, states: torch.Tensor) -> torch.Tensor:
        """[T, H] -> [T, K] served z quantiles at ``outlets.quantile_levels`` (the export must have a quantile head)."""
        assert self.quantile_head is not None, "this export has no quantile head (outlets.quantile_levels)"
        return self.quantile_head.served_quantiles(self.quantile_head(self.normalized_state(states)))

    @torch.no_grad()
    def prompt_log_remaining(self, fused_features: torch.Tensor, prompt_ids, first_token) -> torch.Tensor:
        """z of r̂_0, at the last prompt position reading the first sampled token: a 0-dim tensor where the target runs.

        ``first_token`` may be the sampler's tensor on the target's device; nothing here waits for the device.
        """
        prompt = torch.as_tensor(list(prompt_ids)[1:], dtype=torch.long).to(self.device, non_blocking=True)
        first = torch.as_tensor(first_token, dtype=torch.long).to(self.device).reshape(1)
        states = self.states(fused_features.to(self.device), torch.cat([prompt, first]))
        return self.log_remaining(states)[-1]

    def predict_output_len(self, fused_features: torch.Tensor, prompt_ids, first_token) -> float:
        """r̂_0 in tokens (waits for the device: for offline use and tests)."""
        value = float(log_remaining_to_tokens(self.prompt_log_remaining(fused_features, prompt_ids, first_token)))
        if not math.isfinite(value):
            raise ValueError(f"prediction is not finite ({value})")
        return value
