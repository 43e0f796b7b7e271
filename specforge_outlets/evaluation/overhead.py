"""The length head's overhead: parameters and time per decoding step against the draft backbone.

One draft decoding step for a single token is timed as the single-position forward: fusion of the
three target depths (``fc``), token embedding, the draft decoder layer, the final norm and the
draft LM head. The length head is timed on that step's normalised state ([1, 1, H]). Each is
warmed up, then timed ``repeats`` times in the same run; medians are reported.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Dict

import torch

WARMUP = 20
REPEATS = 200


def count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def parameter_counts(draft) -> Dict[str, int]:
    head = count(draft.length_head)
    embedding = count(draft.embed_tokens)
    backbone = count(draft) - head - embedding
    return {
        "backbone": backbone,  # fc + decoder layer (with its output gate) + norm + draft LM head
        "embedding_shared_with_target": embedding,
        "length_head": head,
        "head_share": head / (backbone + head),
    }


def _median_seconds(fn, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.no_grad()
def measure(draft, *, warmup: int = WARMUP, repeats: int = REPEATS, device: str = "cpu") -> Dict[str, Any]:
    draft = draft.to(device).eval()
    hidden = draft.config.hidden_size
    aux = torch.randn(1, 1, draft.fc.in_features, device=device, dtype=draft.fc.weight.dtype)
    token = torch.ones(1, 1, dtype=torch.long, device=device)
    positions = torch.zeros(1, 1, dtype=torch.long, device=device)
    mask = draft.prepare_decoder_attention_mask(
        attention_mask=torch.ones(1, 1, dtype=torch.bool, device=device),
        hidden_states=aux.new_zeros(1, 1, hidden), batch_size=1, seq_length=1, past_key_values_length=0,
    )
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def backbone_step():
        fused = draft.project_hidden_states(aux)
        embeds = draft.embed_input_ids(token).to(fused.dtype)
        state = draft.backbone(input_embeds=embeds, hidden_states=fused, cache_hidden=[[], []],
                               attention_mask=mask, position_ids=positions)
        draft.compute_logits(state)
        sync()

    state = draft.normalized_state(torch.randn(1, 1, hidden, device=device, dtype=aux.dtype))

    def head_step():
        draft.length_head.log_remaining(draft.length_head(state))
        sync()

    backbone_s = _median_seconds(backbone_step, warmup, repeats)
    head_s = _median_seconds(head_step, warmup, repeats)
    return {
        "device": device,
        "threads": torch.get_num_threads(),
        "warmup": warmup,
        "repeats": repeats,
        "backbone_step_ms": backbone_s * 1e3,
        "length_head_step_ms": head_s * 1e3,
        "head_time_share": head_s / (backbone_s + head_s),
    }
