"""A prefill instance's prediction travels to the decode instance with the request's KV (PD disaggregation).

With ``--disaggregation-mode prefill`` the prompt is run, and r̂_0 made (predictor-only mode), on one
instance; the request is then decoded, queued, admitted to the KV cache and retracted on another,
whose policy needs r̂_0 from its first decode step. SGLang 0.5.23 moves a fixed block of per-request
metadata with the KV (``disaggregation/utils.py`` ``MetadataBuffers``: whole rows copied, written by
the prefill in ``set_buf`` and read by the decode in ``DecodeTransferQueue._commit_transfer_to_req``).
``output_token_logprobs_val`` is a float32 row of 16 of which SGLang uses slot 0, so the prediction
rides in its last slot. Rows are reused without being cleared, so the prefill writes every request:
0 where it has no prediction of its own (the prior is the decode's to apply, not a value to send).

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

logger = logging.getLogger("sglang_patches")
_warned = False  # the first request without a prediction is logged, the rest only counted

PREDICTION_SLOT = 15  # of MetadataBuffers.output_token_logprobs_val's 16 per request; SGLang uses slot 0
NO_PREDICTION = 0.0  # what the prefill writes for a request it has not predicted
SMALLEST_SENT = 1e-3  # a predicted 0 (the head's floor) is sent as this, so that it is not read as "none"
SOURCE = "prefill"  # the prediction source the decode instance records


def sent_prediction(req) -> float:
    """What the prefill instance writes for ``req``: its own prediction, or :data:`NO_PREDICTION`."""
    value = P.prediction(req)
    if value is None or P.prediction_source(req) == "prior" or not math.isfinite(value) or value < 0:
        return NO_PREDICTION
    return max(float(value), SMALLEST_SENT)


def receive_prediction(req, value: float, config) -> None:
    """The decode instance takes the request's own prediction, else the transferred ``value``, else the prior."""
    if P.assign_external_prediction(req, config):
        return  # the request carried its own (or was already predicted: a re-bootstrap keeps its first)
    if math.isfinite(value) and value > 0:
        P.set_prediction(req, value, SOURCE)
        return
    # Unpredicted, as a request without a prediction on a single server: every reader uses the prior.
    state.metrics().transfer_without_prediction()
    global _warned
    if not _warned:
        _warned = True
        logger.warning("OUTLETS: request %s arrived from the prefill instance without a prediction (a prefill without "
                       "--outlets-draft-path, or its predictor failed): scheduled on the prior; such requests are "
                       "counted in outlets_transfers_without_prediction_total (--enable-metrics)", req.rid)


def set_buf_after(result, self, req):
    if state.plugin_active():
        self.output_token_logprobs_val[req.metadata_buffer_index][PREDICTION_SLOT] = sent_prediction(req)
    return result


def commit_transfer_after(result, self, decode_req):
    # SGLang's own: a "fake" transfer (the decode's health checks, the fake backend) has no prefill behind it
    from sglang.srt.disaggregation.utils import _is_fake_transfer

    req = decode_req.req
    if state.schedule_policy_is_outlets() and req.finished_reason is None and not _is_fake_transfer(req):
        row = self.metadata_buffers.output_token_logprobs_val[decode_req.metadata_buffer_index]
        receive_prediction(req, float(row[PREDICTION_SLOT]), state.settings().scheduling)
    return result


HOOK_TARGETS = [
    ("sglang.srt.disaggregation.utils.MetadataBuffers.set_buf", set_buf_after, "AFTER",
     {state.ORDERING, state.PREDICTOR}),
    ("sglang.srt.disaggregation.decode.DecodeTransferQueue._commit_transfer_to_req", commit_transfer_after, "AFTER",
     {state.ORDERING}),
]
