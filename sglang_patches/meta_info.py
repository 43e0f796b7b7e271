"""The prediction in each response's ``meta_info`` (``predicted_output_len``), and its error when a request finishes.

Runs in the tokenizer process: the scheduler carries the prediction in the request's
``customized_info``; this turns the per-chunk values into one scalar.
"""

from __future__ import annotations

from sglang_patches.state import ORDERING, PREDICTOR, metrics  # by name: the hook's `state` is SGLang's
from sglang_patches.settings import META_INFO_KEY

_TOKENIZER = "sglang.srt.managers.tokenizer_manager.TokenizerManager"


def update_meta_info_after(result, self, meta_info, state, customized_info, index, finish_reason):
    values = meta_info.get(META_INFO_KEY)
    if isinstance(values, list):
        known = [value for value in values if value is not None]
        if not known:  # a request without a prediction (the prior was used): no key, as stock
            meta_info.pop(META_INFO_KEY, None)
            return result
        meta_info[META_INFO_KEY] = known[-1]
        if finish_reason is not None:
            completion = meta_info.get("completion_tokens")
            if isinstance(completion, int):
                metrics().prediction_error(abs(float(meta_info[META_INFO_KEY]) - completion))
    return result


HOOK_TARGETS = [
    (f"{_TOKENIZER}.update_request_meta_info", update_meta_info_after, "AFTER", {ORDERING, PREDICTOR}),
]
