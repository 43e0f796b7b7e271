"""KV admission by prediction (``--outlets-kv-admission``, opt-in: SGLang's own is the default): the predicted
future peak of the cache, or a request charged its predicted remaining output of KV cache.

SGLang charges a request it admits its whole remaining ``max_new_tokens`` of output KV, and a running
request ``new_token_ratio`` of it, when it decides whether new requests fit. With a prediction the
plugin's charge (``--outlets-kv-admission predicted``, its default before the peak) charges the
predicted remaining length plus ``--outlets-kv-margin`` of it instead
(``specforge_outlets.scheduling.PredictedChargeAdmission``: the charge is written once, in the
scheduling core, which the simulator runs too), at most what SGLang would charge:

- a running request, through ``PrefillAdder._get_running_request_total_token_offset``;
- a request being admitted, through ``PrefillAdder.add_one_req``: for the duration of that call the
  request asks for its predicted budget as ``max_new_tokens``, so SGLang's own admission arithmetic
  charges the budget; the request's real ``max_new_tokens`` is back before anything else reads it.

With ``--outlets-kv-admission quantile`` the charge is instead the ``--outlets-kv-quantile`` quantile of the
predicted remaining length (``specforge_outlets.scheduling.QuantileChargeAdmission`` on the request's distribution): its
quantiles when it has them, else a point mass at its prediction, which charges the predicted
remaining without a margin (as the simulator's ``kv_admission: quantile``).

With ``--outlets-kv-admission peak`` (``specforge_outlets.scheduling.PeakAdmission``; the default from the
simulated predictor ladder until the regime map, docs/admission.md), nothing is
charged ahead (both hooks charge 0 output tokens, so SGLang's arithmetic checks only that the prompt fits now)
and ``add_one_req`` first refuses a request (``NO_TOKEN``) when the predicted future peak of the KV
cache with it, the running requests and those admitted earlier in the round would exceed what the
cache holds; each request grows to its predicted end, and one that outlived its prediction, or has none,
is predicted from the output lengths this scheduler saw finish (recorded as requests leave their batch,
``ScheduleBatch.filter_batch``; before any finished, to its ``max_new_tokens``). ``past-future`` reads those
lengths only. A prompt SGLang prefills in chunks (``Scheduler.chunked_req``, handed to ``add_chunked_req`` at
the start of each round its chunks span, before any ``add_one_req``) counts in the peak of those rounds as
a request being prefilled (``CacheState.prefilling``, as the simulator counts its own): it holds the KV of
the chunks already prefilled (its ``prefix_len``), grows to its whole prompt, then a token a step to its
predicted end (the history's, or ``max_new_tokens``, while it has no prediction).

A request that ignores EOS runs to ``max_new_tokens`` whatever is predicted and is charged as stock.
Requests are predicted at admission only when the prediction came with them (``custom_params``) or
they were predicted before (a retracted request back in the queue).
"""

from __future__ import annotations

from typing import Optional

from sglang_patches import predictions as P
from sglang_patches import state
from specforge_outlets.scheduling import (
    Admission,
    CacheState,
    KVAdmission,
    KVRequest,
    PeakAdmission,
    create_admission,
)

_ADDER = "sglang.srt.managers.schedule_policy.PrefillAdder"
_BATCH = "sglang.srt.managers.schedule_batch.ScheduleBatch"
# The strategy of an admission round (or None: SGLang's own estimate), built at the round's first hook call and
# kept on its PrefillAdder (a new adder per round), which asks once per running request and per candidate
ATTR_ADMISSION = "_outlets_admission"
# The peak round of an admission round, kept on its PrefillAdder
ATTR_PEAK_ROUND = "_outlets_peak_round"
# The round's chunked request (Scheduler.chunked_req), kept on its PrefillAdder by add_chunked_req
ATTR_CHUNKED_REQ = "_outlets_chunked_req"


def admission() -> Optional[Admission]:
    """The scheduling core's strategy for the rule the settings ask for, None for SGLang's own estimate."""
    current = state.settings()
    if current.kv_admission is KVAdmission.SGLANG or not state.schedule_policy_is_outlets():
        return None
    return create_admission(current.kv_admission, current.scheduling, current.kv_margin, current.kv_quantile,
                            history=state.PLUGIN.output_lengths)


def round_admission(adder) -> Optional[Admission]:
    """:func:`admission` for the round of this ``PrefillAdder``, built once per round."""
    if not hasattr(adder, ATTR_ADMISSION):
        setattr(adder, ATTR_ADMISSION, admission())
    return getattr(adder, ATTR_ADMISSION)


def kv_request(req, held: int = 0, extend: int = 0) -> KVRequest:
    """What the scheduling core's admission reads from an SGLang ``Req`` holding ``held`` KV tokens,
    whose prefill adds ``extend``."""
    params = req.sampling_params
    return KVRequest.from_prediction(P.prediction(req), extend, P.num_generated(req), params.max_new_tokens,
                                     bool(getattr(params, "ignore_eos", False)), held)


def running_kv_request(req) -> KVRequest:
    """A running request: SGLang holds its prompt and output but the last token (the next decode step writes it)."""
    return kv_request(req, held=len(req.origin_input_ids) + len(req.output_ids) - 1)


def chunked_kv_request(req) -> KVRequest:
    """A prompt being prefilled in chunks: it holds the KV of the chunks prefilled (``prefix_len``, locked, so
    neither available nor evictable), and its next chunks prefill the rest of its prompt (and of the output a
    retracted request recomputes)."""
    return kv_request(req, held=req.prefix_len, extend=len(req.full_untruncated_fill_ids) - req.prefix_len)


def _peak_round(adder, rule: PeakAdmission):
    """The peak round of this admission round, opened at its first request on the cache as it is then: the
    running requests, and the chunked request SGLang handed to ``add_chunked_req`` earlier in the round."""
    round_ = getattr(adder, ATTR_PEAK_ROUND, None)
    if round_ is None:
        free = adder.token_to_kv_pool_allocator.available_size() + adder.tree_cache.evictable_size()
        running = [] if adder.running_batch is None else adder.running_batch.reqs
        chunked = getattr(adder, ATTR_CHUNKED_REQ, None)
        prefilling = [] if chunked is None or any(req is chunked for req in running) else [chunked_kv_request(chunked)]
        round_ = rule.open_round(CacheState(free, [running_kv_request(req) for req in running], prefilling))
        setattr(adder, ATTR_PEAK_ROUND, round_)
    return round_


def add_chunked_req_before(self, req, *args, **kwargs):
    """SGLang hands the round its chunked request first: kept for the round's peak (:func:`_peak_round`)."""
    setattr(self, ATTR_CHUNKED_REQ, req)
    return None


def running_token_offset_around(original, self, req):
    """A running request is charged the strategy's output budget (the peak's: nothing ahead)."""
    rule = round_admission(self)
    budget = None if rule is None else rule.output_budget(kv_request(req))
    return original(self, req) if budget is None else budget


def add_one_req_around(original, self, req, *args, **kwargs):
    """A request being admitted is charged the strategy's output budget; under the peak rule it is refused
    (``NO_TOKEN``, as when SGLang's own arithmetic finds no room) when the future peak with it would not fit."""
    rule = round_admission(self)
    budget = None if rule is None else rule.output_budget(kv_request(req))
    if budget is None:
        return original(self, req, *args, **kwargs)
    round_ = candidate = None
    if isinstance(rule, PeakAdmission):  # what add_one_req prefills: the request's fill less its cached prefix
        round_ = _peak_round(self, rule)
        candidate = kv_request(req, extend=len(req.full_untruncated_fill_ids) - req.prefix_len)
        if not round_.fits(candidate):
            from sglang.srt.managers.schedule_policy import AddReqResult

            return AddReqResult.NO_TOKEN
    params = req.sampling_params
    asked = params.max_new_tokens
    params.max_new_tokens = len(req.output_ids) + budget
    try:
        result = original(self, req, *args, **kwargs)
    finally:
        params.max_new_tokens = asked
    if round_ is not None and (req in self.can_run_list or self.new_chunked_req is req):
        round_.add(candidate)
    return result


def filter_batch_before(self, *args, **kwargs):
    """Requests leave a batch when they finish: their output lengths are the peak admissions' history."""
    for req in self.reqs:
        if req.finished():
            state.PLUGIN.output_lengths.record(len(req.output_ids))
    return None


HOOK_TARGETS = [
    (f"{_ADDER}._get_running_request_total_token_offset", running_token_offset_around, "AROUND", {state.ORDERING}),
    (f"{_ADDER}.add_one_req", add_one_req_around, "AROUND", {state.ORDERING}),
    (f"{_ADDER}.add_chunked_req", add_chunked_req_before, "BEFORE", {state.ORDERING}),
    (f"{_BATCH}.filter_batch", filter_batch_before, "BEFORE", {state.ORDERING}),
]
