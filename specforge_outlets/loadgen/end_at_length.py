"""A request that ends at exactly its recorded output length, while ``max_new_tokens`` stays a cap.

Serving studies replay requests at the lengths the target gave them when they were regenerated, so
that every policy does the same work. ``--fixed-output-len`` gets there SGLang's way, with
``ignore_eos`` and ``max_new_tokens`` set to the length; but then the server knows every length in
advance: SGLang's ``lof`` sorts by it and its KV admission reserves exactly it, so neither is the
peer a user would run. ``--end-at-output-len`` keeps the client's cap and ends each request from
inside the server instead: this SGLang custom logit processor (the server needs
``--enable-custom-logit-processor``) forbids the end-of-turn token before the recorded length and
makes it the only choice at it.

The class is plain Python (no SGLang import): SGLang loads a processor by unpickling it and calls
it, so the client, which may not have SGLang, pickles it by reference and the server imports it
from the installed package.
"""

from __future__ import annotations

import functools
import json
import pickle
from typing import Any, Dict, List, Optional

from specforge_outlets.serving.request_params import OUTPUT_LEN_PARAM, STOP_TOKEN_PARAM

# SGLang adds the request itself to custom_params for custom logit processors
REQUEST_PARAM = "__req__"
# tokens sampled so far for the request, counted on it by the processor
SAMPLED_ATTR = "outlets_end_at_sampled"
# the request's retraction_count when the count was last taken from its output_ids
RETRACTIONS_ATTR = "outlets_end_at_retractions"


class EndAtOutputLength:
    """SGLang custom logit processor: the stop token is forbidden before a request's length and forced at it.

    It counts its own calls per request (one per sampled token) instead of reading
    ``len(req.output_ids)``: under SGLang's overlap scheduler the previous step's token is not yet
    in ``output_ids`` when the next step samples, which ended requests one token late. The count
    starts from the tokens the request already holds at its first call on this instance (none on a
    single server, the prefill's first token on a PD decode instance: it was sampled elsewhere), and
    starts again from them after a retraction (a token in flight when the request was retracted was
    counted but dropped). Not handled: chunked prefill samples (and discards) a token per chunk, so
    a prompt prefilled in k chunks ends k - 1 tokens early; keep prompts under
    ``--chunked-prefill-size`` (the studies' prompts are under its 4,096-token CPU default).
    """

    def __call__(self, logits, custom_param_list: Optional[List[Optional[Dict[str, Any]]]] = None):
        for row, params in enumerate(custom_param_list or ()):
            if not params or OUTPUT_LEN_PARAM not in params:
                continue
            stop, req = params[STOP_TOKEN_PARAM], params[REQUEST_PARAM]
            sampled = getattr(req, SAMPLED_ATTR, None)
            retractions = getattr(req, "retraction_count", 0)
            if sampled is None or getattr(req, RETRACTIONS_ATTR, 0) != retractions:
                sampled = len(getattr(req, "output_ids", None) or ())
                setattr(req, RETRACTIONS_ATTR, retractions)
            sampling = sampled + 1  # the number of the token this step samples
            setattr(req, SAMPLED_ATTR, sampling)
            if sampling >= params[OUTPUT_LEN_PARAM]:
                logits[row, :] = float("-inf")
                logits[row, stop] = 0.0
            else:
                logits[row, stop] = float("-inf")
        return logits


@functools.lru_cache(maxsize=None)
def serialized_processor() -> str:
    """The processor as SGLang's ``custom_logit_processor`` field wants it (``CustomLogitProcessor.to_str``'s format)."""
    return json.dumps({"callable": pickle.dumps(EndAtOutputLength).hex()})


def end_at_params(output_len: int, stop_token_id: int) -> Dict[str, int]:
    """The custom_params entries that make :class:`EndAtOutputLength` end a request after ``output_len`` tokens."""
    return {OUTPUT_LEN_PARAM: int(output_len), STOP_TOKEN_PARAM: int(stop_token_id)}
