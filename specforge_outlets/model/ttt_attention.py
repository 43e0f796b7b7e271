"""The TTT attention's cache branch without T x T copies, for training on CPU.

At training-time-test step k SpecForge's sdpa attention scores every query against the first
step's keys (a causal T x T block) and against the same position's keys of steps 1..k (one score
each), concatenates the k extra columns onto the T x T scores, softmaxes in fp32 and slices the
block back out: three T x T copies a step, forward and backward, about a third of a CPU step at
T = 2,048. The same softmax splits exactly: the block's attention and its logsumexp come from
PyTorch's fused CPU attention (causal blocks skipped, nothing T x T stored), the k diagonal scores
are [B, H, T] each, and the two parts are merged by their logsumexps. Outputs and gradients equal
SpecForge's to float rounding (tests/test_training_cuts.py).

The merge needs the block's logsumexp, which only the fused CPU kernel returns; on any other
device, or with multimodal rotary embeddings, SpecForge's own forward runs unchanged.
"""

from __future__ import annotations

import math
from typing import List, Optional

import torch
import torch.nn as nn
from specforge.modeling.draft.llama3_eagle import (LlamaAttention, LlamaMutiRotaryEmbedding, apply_rotary_pos_emb,
                                                   repeat_kv)


class TTTCacheAttention(LlamaAttention):
    """SpecForge's sdpa EAGLE-3 attention with the cache branch computed by logsumexp merging."""

    def forward(self, hidden_states: torch.Tensor, cache_hidden: Optional[List[List[torch.Tensor]]] = None,
                attention_mask: Optional[torch.Tensor] = None, position_ids: Optional[torch.Tensor] = None,
                **kwargs) -> torch.Tensor:  # [B, T, 2H] -> [B, T, H]
        if (cache_hidden is None or hidden_states.device.type != "cpu"
                or isinstance(self.rotary_emb, LlamaMutiRotaryEmbedding)):
            return super().forward(hidden_states, cache_hidden=cache_hidden, attention_mask=attention_mask,
                                   position_ids=position_ids, **kwargs)
        bsz, q_len, _ = hidden_states.size()
        shape = (bsz, q_len, -1, self.head_dim)
        query = self.q_proj(hidden_states).view(shape).transpose(1, 2)  # [B, nH, T, D]
        key = self.k_proj(hidden_states).view(shape).transpose(1, 2)  # [B, nKV, T, D]
        value = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        past_steps = len(cache_hidden[0])
        cos, sin = self.rotary_emb(query, seq_len=q_len + past_steps)
        query, key = apply_rotary_pos_emb(query, key, cos.to(query.device), sin.to(query.device),
                                          position_ids + past_steps)
        cache_hidden[0] = cache_hidden[0] + [repeat_kv(key, self.num_key_value_groups)]
        cache_hidden[1] = cache_hidden[1] + [repeat_kv(value, self.num_key_value_groups)]
        output = self._attend(query, cache_hidden[0], cache_hidden[1], attention_mask)  # [B, nH, T, D]
        output = output.transpose(1, 2).reshape(bsz, q_len, self.num_heads * self.head_dim)
        return self.o_proj(output)

    def _attend(self, query: torch.Tensor, keys: List[torch.Tensor], values: List[torch.Tensor],
                attention_mask: torch.Tensor) -> torch.Tensor:  # [B, nH, T, D]
        causal_only = bool((attention_mask[:, :, -1, :] == 0).all())  # no padded key column: a pure causal mask
        mask = None if causal_only else attention_mask
        return MergedCacheAttention.apply(1.0 / math.sqrt(self.head_dim), causal_only, mask, query, *keys, *values)


class MergedCacheAttention(torch.autograd.Function):
    """softmax([causal block of step 0 | diagonal of steps 1..k]) @ values, by parts, with its exact backward.

    The fused kernel's logsumexp carries no gradient, so the merge has its own backward: the
    block's share goes through the kernel's backward with the merged output (its row term
    rowsum(dO * O) is then the full softmax's) and the gradient scaled by the block's weight; each
    diagonal column is one score per position, differentiated directly.
    """

    @staticmethod
    def forward(ctx, scale: float, causal: bool, mask: Optional[torch.Tensor], query: torch.Tensor,
                *keys_then_values: torch.Tensor) -> torch.Tensor:
        steps = len(keys_then_values) // 2
        keys, values = keys_then_values[:steps], keys_then_values[steps:]
        block, block_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, keys[0], values[0], 0.0, causal, attn_mask=mask, scale=scale)  # [B, nH, T, D], [B, nH, T]
        diagonal = [(query * key).sum(-1).float() * scale for key in keys[1:]]  # k x [B, nH, T]
        weights = torch.softmax(torch.stack([block_lse.float(), *diagonal], dim=-1), dim=-1)  # [B, nH, T, 1 + k]
        output = block * weights[..., :1].to(query.dtype)
        for step, value in enumerate(values[1:], start=1):
            output = output + weights[..., step:step + 1].to(query.dtype) * value
        ctx.scale, ctx.causal, ctx.steps = scale, causal, steps
        ctx.save_for_backward(mask, query, output, block_lse, weights, *keys, *values)
        return output

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        mask, query, output, block_lse, weights, *keys_then_values = ctx.saved_tensors
        keys, values = keys_then_values[:ctx.steps], keys_then_values[ctx.steps:]
        grad_block = (grad_output.float() * weights[..., :1]).to(query.dtype)
        grad_query, grad_key0, grad_value0 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_block, query, keys[0], values[0], output, block_lse, 0.0, ctx.causal, attn_mask=mask,
            scale=ctx.scale)
        grad_query = grad_query.float()
        row_term = (grad_output.float() * output.float()).sum(-1)  # [B, nH, T]
        grad_keys, grad_values = [grad_key0], [grad_value0]
        for step, (key, value) in enumerate(zip(keys[1:], values[1:]), start=1):
            weight = weights[..., step]  # [B, nH, T]
            grad_score = weight * ((grad_output.float() * value.float()).sum(-1) - row_term)
            grad_query = grad_query + (grad_score * ctx.scale).unsqueeze(-1) * key.float()
            grad_keys.append(((grad_score * ctx.scale).unsqueeze(-1) * query.float()).to(key.dtype))
            grad_values.append((weight.unsqueeze(-1) * grad_output.float()).to(value.dtype))
        return None, None, None, grad_query.to(query.dtype), *grad_keys, *grad_values


def use_ttt_cache_attention(attention: nn.Module) -> None:
    """Give an sdpa EAGLE-3 attention module the merged cache branch, in place (same parameters)."""
    assert type(attention) is LlamaAttention, f"only SpecForge's sdpa attention, got {type(attention).__name__}"
    attention.__class__ = TTTCacheAttention
