"""KV admission by prediction (``--outlets-kv-margin``): a request holds its predicted remaining output of KV cache.

SGLang charges a request it admits its whole remaining ``max_new_tokens`` of output KV, and a running
request ``new_token_ratio`` of it, when it decides whether new requests fit. With a prediction the
plugin charges the predicted remaining length plus a margin instead
(``specforge_outlets.scheduling.predicted_output_budget``), at most what SGLang would charge:

- a running request, through ``PrefillAdder._get_running_request_total_token_offset``;
- a request being admitted, through ``PrefillAdder.add_one_req``: for the duration of that call the
  request asks for its predicted budget as ``max_new_tokens``, so SGLang's own admission arithmetic
  charges the budget; the request's real ``max_new_tokens`` is back before anything else reads it.

A request that ignores EOS runs to ``max_new_tokens`` whatever is predicted and is charged as stock.
Requests are predicted at admission only when the prediction came with them (``custom_params``) or
they were predicted before (a retracted request back in the queue).
"""

from __future__ import annotations

from sglang_patches import predictions as P
from sglang_patches import state
from specforge_outlets.scheduling import predicted_output_budget

_ADDER = "sglang.srt.managers.schedule_policy.PrefillAdder"


def _predicted_budget(req):
    """Output KV tokens to charge ``req`` from now on, or None to charge as SGLang does."""
    margin = state.settings().kv_margin
    if margin is None or not state.schedule_policy_is_outlets() or P.prediction(req) is None:
        return None
    if getattr(getattr(req, "sampling_params", None), "ignore_eos", False):
        return None  # runs to max_new_tokens whatever is predicted
    from sglang.srt.managers.schedule_policy import CLIP_MAX_NEW_TOKENS

    cap = min(max(req.sampling_params.max_new_tokens - len(req.output_ids), 0), CLIP_MAX_NEW_TOKENS)
    return predicted_output_budget(P.prediction(req), P.num_generated(req), margin, cap, state.settings().scheduling)


def running_token_offset_around(original, self, req):
    """A running request holds its predicted remaining (+ margin) of output KV."""
    budget = _predicted_budget(req)
    return original(self, req) if budget is None else budget


def add_one_req_around(original, self, req, *args, **kwargs):
    """A request being admitted is charged its predicted remaining (+ margin) of output KV."""
    budget = _predicted_budget(req)
    if budget is None:
        return original(self, req, *args, **kwargs)
    params = req.sampling_params
    asked = params.max_new_tokens
    params.max_new_tokens = len(req.output_ids) + budget
    try:
        return original(self, req, *args, **kwargs)
    finally:
        params.max_new_tokens = asked


HOOK_TARGETS = [
    (f"{_ADDER}._get_running_request_total_token_offset", running_token_offset_around, "AROUND", {state.ORDERING}),
    (f"{_ADDER}.add_one_req", add_one_req_around, "AROUND", {state.ORDERING}),
]
