"""Per-request prediction state, kept on SGLang ``Req`` objects (plain attributes): the predicted output
length, its quantiles and source, the arrival stamp, and the remaining length routing and KV admission read.

Pure Python over duck-typed requests, so that it is unit-tested without SGLang. The remaining-length
rule comes from the shared scheduling core (``specforge_outlets.scheduling``). A new prediction is
reported in the request's ``customized_info`` (``customized_info.py``) and drops the request's order
keys (``key_tables.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Optional, Sequence, Tuple

from sglang_patches.customized_info import report
from sglang_patches.key_tables import drop_order_keys
from sglang_patches.settings import (
    META_INFO_KEY,
    QUANTILES_META_KEY,
    REMAINING_AFTER_META_KEY,
    REMAINING_META_KEY,
    REMAINING_QUANTILES_META_KEY,
)
from specforge_outlets import scheduling
from specforge_outlets.scheduling import SchedulingConfig

logger = logging.getLogger("sglang_patches")

ATTR_PREDICTED_OUTPUT_LEN = "outlets_predicted_output_len"  # float, or None until predicted
ATTR_SOURCE = "outlets_prediction_source"  # "external", "draft", "prefill" (PD transfer), "prior" (fallback)
ATTR_ARRIVAL = "outlets_arrival_time"  # monotonic seconds when first queued
# (config, tokens generated, predicted remaining): predicted_remaining(), for the requests routing and KV admission read
ATTR_PREDICTED_REMAINING = "outlets_predicted_remaining"
# tuple of the TOTAL output length's quantiles at the config's quantile_levels, or None: a point mass at the
# prediction. Set with the prediction and from the same source (the request's own, the draft, the prefill).
ATTR_PREDICTED_OUTPUT_QUANTILES = "outlets_predicted_output_quantiles"
# Smallest total-length quantile kept: a draft may predict 0 remaining at prefill, the core's distributions need > 0
MIN_QUANTILE = 1e-3


class FallbackCounter:
    """Counts predictions that failed and fell back to the prior (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def record(self, rid, reason: str, using: str = "the prior") -> int:
        with self._lock:
            self.count += 1
            count = self.count
        logger.warning("OUTLETS prediction failed for request %s (%s): using %s; failures so far: %d",
                       rid, reason, using, count)
        return count


FALLBACKS = FallbackCounter()


def stamp_arrival(req) -> float:
    """The request's arrival stamp, set now if it has none (when it is first queued)."""
    arrival = getattr(req, ATTR_ARRIVAL, None)
    if arrival is None:
        arrival = time.monotonic()
        setattr(req, ATTR_ARRIVAL, arrival)
    return arrival


def arrival_time(req) -> float:
    value = getattr(req, ATTR_ARRIVAL, None)
    return time.monotonic() if value is None else value


def predicted_output_len(req) -> Optional[float]:
    """The request's predicted total output length (r̂_0, or t - 1 + r̂_t once re-predicted); None until predicted."""
    return getattr(req, ATTR_PREDICTED_OUTPUT_LEN, None)


def prediction_source(req) -> Optional[str]:
    """Where the request's prediction came from (``ATTR_SOURCE``); None until predicted."""
    return getattr(req, ATTR_SOURCE, None)


def is_external(req) -> bool:
    """The prediction came with the request (``custom_params``): it takes precedence over any predictor."""
    return getattr(req, ATTR_SOURCE, None) == "external"


def predicted_output_quantiles(req) -> Optional[Tuple[float, ...]]:
    """The request's total-length quantiles at the config's levels; None: a point mass at :func:`predicted_output_len`."""
    return getattr(req, ATTR_PREDICTED_OUTPUT_QUANTILES, None)


def set_predicted_output_len(req, value: float, source: str, quantiles: Optional[Sequence[float]] = None) -> None:
    """r̂_0: the request's predicted output length, reported as ``predicted_output_len``, and, when the source
    gives them, the quantiles of that length (``predicted_output_quantiles``); a prediction without
    quantiles replaces earlier ones (the request is a point mass at ``value`` again)."""
    totals = None if quantiles is None else _total_quantiles(quantiles)
    _store_predicted_output_len(req, value, source, totals)
    report(req, META_INFO_KEY, value)
    if totals is not None:
        report(req, QUANTILES_META_KEY, totals)


def _total_quantiles(values: Sequence[float]) -> Tuple[float, ...]:
    """Quantiles as the core reads them: floats, at least :data:`MIN_QUANTILE`, non-decreasing (a running maximum
    undoes a float rounding that crossed two equal ones)."""
    totals, highest = [], MIN_QUANTILE
    for value in values:
        highest = max(highest, float(value))
        totals.append(highest)
    return tuple(totals)


def set_predicted_remaining(req, value: float, output_len: int,
                            remaining_quantiles: Optional[Sequence[float]] = None) -> None:
    """r̂_t from the running EAGLE-3 draft, read at the ``output_len``-th output token.

    ``value`` is the predicted remaining output tokens (the head's ``log_remaining``, in tokens). The head's
    value at a token counts that token (the labels are L, L-1, ..., 1 from the first
    response token on: ``specforge_outlets.data.labels``), so the request is predicted to end after
    ``output_len - 1 + value`` tokens. That total replaces the prediction every reader uses (the
    order keys, retraction, KV admission, routing), so each falls by one per token generated until
    the next value; the first (``output_len == 1``, at prefill) is r̂_0 itself.

    ``remaining_quantiles`` (the draft's quantile head, read on the same state) are stored the same
    way, as total-length quantiles ``output_len - 1 + r_q``, and reported as the remaining-length
    quantiles after ``output_len`` tokens (``predicted_remaining_quantiles``).
    """
    offset = output_len - 1
    total = offset + float(value)
    totals = None if remaining_quantiles is None else [offset + float(quantile) for quantile in remaining_quantiles]
    if output_len <= 1:
        set_predicted_output_len(req, total, "draft", totals)
        return
    totals = None if totals is None else _total_quantiles(totals)
    _store_predicted_output_len(req, total, "draft", totals)
    report(req, REMAINING_META_KEY, max(total - output_len, 0.0), at_output=offset)
    report(req, REMAINING_AFTER_META_KEY, output_len, at_output=offset)
    if totals is not None:
        report(req, REMAINING_QUANTILES_META_KEY, [max(value - output_len, 0.0) for value in totals], at_output=offset)


def _store_predicted_output_len(req, value: float, source: str, totals: Optional[Tuple[float, ...]] = None) -> None:
    setattr(req, ATTR_PREDICTED_OUTPUT_LEN, float(value))
    setattr(req, ATTR_PREDICTED_OUTPUT_QUANTILES, totals)
    setattr(req, ATTR_PREDICTED_REMAINING, None)
    drop_order_keys(req)
    setattr(req, ATTR_SOURCE, source)


def fall_back_to_prior(req, config: SchedulingConfig, reason: str) -> None:
    FALLBACKS.record(getattr(req, "rid", "?"), reason)
    set_predicted_output_len(req, config.prior_output_len, "prior")


def num_generated(req) -> int:
    output_ids = getattr(req, "output_ids", None)
    return len(output_ids) if output_ids is not None else 0


def predicted_remaining(req, config: SchedulingConfig) -> float:
    """Predicted remaining output tokens, cached on the request until it generates a token or is re-predicted."""
    cached = getattr(req, ATTR_PREDICTED_REMAINING, None)
    generated = num_generated(req)
    if cached is not None and cached[0] is config and cached[1] == generated:
        return cached[2]
    value = scheduling.predicted_remaining(predicted_output_len(req), generated, config.prior_output_len)
    setattr(req, ATTR_PREDICTED_REMAINING, (config, generated, value))
    return value
