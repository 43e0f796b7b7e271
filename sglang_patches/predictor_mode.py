"""Predictor-only mode (``--outlets-draft-path DIR``, speculative decoding off).

At model load the target is told to capture its three fusion depths (SGLang's own EAGLE-3 capture
in ``LlamaModel.forward``, switched on by the plugin for prefill/extend passes only and taken out of
the model's return value, so the logits path is untouched). After each extend pass the worker
hook slices the captured ``[tokens, 3H]`` features per request, accumulates them over chunked
prefill, and once a request's whole prompt has been prefilled and its first token sampled, runs
the OUTLETS draft backbone and length head over the prompt (position j reads the fused features
at j and the embedding of token j+1; the last prompt position reads the first sampled token) and
sets r̂_0 on the request; a draft exported with a quantile head (``outlets_config.quantile_levels``)
gives the quantiles of the output length at the same position (z quantiles from
``OutletsLengthPredictor.log_remaining_quantiles`` on the same state, in tokens by
``log_remaining_to_tokens``). Any failure falls back to the prior (counted, logged); the request is served either way.

Supported targets: models whose SGLang implementation runs ``sglang.srt.models.llama.LlamaModel``
(the Llama family, e.g. SmolLM2, Llama 3.x). Prefix caching must be off (``--disable-radix-cache``):
a cached prefix is not recomputed, so its features would be missing.
"""

from __future__ import annotations

import logging
import math
from typing import List, Optional

from specforge_outlets.model.draft_modes import LLAMA_TARGET
from specforge_outlets.model.length_head import log_remaining_to_tokens
from specforge_outlets.scheduling import PredictionSource
from sglang_patches import predictions as P
from sglang_patches import state
from sglang_patches.settings import (
    OutletsSettingsError,
    check_draft_fits_target,
    check_radix_cache_disabled,
    validate_draft_dir,
)

logger = logging.getLogger("sglang_patches")

_LLAMA_MODEL = "sglang.srt.models.llama.LlamaModel"
_WORKER = "sglang.srt.managers.tp_worker.TpModelWorker"
_RUNNER = "sglang.srt.model_executor.model_runner.ModelRunner"


# -- model load ----------------------------------------------------------------------------------------


def load_model_after(result, self, *args, **kwargs):
    draft_path = state.settings().draft_path
    if draft_path is None or getattr(self, "is_draft_worker", False):
        return result
    from sglang.srt.models.llama import LlamaModel

    from specforge_outlets.model.plain_draft import OutletsLengthPredictor

    inner = getattr(self.model, "model", None)
    if not isinstance(inner, LlamaModel):
        raise OutletsSettingsError(
            f"--outlets-draft-path: predictor-only mode needs {LLAMA_TARGET}; "
            f"{type(self.model).__name__} is not one"
        )
    if inner.layers_to_capture:
        raise OutletsSettingsError(
            "--outlets-draft-path is predictor-only mode (speculative decoding off); with EAGLE-3 "
            "speculative decoding the OUTLETS draft is the speculative draft instead"
        )
    from sglang.srt.runtime_context import get_memory

    try:
        radix_disabled = bool(get_memory().disable_radix_cache)
    except Exception:
        radix_disabled = bool(getattr(self.server_args, "disable_radix_cache", False))
    check_radix_cache_disabled(radix_disabled)
    check_draft_fits_target(draft_path, validate_draft_dir(draft_path), inner.config.num_hidden_layers,
                            inner.config.hidden_size)
    predictor_ = OutletsLengthPredictor(draft_path, inner.embed_tokens)
    inner.outlets_capture_layers = list(predictor_.fusion_layers)
    state.PLUGIN.predictor = predictor_
    state.log_startup("predictor")
    return result


# -- capture -------------------------------------------------------------------------------------------


def llama_model_forward_around(original, self, input_ids, positions, forward_batch, *args, **kwargs):
    layers = getattr(self, "outlets_capture_layers", None)
    if not layers or self.layers_to_capture or not forward_batch.forward_mode.is_extend():
        return original(self, input_ids, positions, forward_batch, *args, **kwargs)
    self.layers_to_capture = layers
    try:
        output = original(self, input_ids, positions, forward_batch, *args, **kwargs)
    finally:
        self.layers_to_capture = []
    if isinstance(output, tuple) and len(output) == 2:
        hidden, aux = output
        try:
            import torch

            state.PLUGIN.feature_capture.capture = torch.cat(list(aux), dim=-1)  # [tokens, 3H] where the target runs
        except Exception as error:
            logger.warning("OUTLETS feature capture failed: %s", error)
            state.PLUGIN.feature_capture.capture = None
        return hidden
    return output


# -- prediction after the extend pass --------------------------------------------------------------------


def forward_batch_generation_around(original, self, batch, *args, **kwargs):
    captured = state.PLUGIN.feature_capture
    if state.PLUGIN.predictor is None or batch is None:
        return original(self, batch, *args, **kwargs)
    captured.capture = None
    result = original(self, batch, *args, **kwargs)
    capture, captured.capture = getattr(captured, "capture", None), None
    try:
        if batch.forward_mode.is_extend():
            predict_batch(batch, capture, getattr(result, "next_token_ids", None))
    except Exception as error:  # never let the predictor break the batch
        config = state.settings().scheduling
        for req in getattr(batch, "reqs", []) or []:
            if P.predicted_output_len(req) is None and not getattr(req, "output_ids", None):
                P.fall_back_to_prior(req, config, f"predictor error: {error!r}")
    return result


def predict_batch(batch, capture, next_token_ids) -> None:
    """r̂_0 for the requests whose prompt this extend pass completed, with one wait for the device per batch."""
    import torch

    config = state.settings().scheduling
    extend_lens: List[int] = list(batch.extend_lens)
    prefix_lens: List[int] = list(batch.prefix_lens)
    completed = []  # (request, z on the target's device)
    offset = 0
    for index, req in enumerate(batch.reqs):
        length = int(extend_lens[index])
        start, offset = offset, offset + length
        if P.predicted_output_len(req) is not None or getattr(req, "output_ids", None):
            continue  # predicted already, or a decode step in a mixed batch
        own = P.record(req)
        features: Optional[list] = own.prompt_features
        if features is None or prefix_lens[index] == 0:  # a prefill from the start, or restarted after a reset
            features = own.prompt_features = []
        if capture is None or capture.shape[0] < offset:
            own.prompt_features = None
            P.fall_back_to_prior(req, config, "no features captured for the prompt")
            continue
        if prefix_lens[index] != sum(chunk.shape[0] for chunk in features):
            own.prompt_features = None
            P.fall_back_to_prior(req, config, f"prompt prefix of {prefix_lens[index]} tokens was not computed")
            continue
        features.append(capture[start:offset])
        prompt = list(req.origin_input_ids)
        if prefix_lens[index] + length < len(prompt):
            continue  # chunked prefill: more chunks to come
        own.prompt_features = None
        try:
            if next_token_ids is None:
                raise RuntimeError("first token not sampled in this pass (delayed sampling)")
            completed.append((req, prompt_outputs(torch.cat(features, dim=0), prompt, next_token_ids[index])))
        except Exception as error:
            P.fall_back_to_prior(req, config, repr(error))
    if not completed:
        return
    # The one synchronisation: the scheduler keeps its requests, and their predictions, on the host.
    rows = log_remaining_to_tokens(torch.stack([z for _, z in completed])).tolist()
    for (req, _), row in zip(completed, rows):
        value, quantiles = (row, None) if isinstance(row, float) else (row[0], row[1:])
        if not math.isfinite(value):
            P.fall_back_to_prior(req, config, f"prediction is not finite ({value})")
        elif quantiles is not None and not all(map(math.isfinite, quantiles)):
            P.fall_back_to_prior(req, config, f"quantiles are not finite ({quantiles})")
        else:
            P.set_predicted_output_len(req, value, PredictionSource.DRAFT, quantiles)


def prompt_outputs(fused_features, prompt, first_token):
    """z of r̂_0 (0-dim), or with a quantile head [1 + K]: z of r̂_0, then the K z quantiles, on the target's device.

    Without a quantile head this is ``OutletsLengthPredictor.prompt_log_remaining``; with one both heads
    read the same state, at the last prompt position reading the first sampled token."""
    import torch

    predictor = state.PLUGIN.predictor
    if predictor.quantile_head is None:
        return predictor.prompt_log_remaining(fused_features, prompt, first_token)
    device = predictor.device
    ids = torch.as_tensor(list(prompt)[1:], dtype=torch.long).to(device, non_blocking=True)
    first = torch.as_tensor(first_token, dtype=torch.long).to(device).reshape(1)
    last = predictor.states(fused_features.to(device), torch.cat([ids, first]))[-1:]
    return torch.cat([predictor.log_remaining(last), predictor.log_remaining_quantiles(last)[0]])


HOOK_TARGETS = [
    (f"{_RUNNER}.load_model", load_model_after, "AFTER", {state.PREDICTOR}),
    (f"{_LLAMA_MODEL}.forward", llama_model_forward_around, "AROUND", {state.PREDICTOR}),
    (f"{_WORKER}.forward_batch_generation", forward_batch_generation_around, "AROUND", {state.PREDICTOR}),
]
