"""The prediction in each response's ``meta_info`` (``predicted_output_len``, and in EAGLE-3 mode the latest
remaining estimate), its quantiles when it has them (``predicted_output_quantiles``, and in EAGLE-3 mode
``predicted_remaining_quantiles``), and the prediction and its error when a request finishes (the Prometheus
histograms, ``state._Metrics``).

Runs in the tokenizer process: the scheduler carries each value in the request's ``customized_info``,
which SGLang accumulates over the output chunks; this turns each into its latest scalar.
"""

from __future__ import annotations

# by name: the hook's `state` argument is SGLang's
from sglang_patches.state import ORDERING, PREDICTOR, SPECULATIVE, disaggregation_mode, metrics
from sglang_patches.settings import (
    META_INFO_KEY,
    QUANTILES_META_KEY,
    REMAINING_AFTER_META_KEY,
    REMAINING_META_KEY,
    REMAINING_QUANTILES_META_KEY,
)

_TOKENIZER = "sglang.srt.managers.tokenizer_manager.TokenizerManager"


def _latest(meta_info: dict, key: str, vector: bool = False) -> None:
    values = meta_info.get(key)
    if vector and isinstance(values, list) and values and not any(
            value is None or isinstance(value, list) for value in values):
        return  # one list of quantiles already (this meta_info was read before)
    if isinstance(values, list):
        # from the end: SGLang accumulates one entry per output token over a streamed request
        latest = next((value for value in reversed(values) if value is not None), None)
        if latest is not None:
            meta_info[key] = latest
        else:  # a request without a prediction (the prior was used): no key, as stock
            meta_info.pop(key, None)


def update_meta_info_after(result, self, meta_info, state, customized_info, index, finish_reason):
    for key in (META_INFO_KEY, REMAINING_META_KEY, REMAINING_AFTER_META_KEY):
        _latest(meta_info, key)
    for key in (QUANTILES_META_KEY, REMAINING_QUANTILES_META_KEY):
        _latest(meta_info, key, vector=True)
    if finish_reason is not None and META_INFO_KEY in meta_info and not _is_prefill_instance(self):
        completion = meta_info.get("completion_tokens")
        if isinstance(completion, int):
            metrics().finished(float(meta_info[META_INFO_KEY]), completion)
    return result


def _is_prefill_instance(tokenizer_manager) -> bool:
    """A PD prefill instance finishes each request after its first token; the decode instance reports the request."""
    return disaggregation_mode(tokenizer_manager) == "prefill"


HOOK_TARGETS = [
    (f"{_TOKENIZER}.update_request_meta_info", update_meta_info_after, "AFTER", {ORDERING, PREDICTOR, SPECULATIVE}),
]
