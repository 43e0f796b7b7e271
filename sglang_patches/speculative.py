"""EAGLE-3 mode: length predictions from the draft that speculative decoding already runs.

With ``--speculative-algorithm EAGLE3 --speculative-draft-model-path EXPORT`` (an ``outlets
export``) and an OUTLETS policy, SGLang's EAGLE worker runs our draft class for drafting; after
each of its forwards the worker keeps one recurrent draft state per request (``next_draft_input
.hidden_states``): at prefill the state at the last prompt position, which reads the first sampled
token (r̂_0), and after each verify step the state at the last accepted token (r̂_t). The length
head reads that state (one RMSNorm and the head's MLP, batched, on the target's device; no second
draft forward) and its output travels back with the step's result through SGLang's auxiliary-output
channel (``LogitsProcessorOutput.auxiliary_device_output``): the result's own device-to-host copy
carries it, so the decode step gains no synchronisation. When SGLang commits the step's tokens
to the requests (``HostAuxiliaryOutput.consume``), each estimate becomes the request's prediction
(``predictions.set_predicted_remaining``), which the waiting-queue order, the retraction order, KV
admission and routing read. A draft exported with a quantile head (``outlets_config.quantile_levels``)
is read on the same state at the same time: its remaining-length quantiles travel beside the estimate
and are stored as total-length quantiles (generated + remaining), re-read after every verify step.

A prediction the request carried (``custom_params``) takes precedence, as in predictor-only mode.
A failure falls back as predictor-only mode does: the request keeps its last prediction (the
prior if it has none), the failure is counted and logged, and serving goes on.
"""

from __future__ import annotations

import logging
import math

from sglang_patches import predictions as P
from sglang_patches import state
from sglang_patches.settings import ENV_QUANTILE_LEVELS, OutletsSettingsError, same_levels
from specforge_outlets.model.length_head import log_remaining_to_tokens

logger = logging.getLogger("sglang_patches")

_WORKER = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2"
ATTR_DRAFT = "outlets_length_draft"  # on the worker: our draft model, or None when EAGLE-3 mode is off


class DraftLengthEstimates:
    """One step's ``log_remaining`` (z = log(1 + predicted remaining tokens)) per request, and with a quantile
    head its z quantiles, on the device (SGLang's ``DeviceAuxiliaryOutput``)."""

    def __init__(self, log_remaining, log_quantiles=None) -> None:
        self.log_remaining = log_remaining  # [B] float32, rows in batch.reqs order
        self.log_quantiles = log_quantiles  # [B, K] float32 or None

    def copy_to_host(self, copy_tensor) -> "HostDraftLengthEstimates":
        quantiles = None if self.log_quantiles is None else copy_tensor(self.log_quantiles)
        return HostDraftLengthEstimates(copy_tensor(self.log_remaining), quantiles)


class HostDraftLengthEstimates:
    """The step's estimates on the host, set on the requests once their tokens are committed."""

    def __init__(self, log_remaining, log_quantiles=None) -> None:
        self.log_remaining = log_remaining
        self.log_quantiles = log_quantiles

    def consume(self, batch, commits) -> None:
        predicted_remaining = log_remaining_to_tokens(self.log_remaining).tolist()  # tokens, r̂_t
        if self.log_quantiles is None:
            quantiles = [None] * len(predicted_remaining)
        else:
            quantiles = log_remaining_to_tokens(self.log_quantiles).tolist()
        config = state.settings().scheduling
        for req, commit, value, row in zip(batch.reqs, commits, predicted_remaining, quantiles, strict=True):
            latest = P.prediction(req)
            if commit is None or req.finished() or (latest is not None and latest.is_external):
                continue  # a prefill chunk with more to come, nothing left to predict, or the client's prediction
            if not math.isfinite(value) or (row is not None and not all(map(math.isfinite, row))):
                _fall_back(req, config, f"draft length estimate is not finite ({value}, quantiles {row})")
                continue
            P.set_predicted_remaining(req, value, commit.output_index + len(commit.token_ids), row)


def worker_init_after(result, self, *args, **kwargs):
    """Find our draft behind SGLang's EAGLE worker; refuse what EAGLE-3 mode cannot read."""
    from sglang_patches.eagle3_draft import OutletsDraftError, OutletsLlamaForCausalLMEagle3

    model = getattr(getattr(getattr(self, "draft_worker", None), "draft_runner", None), "model", None)
    draft = model if isinstance(model, OutletsLlamaForCausalLMEagle3) and state.plugin_active() else None
    if draft is not None:
        try:
            draft.require_draft_state_head()
        except OutletsDraftError as error:
            raise OutletsSettingsError(str(error)) from None
        state.check_hooks({state.SPECULATIVE})
        check_draft_levels(draft)
        state.use_speculative_predictions()
        state.log_startup("eagle3")
    setattr(self, ATTR_DRAFT, draft)
    return result


def check_draft_levels(draft) -> None:
    """Refuse a quantile head whose levels are not this process's quantile levels (the launcher sets them from
    the draft; ``sglang.Engine`` users set ``OUTLETS_QUANTILE_LEVELS`` to the draft's)."""
    levels = draft.outlets_config.quantile_levels
    configured = state.settings().scheduling.quantile_levels
    if levels is not None and not same_levels(levels, configured):
        raise OutletsSettingsError(
            f"the EAGLE-3 draft's quantile head predicts at levels {','.join(f'{level:g}' for level in levels)}, "
            f"the server's quantile levels are {','.join(f'{level:g}' for level in configured)}: set "
            f"{ENV_QUANTILE_LEVELS} (--outlets-quantile-levels) to the draft's, or leave it unset")


def forward_batch_generation_around(original, self, batch, *args, **kwargs):
    result = original(self, batch, *args, **kwargs)
    draft = getattr(self, ATTR_DRAFT, None)
    if draft is None or batch is None or batch.forward_mode.is_idle():
        return result
    if not batch.forward_mode.is_extend() and getattr(self, "speculative_num_steps", 1) == 0:
        return result  # drafting is off at this batch size: the draft states may be stubs; keep the last estimates
    try:
        attach_estimates(draft, batch, result)
    except Exception as error:  # never let the length head break the step
        config = state.settings().scheduling
        for req in batch.reqs:
            _fall_back(req, config, f"draft length head error: {error!r}")
    return result


def _fall_back(req, config, reason: str) -> None:
    """No estimate this step: the request keeps its last prediction, or gets the prior if it has none."""
    if P.predicted_output_len(req) is None:
        P.fall_back_to_prior(req, config, reason)
    else:
        state.PLUGIN.fallbacks.record(req.rid, reason, using="its last prediction")


def attach_estimates(draft, batch, result) -> None:
    """Read the head on the step's draft states and hand the estimates to the step's result."""
    import torch
    from sglang.srt.managers.auxiliary_output import append_auxiliary_output

    states = getattr(getattr(result, "next_draft_input", None), "hidden_states", None)  # [B, H]
    logits_output = getattr(result, "logits_output", None)
    if states is None or logits_output is None:
        raise RuntimeError("the EAGLE worker returned no draft state for this step")
    if states.shape[0] != len(batch.reqs):
        raise RuntimeError(f"{states.shape[0]} draft states for {len(batch.reqs)} requests")
    with torch.inference_mode():
        quantiles = (draft.log_remaining_quantiles_from_draft_state(states)
                     if getattr(draft, "quantile_head", None) is not None else None)
        estimates = DraftLengthEstimates(draft.log_remaining_from_draft_state(states), quantiles)
    logits_output.auxiliary_device_output = append_auxiliary_output(logits_output.auxiliary_device_output, estimates)


HOOK_TARGETS = [
    (f"{_WORKER}.__init__", worker_init_after, "AFTER", {state.SPECULATIVE}),
    (f"{_WORKER}.forward_batch_generation", forward_batch_generation_around, "AROUND", {state.SPECULATIVE}),
]
