"""KV admission by prediction (``--outlets-kv-margin``): a running request holds its predicted remaining output of KV cache.

SGLang charges a running request ``new_token_ratio`` of its remaining ``max_new_tokens`` when it
decides whether new requests fit; with a prediction, the plugin charges the predicted remaining
length plus a margin instead (``specforge_outlets.scheduling.predicted_output_budget``).
"""

from __future__ import annotations

from sglang_patches import predictions as P
from sglang_patches import state
from specforge_outlets.scheduling import predicted_output_budget

_ADDER = "sglang.srt.managers.schedule_policy.PrefillAdder"


def running_token_offset_around(original, self, req):
    """KV admission by prediction: a running request holds its predicted remaining (+ margin) of output KV."""
    margin = state.settings().kv_margin
    if margin is None or not state.schedule_policy_is_outlets() or P.prediction(req) is None:
        return original(self, req)
    if getattr(getattr(req, "sampling_params", None), "ignore_eos", False):
        return original(self, req)  # runs to max_new_tokens whatever is predicted
    from sglang.srt.managers.schedule_policy import CLIP_MAX_NEW_TOKENS

    cap = min(max(req.sampling_params.max_new_tokens - len(req.output_ids), 0), CLIP_MAX_NEW_TOKENS)
    return predicted_output_budget(P.prediction(req), P.num_generated(req), margin, cap, state.settings().scheduling)


HOOK_TARGETS = [
    (f"{_ADDER}._get_running_request_total_token_offset", running_token_offset_around, "AROUND", {state.ORDERING}),
]
