"""What the plugin keeps on each SGLang ``Req``: one :class:`RequestRecord` (attribute ``ATTR_RECORD``) with the
request's :class:`~specforge_outlets.scheduling.LengthPrediction`, its arrival stamp, and the bookkeeping of its
prediction (the cached remaining length, predictor-only mode's prompt features).

Pure Python over duck-typed requests, so that it is unit-tested without SGLang. A prediction is made
and read through the scheduling core's object (``specforge_outlets.scheduling.prediction``); a new
one is reported in the request's ``customized_info`` (``customized_info.py``, the ``meta_info``
spellings: this module is where they are written) and drops the request's order keys (``key_tables.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from sglang_patches import state
from sglang_patches.customized_info import report
from sglang_patches.key_tables import drop_order_keys
from sglang_patches.settings import (
    META_INFO_KEY,
    QUANTILES_META_KEY,
    REMAINING_AFTER_META_KEY,
    REMAINING_META_KEY,
    REMAINING_QUANTILES_META_KEY,
)
from specforge_outlets.scheduling import LengthPrediction, PredictionSource, SchedulingConfig, remaining_or_prior


ATTR_RECORD = "outlets_record"  # the one attribute the plugin sets on an SGLang Req: its RequestRecord


@dataclass
class RequestRecord:
    """The plugin's state of one request, kept on its ``Req`` (created when first read)."""

    prediction: Optional[LengthPrediction] = None  # None until predicted
    arrival: Optional[float] = None  # monotonic seconds when first queued
    # (config, tokens generated, remaining): the last remaining_or_prior(), for the requests routing reads each poll
    remaining: Optional[Tuple[SchedulingConfig, int, float]] = None
    # predictor-only mode: the prompt's captured feature chunks while its prefill is chunked (None otherwise)
    prompt_features: Optional[List] = None


def record(req) -> RequestRecord:
    """The request's record (created on first use)."""
    found = getattr(req, ATTR_RECORD, None)
    if found is None:
        found = RequestRecord()
        setattr(req, ATTR_RECORD, found)
    return found


def stamp_arrival(req) -> float:
    """The request's arrival stamp, set now if it has none (when it is first queued)."""
    own = record(req)
    if own.arrival is None:
        own.arrival = time.monotonic()
    return own.arrival


def arrival_time(req) -> float:
    value = record(req).arrival
    return time.monotonic() if value is None else value


def prediction(req) -> Optional[LengthPrediction]:
    """The request's latest prediction; None until predicted."""
    return record(req).prediction


def predicted_output_len(req) -> Optional[float]:
    """The request's predicted total output length (r̂_0, or t - 1 + r̂_t once re-predicted); None until predicted."""
    latest = record(req).prediction
    return None if latest is None else latest.predicted_output_len


def predicted_output_quantiles(req) -> Optional[Tuple[float, ...]]:
    """The request's total-length quantiles at the config's levels; None: a point mass at :func:`predicted_output_len`."""
    latest = record(req).prediction
    return None if latest is None else latest.predicted_output_quantiles


def set_predicted_output_len(req, value: float, source, quantiles: Optional[Sequence[float]] = None) -> None:
    """r̂_0: the request's predicted output length, reported as ``predicted_output_len``, and, when the source
    gives them, the quantiles of that length (``predicted_output_quantiles``); a prediction without
    quantiles replaces earlier ones (the request is a point mass at ``value`` again)."""
    _set_first(req, LengthPrediction.of_total(value, source, quantiles), value)


def _set_first(req, made: LengthPrediction, reported: float) -> None:
    """Store r̂_0 and report it (as ``reported``: the number the source gave) and its quantiles."""
    _store(req, made)
    report(req, META_INFO_KEY, reported)
    if made.predicted_output_quantiles is not None:
        report(req, QUANTILES_META_KEY, made.predicted_output_quantiles)


def set_predicted_remaining(req, value: float, output_len: int,
                            remaining_quantiles: Optional[Sequence[float]] = None) -> None:
    """r̂_t from the running EAGLE-3 draft, read at the ``output_len``-th output token.

    ``value`` is the predicted remaining output tokens (the head's ``log_remaining``, in tokens), stored as the
    total :meth:`LengthPrediction.from_remaining` makes of it. That total replaces the prediction every reader uses
    (the order keys, retraction, KV admission, routing), so each falls by one per token generated until
    the next value; the first (``output_len == 1``, at prefill) is r̂_0 itself, reported as such.

    ``remaining_quantiles`` (the draft's quantile head, read on the same state) are stored the same way, as
    total-length quantiles, and reported as the remaining-length quantiles after ``output_len`` tokens
    (``predicted_remaining_quantiles``).
    """
    made = LengthPrediction.from_remaining(value, output_len, remaining_quantiles)
    if output_len <= 1:
        _set_first(req, made, made.predicted_output_len)
        return
    _store(req, made)
    offset = output_len - 1
    report(req, REMAINING_META_KEY, max(made.predicted_output_len - output_len, 0.0), at_output=offset)
    report(req, REMAINING_AFTER_META_KEY, output_len, at_output=offset)
    if made.predicted_output_quantiles is not None:
        report(req, REMAINING_QUANTILES_META_KEY, made.remaining_quantiles(output_len), at_output=offset)


def _store(req, made: LengthPrediction) -> None:
    own = record(req)
    own.prediction, own.remaining = made, None
    drop_order_keys(req)


def fall_back_to_prior(req, config: SchedulingConfig, reason: str) -> None:
    state.PLUGIN.fallbacks.record(getattr(req, "rid", "?"), reason)
    state.metrics().served_on_prior()
    set_predicted_output_len(req, config.prior_output_len, PredictionSource.PRIOR)


def num_generated(req) -> int:
    output_ids = getattr(req, "output_ids", None)
    return len(output_ids) if output_ids is not None else 0


def predicted_remaining(req, config: SchedulingConfig) -> float:
    """Predicted remaining output tokens (the prior's when unpredicted), cached on the request until it generates a
    token or is re-predicted."""
    own = record(req)
    cached = own.remaining
    generated = num_generated(req)
    if cached is not None and cached[0] is config and cached[1] == generated:
        return cached[2]
    value = remaining_or_prior(own.prediction, generated, config)
    own.remaining = (config, generated, value)
    return value
