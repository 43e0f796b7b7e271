"""A stand-in for SGLang's ``Req`` in in-process tests of the plugin, waiting requests built from it, and the
reference view of a request that the plugin's cached order keys are checked against."""

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Optional, Tuple

from sglang_patches import predictions as P


class StandInReq(SimpleNamespace):
    """A stand-in ``Req``: hashed and compared by identity, as SGLang's is (the order keeps keys by request)."""

    __hash__ = object.__hash__
    __eq__ = object.__eq__


def request(rid, predicted_output_len=None, quantiles=None, arrival=0.0, generated=0, custom=None,
            prompt_len=4) -> StandInReq:
    """A waiting request with what the plugin's hooks read: its arrival stamp, prompt, tokens generated so far,
    sampling params (``custom``: its ``custom_params``) and, if given, an external prediction and its quantiles."""
    req = StandInReq(rid=rid, output_ids=[0] * generated, customized_info=None, origin_input_ids=[1] * prompt_len,
                     sampling_params=SimpleNamespace(custom_params=custom, max_new_tokens=4000, ignore_eos=False))
    P.record(req).arrival = arrival
    req.finished = lambda: False
    if predicted_output_len is not None:
        P.set_predicted_output_len(req, predicted_output_len, "external", quantiles)
    return req


def real_request(rid, predicted_output_len=None, quantiles=None, arrival=0.0, prompt_len=4):
    """A real SGLang ``Req`` (about 160 attributes, as the scheduler holds them) with :func:`request`'s fields
    and what ``Req.reset_for_retract`` reads."""
    from sglang.srt.managers.schedule_batch import Req

    req = Req.__new__(Req)
    req.__dict__.update(request(rid, predicted_output_len, quantiles, arrival=arrival, prompt_len=prompt_len).__dict__)
    req.__dict__.update(retraction_count=0, kv=SimpleNamespace(holds_kv=False), input_embeds=None)
    return req


@dataclass
class FreshView:
    """A request's ordering fields read afresh: the core's reference for the plugin's cached keys."""

    rid: str
    arrival_time: float
    predicted_output_len: Optional[float]
    num_generated_tokens: int
    predicted_output_quantiles: Optional[Tuple[float, ...]]
    prompt_len: int


def fresh_view(req) -> FreshView:
    """What the order's keys read of ``req`` now."""
    return FreshView(req.rid, P.record(req).arrival, P.predicted_output_len(req), len(req.output_ids),
                     P.predicted_output_quantiles(req), len(req.origin_input_ids))
