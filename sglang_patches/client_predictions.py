"""A client's per-request settings: carried in ``custom_labels`` through sglang-router, the prediction checked, and
read at the scheduler into the request's prediction state (``assign_external_prediction``).

sglang-router 0.3.2 re-serialises a ``/generate`` body through its own request type, which has no
``custom_params`` (neither in ``sampling_params`` nor at the top level): a prediction there never
reaches the workers behind the router. ``custom_labels`` (a string-to-string map SGLang uses for
metrics labels) is kept, on the prefill and the decode instance alike, and so is
``custom_logit_processor``. So a request may carry its prediction as
``"custom_labels": {"outlets_predicted_output_len": "120"}`` (a string: the router's type for the
map's values), and ``outlets bench-serving --through-router`` its end-at-length settings the same
way; this hook moves each ``LABEL_PARAMS`` key into ``sampling_params.custom_params``, where the
plugin and the benchmark's logit processor read them, and out of the labels (with
``--enable-metrics`` SGLang's histograms raise on a label name they were not created with, and the
tokenizer process dies). The move happens in any server the plugin is installed in, whatever its
policy: a baseline server behind the same router must end requests where the benchmark says too.
A value already in ``custom_params`` wins.

Under an OUTLETS policy a prediction that is not a positive number of tokens, or is above the model's
context length (1e12: the longest output possible is the context), is refused with the request's id
(HTTP 400, or an error event on a stream), wherever it came from: a bad value is a client bug that
would otherwise hide behind the prior or poison the order, the KV admission and the error metrics.
So are quantiles (``outlets_predicted_quantiles``: a list, or in ``custom_labels`` a string
"q1,q2,...") that are not one positive token count per quantile level of the server, non-decreasing,
within the context length, and an ``outlets_*`` key the plugin does not read (a misspelling, which
would otherwise be ignored). The check runs where SGLang checks a request against the context length
(``TokenizerManager._validate_one_request``, once per request of a batch), whose ValueError SGLang's
HTTP server answers with 400.

``/v1/completions`` keeps a top-level ``custom_params`` through the router and needs none of this.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from sglang_patches import state
from sglang_patches.predictions import fall_back_to_prior, predicted_output_len, set_predicted_output_len
from sglang_patches.settings import CUSTOM_PARAM_KEY, QUANTILES_PARAM_KEY, parse_prediction, parse_quantiles
from specforge_outlets.serving.request_params import OUTPUT_LEN_PARAM, STOP_TOKEN_PARAM
from specforge_outlets.scheduling import PredictionSource, SchedulingConfig, request_distribution

# custom_labels keys moved into custom_params, each with how its string becomes the value read there
# (the prediction and its quantiles stay as sent: they are parsed, and refused if bad, where every prediction is)
LABEL_PARAMS: Dict[str, Callable[[str], Any]] = {CUSTOM_PARAM_KEY: str, QUANTILES_PARAM_KEY: str,
                                                 OUTPUT_LEN_PARAM: int, STOP_TOKEN_PARAM: int}
# A custom_params or custom_labels key with this prefix is the plugin's: one not in LABEL_PARAMS is refused (a typo)
REQUEST_KEY_PREFIX = "outlets_"


def _with_params(sampling_params, moved: Dict[str, Any]):
    """``sampling_params`` (a request's dict, or None) with the ``moved`` entries its custom_params lacks."""
    params = dict(sampling_params or {})
    custom = params.get("custom_params")
    custom = custom if isinstance(custom, dict) else {}
    params["custom_params"] = {**moved, **custom}
    return params


def move_labels_to_custom_params(obj) -> None:
    """Move the ``LABEL_PARAMS`` entries of a ``GenerateReqInput``'s custom_labels into its sampling params."""
    labels = getattr(obj, "custom_labels", None)
    if not isinstance(labels, dict) or not LABEL_PARAMS.keys() & labels.keys():
        return
    moved = {}
    for key, convert in LABEL_PARAMS.items():
        if key in labels:
            try:
                moved[key] = convert(labels[key])
            except (TypeError, ValueError):
                raise ValueError(f"custom_labels[{key!r}] = {labels[key]!r} is not an integer; send the number as a "
                                 "string of digits") from None
    obj.custom_labels = {key: label for key, label in labels.items() if key not in LABEL_PARAMS} or None
    sampling = getattr(obj, "sampling_params", None)
    if isinstance(sampling, list):  # a batch: the labels are the batch's, each item keeps its own values
        obj.sampling_params = [_with_params(item, moved) for item in sampling]
    elif sampling is None or isinstance(sampling, dict):
        obj.sampling_params = _with_params(sampling, moved)


def refuse_bad_request(obj, context_len: int) -> None:
    """ValueError (HTTP 400, or an error event on a stream) naming the request when one request of a
    ``GenerateReqInput`` (SGLang validates each, ``TokenizerManager._validate_one_request``) carries an
    ``outlets_*`` key the plugin does not read (a misspelling would otherwise be ignored), a prediction that is not a
    positive number of tokens within the model's context length, or unusable quantiles: each would otherwise hide
    behind the prior or poison the scheduling and the error metrics."""
    sampling = obj.sampling_params if isinstance(obj.sampling_params, dict) else {}
    custom = sampling.get("custom_params")
    custom = custom if isinstance(custom, dict) else {}
    labels = obj.custom_labels if isinstance(obj.custom_labels, dict) else {}
    for field, keys in (("custom_params", custom), ("custom_labels", labels)):
        unknown = sorted(key for key in keys if isinstance(key, str) and key.startswith(REQUEST_KEY_PREFIX)
                         and key not in LABEL_PARAMS)
        if unknown:
            raise ValueError(f"request {obj.rid}: unknown OUTLETS parameter "
                             f"{', '.join(f'{field}[{key!r}]' for key in unknown)}; the plugin reads "
                             f"{', '.join(LABEL_PARAMS)}")
    if custom.get(QUANTILES_PARAM_KEY) is not None:
        levels = state.settings().scheduling.quantile_levels
        try:
            quantiles = parse_quantiles(custom[QUANTILES_PARAM_KEY], levels)
            if quantiles[-1] > context_len:
                raise ValueError(f"{quantiles[-1]:g} tokens is above the model's context length "
                                 f"({context_len} tokens)")
        except ValueError as error:
            raise ValueError(f"request {obj.rid}: {QUANTILES_PARAM_KEY} = {custom[QUANTILES_PARAM_KEY]!r} is not usable "
                             f"({error}); send one predicted total output length per quantile level "
                             f"({','.join(f'{level:g}' for level in levels)}), non-decreasing, at most {context_len}, "
                             "or leave it out") from None
    if CUSTOM_PARAM_KEY not in custom:
        return
    value = custom[CUSTOM_PARAM_KEY]
    try:
        predicted = parse_prediction(value)
    except (TypeError, ValueError):
        predicted = 0.0
    if not predicted > 0:
        raise ValueError(f"request {obj.rid}: {CUSTOM_PARAM_KEY} = {value!r} is not a positive number of tokens; "
                         "send the predicted output length (> 0), or leave it out for the server's predictor")
    if predicted > context_len:
        raise ValueError(f"request {obj.rid}: {CUSTOM_PARAM_KEY} = {value!r} is above the model's context length "
                         f"({context_len} tokens), the longest output possible; send the predicted output length "
                         f"(> 0, at most {context_len}), or leave it out for the server's predictor")


def external_prediction(sampling_params) -> Optional[float]:
    """The externally supplied prediction of a request's sampling params; None if absent.

    Raises ValueError if present but unusable."""
    params = getattr(sampling_params, "custom_params", None)
    if not isinstance(params, dict) or CUSTOM_PARAM_KEY not in params:
        return None
    return parse_prediction(params[CUSTOM_PARAM_KEY])


def external_quantiles(sampling_params, levels: Sequence[float]) -> Optional[Tuple[float, ...]]:
    """The externally supplied total-length quantiles (at ``levels``) of a request's sampling params; None if absent.

    Raises ValueError if present but unusable."""
    params = getattr(sampling_params, "custom_params", None)
    if not isinstance(params, dict) or params.get(QUANTILES_PARAM_KEY) is None:
        return None
    return parse_quantiles(params[QUANTILES_PARAM_KEY], levels)


def assign_external_prediction(req, config: SchedulingConfig) -> bool:
    """Take a request's externally supplied prediction and quantiles, if any. True if either was present.

    The client's prediction is taken whole: a request that brings a point prediction or quantiles is
    not predicted by a draft at all (neither), as a point prediction alone already was not. Quantiles
    without a point prediction give it as their median (the core's :class:`LengthDistribution`);
    a point prediction without quantiles is a point mass."""
    if predicted_output_len(req) is not None:
        return True
    sampling_params = getattr(req, "sampling_params", None)
    try:
        value = external_prediction(sampling_params)
    except (TypeError, ValueError) as error:
        fall_back_to_prior(req, config, f"bad {CUSTOM_PARAM_KEY}: {error}")
        return True
    try:
        totals = external_quantiles(sampling_params, config.quantile_levels)
    except (TypeError, ValueError) as error:
        fall_back_to_prior(req, config, f"bad {QUANTILES_PARAM_KEY}: {error}")
        return True
    if value is None and totals is None:
        return False
    if value is None:
        value = request_distribution(None, totals, config).quantile(0.5)
    set_predicted_output_len(req, value, PredictionSource.EXTERNAL, totals)
    return True


def normalize_before(self, *args, **kwargs):
    """Labels into custom_params before SGLang normalises the request (and copies them to a batch's items)."""
    move_labels_to_custom_params(self)


def validate_one_request_after(result, self, obj, *args, **kwargs):
    """The client's OUTLETS parameters checked where SGLang checks a request against the context length."""
    if state.plugin_active() and isinstance(getattr(obj, "sampling_params", None), dict):
        refuse_bad_request(obj, int(self.context_len))
    return result


_GENERATE_INPUT = "sglang.srt.managers.io_struct.GenerateReqInput"
_TOKENIZER = "sglang.srt.managers.tokenizer_manager.TokenizerManager"

HOOK_TARGETS = [
    (f"{_GENERATE_INPUT}.normalize_batch_and_arguments", normalize_before, "BEFORE",
     {state.ORDERING, state.ROUTING, state.PREDICTOR}),
    (f"{_TOKENIZER}._validate_one_request", validate_one_request_after, "AFTER",
     {state.ORDERING, state.ROUTING, state.PREDICTOR}),
]
