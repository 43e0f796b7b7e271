"""A prefill instance's prediction travels to the decode instance with the request's KV (PD disaggregation).

With ``--disaggregation-mode prefill`` the prompt is run, and r̂_0 made (predictor-only mode), on one
instance; the request is then decoded, queued, admitted to the KV cache and retracted on another,
whose policy needs r̂_0 from its first decode step. SGLang 0.5.23 moves a fixed block of per-request
metadata with the KV (``disaggregation/utils.py`` ``MetadataBuffers``: whole rows copied, written by
the prefill in ``set_buf`` and read by the decode in ``DecodeTransferQueue._commit_transfer_to_req``).
``output_token_logprobs_val`` is a float32 row of 16 of which SGLang uses slot 0, so the prediction
rides in its last slot. Rows are reused without being cleared, so the prefill writes every request:
0 where it has no prediction of its own (the prior is the decode's to apply, not a value to send).

The prefill's quantiles (from a draft with a quantile head) ride in the same row's free slots:
slot 14 holds their count K (0 for none), slots 1..K the levels and K+1..2K the total-length
quantiles, so at most 6 (``MAX_SENT_QUANTILES``; SGLang uses slot 0 only). The decode takes them only
when the levels are its own (``--outlets-quantile-levels``, float32-equal); otherwise it keeps the
point prediction and logs the mismatch once.

On the decode instance the request's own prediction (``custom_params``, which the router sends to
both instances) wins; then the prefill's; a request with neither (a prefill without the plugin or
without a predictor, a failed predictor) is scheduled on the prior, as an unpredicted request on a
single server is, and counted (``outlets_transfers_without_prediction_total`` with
``--enable-metrics``; the first one is logged).
"""

from __future__ import annotations

import logging
import math

from sglang_patches import predictions as P
from sglang_patches import state
from sglang_patches.client_predictions import assign_external_prediction
from sglang_patches.settings import same_levels
from specforge_outlets.scheduling import PredictionSource

logger = logging.getLogger("sglang_patches")
PREDICTION_SLOT = 15  # of MetadataBuffers.output_token_logprobs_val's 16 per request; SGLang uses slot 0
NO_PREDICTION = 0.0  # what the prefill writes for a request it has not predicted
SMALLEST_SENT = 1e-3  # a predicted 0 (the head's floor) is sent as this, so that it is not read as "none"
QUANTILE_COUNT_SLOT = 14  # K, the number of quantiles sent (0: none)
FIRST_QUANTILE_SLOT = 1  # levels in slots 1..K, quantiles in K+1..2K
MAX_SENT_QUANTILES = (QUANTILE_COUNT_SLOT - FIRST_QUANTILE_SLOT) // 2  # 6


def sent_prediction(req) -> float:
    """What the prefill instance writes for ``req``: its own prediction, or :data:`NO_PREDICTION`."""
    prediction = P.prediction(req)
    if prediction is None or prediction.source is PredictionSource.PRIOR:
        return NO_PREDICTION
    value = prediction.predicted_output_len
    if not math.isfinite(value) or value < 0:
        return NO_PREDICTION
    return max(value, SMALLEST_SENT)


def sent_quantiles(req):
    """The quantiles the prefill instance writes for ``req`` beside its prediction: ``(levels, quantiles)``, or None."""
    quantiles = P.predicted_output_quantiles(req)
    if quantiles is None or sent_prediction(req) == NO_PREDICTION or len(quantiles) > MAX_SENT_QUANTILES:
        return None
    levels = state.settings().scheduling.quantile_levels
    return (levels, quantiles) if len(levels) == len(quantiles) else None


def write_quantiles(row, req) -> None:
    """Write ``req``'s quantiles into a metadata row (a float32 tensor; count 0 when there are none to send)."""
    sent = sent_quantiles(req)
    if sent is None:
        row[QUANTILE_COUNT_SLOT] = 0
        return
    import torch

    levels, quantiles = sent
    count = len(quantiles)
    values = [float(level) for level in levels] + [float(quantile) for quantile in quantiles]
    row[FIRST_QUANTILE_SLOT:FIRST_QUANTILE_SLOT + 2 * count] = torch.tensor(values, dtype=row.dtype)  # one copy
    row[QUANTILE_COUNT_SLOT] = count


def read_quantiles(values, config):
    """The transferred quantiles of a metadata row's values (a list) at the decode's own levels; None without
    them or at other levels."""
    count = int(values[QUANTILE_COUNT_SLOT])
    if not 0 < count <= MAX_SENT_QUANTILES:
        return None
    sent = values[FIRST_QUANTILE_SLOT:FIRST_QUANTILE_SLOT + 2 * count]
    levels, quantiles = sent[:count], sent[count:]
    if not same_levels(levels, config.quantile_levels):
        if state.first_time("quantiles at other levels from the prefill"):
            logger.warning("OUTLETS: the prefill instance sent quantiles at levels %s, this decode instance's are %s "
                           "(--outlets-quantile-levels): its requests are scheduled on the point prediction",
                           levels, list(config.quantile_levels))
        return None
    if not all(math.isfinite(value) and value > 0 for value in quantiles):
        return None
    return quantiles


def receive_prediction(req, value: float, config, quantiles=None) -> None:
    """The decode instance takes the request's own prediction, else the transferred ``value`` (with the
    transferred ``quantiles``, if any), else the prior."""
    if assign_external_prediction(req, config):
        return  # the request carried its own (or was already predicted: a re-bootstrap keeps its first)
    if math.isfinite(value) and value > 0:
        P.set_predicted_output_len(req, value, PredictionSource.PREFILL, quantiles)
        return
    # Unpredicted, as a request without a prediction on a single server: every reader uses the prior.
    state.metrics().transfer_without_prediction()
    state.metrics().served_on_prior()
    if state.first_time("a transfer without a prediction"):  # the first is logged, the rest only counted
        logger.warning("OUTLETS: request %s arrived from the prefill instance without a prediction (a prefill without "
                       "--outlets-draft-path, or its predictor failed): scheduled on the prior; such requests are "
                       "counted in outlets_transfers_without_prediction_total (--enable-metrics)", req.rid)


def set_buf_after(result, self, req):
    if state.plugin_active():
        row = self.output_token_logprobs_val[req.metadata_buffer_index]
        row[PREDICTION_SLOT] = sent_prediction(req)
        write_quantiles(row, req)
    return result


def commit_transfer_after(result, self, decode_req):
    # SGLang's own: a "fake" transfer (the decode's health checks, the fake backend) has no prefill behind it
    from sglang.srt.disaggregation.utils import _is_fake_transfer

    req = decode_req.req
    if state.schedule_policy_is_outlets() and req.finished_reason is None and not _is_fake_transfer(req):
        values = self.metadata_buffers.output_token_logprobs_val[decode_req.metadata_buffer_index].tolist()  # one read
        config = state.settings().scheduling
        receive_prediction(req, float(values[PREDICTION_SLOT]), config, read_quantiles(values, config))
    return result


HOOK_TARGETS = [
    ("sglang.srt.disaggregation.utils.MetadataBuffers.set_buf", set_buf_after, "AFTER",
     {state.ORDERING, state.PREDICTOR}),
    ("sglang.srt.disaggregation.decode.DecodeTransferQueue._commit_transfer_to_req", commit_transfer_after, "AFTER",
     {state.ORDERING}),
]
