"""A client's prediction in ``custom_labels``, the field of ``/generate`` that ``sglang-router`` keeps.

sglang-router 0.3.2 re-serialises a ``/generate`` body through its own request type, which has no
``custom_params`` (neither in ``sampling_params`` nor at the top level): a prediction there never
reaches the workers behind the router. ``custom_labels`` (a string-to-string map SGLang uses for
metrics labels) is kept, on the prefill and the decode instance alike. So a request may carry its
prediction as ``"custom_labels": {"outlets_predicted_output_len": "120"}`` (a string: the router's
type for the map's values); this hook moves it into ``sampling_params.custom_params``, where every
reader of the plugin looks (``predictions.external_prediction``), and out of the labels (SGLang's
metrics refuse label names they do not know). A prediction already in ``custom_params`` wins. The
value is checked where ``custom_params`` is: a bad one falls back to the prior, logged with the
request's id.

``/v1/completions`` keeps a top-level ``custom_params`` through the router and needs none of this.
"""

from __future__ import annotations

from sglang_patches import state
from sglang_patches.settings import CUSTOM_PARAM_KEY


def _with_prediction(sampling_params, value):
    """``sampling_params`` (a request's dict, or None) with ``value`` in its custom_params unless one is there."""
    params = dict(sampling_params or {})
    custom = params.get("custom_params")
    if isinstance(custom, dict) and CUSTOM_PARAM_KEY in custom:
        return sampling_params
    params["custom_params"] = {**(custom if isinstance(custom, dict) else {}), CUSTOM_PARAM_KEY: value}
    return params


def copy_label_to_custom_params(obj) -> None:
    """Move ``custom_labels[outlets_predicted_output_len]`` of a ``GenerateReqInput`` into its sampling params."""
    labels = getattr(obj, "custom_labels", None)
    if not isinstance(labels, dict) or CUSTOM_PARAM_KEY not in labels:
        return
    value = labels[CUSTOM_PARAM_KEY]
    # Out of the labels: with --enable-metrics SGLang passes every label to its Prometheus histograms,
    # which raise on a label name they were not created with, and the tokenizer process dies.
    obj.custom_labels = {key: label for key, label in labels.items() if key != CUSTOM_PARAM_KEY} or None
    sampling = getattr(obj, "sampling_params", None)
    if isinstance(sampling, list):  # a batch: the label is the batch's, each item without its own gets it
        obj.sampling_params = [_with_prediction(item, value) for item in sampling]
    elif sampling is None or isinstance(sampling, dict):
        obj.sampling_params = _with_prediction(sampling, value)


def normalize_before(self, *args, **kwargs):
    if state.plugin_active():
        copy_label_to_custom_params(self)
    return None


_GENERATE_INPUT = "sglang.srt.managers.io_struct.GenerateReqInput"

HOOK_TARGETS = [
    (f"{_GENERATE_INPUT}.normalize_batch_and_arguments", normalize_before, "BEFORE",
     {state.ORDERING, state.ROUTING, state.PREDICTOR}),
]
