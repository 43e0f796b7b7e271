"""KV admission by prediction (``--outlets-kv-margin``): a request holds its predicted remaining output of KV cache.

SGLang charges a request it admits its whole remaining ``max_new_tokens`` of output KV, and a running
request ``new_token_ratio`` of it, when it decides whether new requests fit. With a prediction the
plugin charges the predicted remaining length plus a margin instead
(``specforge_outlets.scheduling.PredictedChargeAdmission``: the charge is written once, in the
scheduling core, which the simulator runs too), at most what SGLang would charge:

- a running request, through ``PrefillAdder._get_running_request_total_token_offset``;
- a request being admitted, through ``PrefillAdder.add_one_req``: for the duration of that call the
  request asks for its predicted budget as ``max_new_tokens``, so SGLang's own admission arithmetic
  charges the budget; the request's real ``max_new_tokens`` is back before anything else reads it.

With ``--outlets-kv-quantile Q`` the charge is instead the Q-quantile of the predicted remaining length
(``specforge_outlets.scheduling.QuantileChargeAdmission`` on the request's distribution): its
quantiles when it has them, else a point mass at its prediction, which charges the predicted
remaining without a margin (as the simulator's ``kv_admission: quantile``).

A request that ignores EOS runs to ``max_new_tokens`` whatever is predicted and is charged as stock.
Requests are predicted at admission only when the prediction came with them (``custom_params``) or
they were predicted before (a retracted request back in the queue).
"""

from __future__ import annotations

from typing import Optional

from sglang_patches import predictions as P
from sglang_patches import state
from specforge_outlets.scheduling import KVAdmission, KVRequest, SGLangAdmission, create_admission

_ADDER = "sglang.srt.managers.schedule_policy.PrefillAdder"


def _admission(current) -> Optional[SGLangAdmission]:
    """The scheduling core's strategy for the rule the settings ask for, None for SGLang's own estimate."""
    if current.kv_margin is None:
        return None
    policy = KVAdmission.PREDICTED if current.kv_quantile is None else KVAdmission.QUANTILE
    return create_admission(policy, current.scheduling, current.kv_margin, current.kv_quantile)


def kv_request(req) -> KVRequest:
    """What the scheduling core's admission reads from an SGLang ``Req``."""
    params = req.sampling_params
    return KVRequest(0, P.num_generated(req), params.max_new_tokens, P.prediction(req), P.predicted_quantiles(req),
                     bool(getattr(params, "ignore_eos", False)))


def _predicted_budget(req):
    """Output KV tokens to charge ``req`` from now on, or None to charge as SGLang does."""
    admission = _admission(state.settings())
    if admission is None or not state.schedule_policy_is_outlets():
        return None
    return admission.output_budget(kv_request(req))


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
