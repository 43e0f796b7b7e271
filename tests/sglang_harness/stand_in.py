"""A stand-in for SGLang's ``Req`` in in-process tests of the plugin, and a waiting request built from it."""

from types import SimpleNamespace

from sglang_patches import predictions as P


class StandInReq(SimpleNamespace):
    """A stand-in ``Req``: hashed and compared by identity, as SGLang's is (the order keeps keys by request)."""

    __hash__ = object.__hash__
    __eq__ = object.__eq__


def request(rid, predicted=None, quantiles=None, arrival=0.0, generated=0, custom=None, prompt_len=4) -> StandInReq:
    """A waiting request with what the plugin's hooks read: its arrival stamp, prompt, tokens generated so far,
    sampling params (``custom``: its ``custom_params``) and, if given, an external prediction and its quantiles."""
    req = StandInReq(rid=rid, output_ids=[0] * generated, customized_info=None, origin_input_ids=[1] * prompt_len,
                     sampling_params=SimpleNamespace(custom_params=custom, max_new_tokens=4000, ignore_eos=False))
    req.outlets_arrival_time = arrival
    req.finished = lambda: False
    if predicted is not None:
        P.set_prediction(req, predicted, "external", quantiles)
    return req
