"""Per-request prediction state, kept on SGLang ``Req`` objects (plain attributes).

Pure Python over duck-typed requests, so that it is unit-tested without SGLang. The ordering key
and the remaining-length rule come from the shared scheduling core (``specforge_outlets.scheduling``).
"""

from __future__ import annotations

import logging
import threading
import time
from itertools import compress
from typing import Dict, List, Optional, Sequence, Tuple

from specforge_outlets.scheduling import (
    OrderKey,
    RequestKeys,
    SchedulingConfig,
    is_predicted_long,
    predicted_remaining,
    request_distribution,
    request_prompt_len,
    short_merge_key,
    sjf_sort_key,
)
from sglang_patches.settings import (
    CUSTOM_PARAM_KEY,
    META_INFO_KEY,
    QUANTILES_META_KEY,
    QUANTILES_PARAM_KEY,
    REMAINING_AFTER_META_KEY,
    REMAINING_META_KEY,
    REMAINING_QUANTILES_META_KEY,
    parse_prediction,
    parse_quantiles,
)

logger = logging.getLogger("sglang_patches")

ATTR_PREDICTION = "outlets_predicted_output_len"  # float, or None until predicted
ATTR_SOURCE = "outlets_prediction_source"  # "external", "draft", "prefill" (PD transfer), "prior" (fallback)
ATTR_ARRIVAL = "outlets_arrival_time"  # monotonic seconds when first queued
# (config, tokens generated, predicted remaining): remaining(), for the requests routing and KV admission read
ATTR_REMAINING = "outlets_predicted_remaining"
# tuple of the TOTAL output length's quantiles at the config's quantile_levels (issue 27), or None: a point mass at
# the prediction. Set with the prediction and from the same source (the request's own, the draft, the prefill).
ATTR_QUANTILES = "outlets_predicted_output_quantiles"
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


def prediction(req) -> Optional[float]:
    return getattr(req, ATTR_PREDICTION, None)


def prediction_source(req) -> Optional[str]:
    """Where the request's prediction came from (``ATTR_SOURCE``); None until predicted."""
    return getattr(req, ATTR_SOURCE, None)


def is_external(req) -> bool:
    """The prediction came with the request (``custom_params``): it takes precedence over any predictor."""
    return getattr(req, ATTR_SOURCE, None) == "external"


def predicted_quantiles(req) -> Optional[Tuple[float, ...]]:
    """The request's total-length quantiles at the config's levels; None: a point mass at :func:`prediction`."""
    return getattr(req, ATTR_QUANTILES, None)


def set_prediction(req, value: float, source: str, quantiles: Optional[Sequence[float]] = None) -> None:
    """r̂_0: the request's predicted output length, reported as ``predicted_output_len``, and, when the source
    gives them, the quantiles of that length (``predicted_output_quantiles``); a prediction without
    quantiles replaces earlier ones (the request is a point mass at ``value`` again)."""
    totals = None if quantiles is None else _total_quantiles(quantiles)
    _predict_total(req, value, source, totals)
    _report(req, META_INFO_KEY, value)
    if totals is not None:
        _report(req, QUANTILES_META_KEY, totals)


def _total_quantiles(values: Sequence[float]) -> Tuple[float, ...]:
    """Quantiles as the core reads them: floats, at least :data:`MIN_QUANTILE`, non-decreasing (a running maximum
    undoes a float rounding that crossed two equal ones)."""
    totals, highest = [], MIN_QUANTILE
    for value in values:
        highest = max(highest, float(value))
        totals.append(highest)
    return tuple(totals)


def set_remaining_estimate(req, estimate: float, output_len: int,
                           remaining_quantiles: Optional[Sequence[float]] = None) -> None:
    """r̂_t from the running EAGLE-3 draft, read at the ``output_len``-th output token.

    The head's estimate at a token counts that token (the labels are L, L-1, ..., 1 from the first
    response token on: ``specforge_outlets.data.labels``), so the request is predicted to end after
    ``output_len - 1 + estimate`` tokens. That total replaces the prediction every reader uses (the
    order keys, retraction, KV admission, routing), so each falls by one per token generated until
    the next estimate; the first estimate (``output_len == 1``, at prefill) is r̂_0 itself.

    ``remaining_quantiles`` (the draft's quantile head, read on the same state) are stored the same
    way, as total-length quantiles ``output_len - 1 + r_q``, and reported as the remaining-length
    quantiles after ``output_len`` tokens (``predicted_remaining_quantiles``).
    """
    offset = output_len - 1
    total = offset + float(estimate)
    totals = None if remaining_quantiles is None else [offset + float(value) for value in remaining_quantiles]
    if output_len <= 1:
        set_prediction(req, total, "draft", totals)
        return
    totals = None if totals is None else _total_quantiles(totals)
    _predict_total(req, total, "draft", totals)
    _report(req, REMAINING_META_KEY, max(total - output_len, 0.0), at_output=offset)
    _report(req, REMAINING_AFTER_META_KEY, output_len, at_output=offset)
    if totals is not None:
        _report(req, REMAINING_QUANTILES_META_KEY, [max(value - output_len, 0.0) for value in totals], at_output=offset)


def _predict_total(req, value: float, source: str, totals: Optional[Tuple[float, ...]] = None) -> None:
    setattr(req, ATTR_PREDICTION, float(value))
    setattr(req, ATTR_QUANTILES, totals)
    setattr(req, ATTR_REMAINING, None)
    drop_order_keys(req)
    setattr(req, ATTR_SOURCE, source)


def _report(req, key: str, value, at_output: int = 0) -> None:
    """``value`` under ``key`` in the request's ``customized_info``, at output token ``at_output``.

    SGLang slices each ``customized_info`` list by output token when it streams (a chunk carries
    the entries of its own tokens), so a value is put at the token it belongs to: r̂_0 at the first
    (sent with it, or at the end without streaming), r̂_t at the token it was read at. The meta_info
    hook (``meta_info.py``) reports the latest value of each key."""
    info = getattr(req, "customized_info", None)
    if info is None:
        info = {}
        try:
            req.customized_info = info
        except AttributeError:
            return
    # only the latest value is kept (earlier ones were streamed with their tokens already)
    info[key] = TokenAlignedValue(at_output, _reported(value))


def _reported(value):
    """A value as ``meta_info`` shows it: integers as they are, floats to 3 decimals, quantiles as a list of those."""
    if isinstance(value, (list, tuple)):
        return [round(float(item), 3) for item in value]
    return value if isinstance(value, int) else round(float(value), 3)


class TokenAlignedValue:
    """A per-token list that holds one value, at output token ``index``, without materialising the rest.

    SGLang reads a ``customized_info`` entry by slicing it with output-token offsets; a real list
    would cost one entry per output token every time an estimate is made. A slice is built only for
    the tokens it covers (the tokens of one streamed chunk, or all of them once at the end)."""

    __slots__ = ("index", "value")

    def __init__(self, index: int, value) -> None:
        self.index, self.value = index, value

    def __len__(self) -> int:
        return self.index + 1

    def __getitem__(self, item):
        if isinstance(item, slice):
            start, stop, step = item.indices(len(self))
            return [self.value if position == self.index else None for position in range(start, stop, step)]
        position = item + len(self) if item < 0 else item
        if not 0 <= position < len(self):
            raise IndexError(item)
        return self.value if position == self.index else None

    def __iter__(self):
        return iter(self[:])

    def __eq__(self, other) -> bool:
        return list(self) == list(other)

    def __repr__(self) -> str:
        return f"TokenAlignedValue({self.index}, {self.value!r})"


def fall_back_to_prior(req, config: SchedulingConfig, reason: str) -> None:
    FALLBACKS.record(getattr(req, "rid", "?"), reason)
    set_prediction(req, config.prior_output_len, "prior")


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
    if prediction(req) is not None:
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
    set_prediction(req, value, "external", totals)
    return True


def num_generated(req) -> int:
    output_ids = getattr(req, "output_ids", None)
    return len(output_ids) if output_ids is not None else 0


def remaining(req, config: SchedulingConfig) -> float:
    """Predicted remaining output tokens, cached on the request until it generates a token or is re-predicted."""
    cached = getattr(req, ATTR_REMAINING, None)
    generated = num_generated(req)
    if cached is not None and cached[0] is config and cached[1] == generated:
        return cached[2]
    value = predicted_remaining(prediction(req), generated, config.prior_output_len)
    setattr(req, ATTR_REMAINING, (config, generated, value))
    return value


# Entries a key table may hold beyond the list it last ordered (requests that left the queue:
# admitted, finished) before it is cut back to that list; bounds the finished requests it keeps alive.
KEY_TABLE_SLACK = 1024


class _KeyTable:
    """The order keys of waiting requests under one scheduling config, by request.

    Each order computes only the keys it reads: the SJF order its sort key, the tail-safe order a
    request's class, merge key and arrival stamp (a request that has one of these has all three)."""

    def __init__(self) -> None:
        self.sjf: Dict[object, tuple] = {}  # request -> sjf_sort_key
        self.long: Dict[object, bool] = {}  # request -> is_predicted_long
        self.merge: Dict[object, int] = {}  # request -> tail-safe merge key
        self.arrival: Dict[object, float] = {}  # request -> its arrival stamp (tail-safe)

    def drop(self, req) -> None:
        for table in (self.sjf, self.long, self.merge, self.arrival):
            table.pop(req, None)

    def keep_only(self, reqs) -> None:
        for name in ("sjf", "long", "merge", "arrival"):
            table = getattr(self, name)
            setattr(self, name, {req: table[req] for req in reqs if req in table})


# One key table per scheduling config in this process, shared by its providers, so that keys
# computed for another config are never read.
_KEY_TABLES: Dict[SchedulingConfig, _KeyTable] = {}


def drop_order_keys(req) -> None:
    """Forget a request's cached order keys: its prediction changed, or it ran and may come back with more tokens."""
    for table in _KEY_TABLES.values():
        table.drop(req)


class CachedOrderKeys(RequestKeys):
    """Order keys of SGLang requests, computed once per stay in the waiting list and sorted by at C speed.

    SGLang re-sorts its waiting list every scheduling round, and a waiting request's keys cannot
    change: it generates nothing, and aging is linear in arrival time. So they are computed once
    and kept in dicts keyed by the request (SGLang's ``Req`` hashes by identity), and a round sorts
    with ``dict.__getitem__`` as the key, with no Python call per request. The keys are kept beside
    the requests rather than on them: a ``Req`` has about 160 attributes, and reading one of each
    touches memory all over the heap, which made the same sort twice as slow inside a server as on
    small stand-ins (docs/results.md, "hot path"). The tail-safe order rewrites the merge keys of its
    long class, which move with time. Keys are dropped whenever they could change
    (:func:`drop_order_keys`): a new prediction (:func:`set_prediction`), and
    ``Req.reset_for_retract``, through which every request that ran goes back to a waiting queue
    (hook in ``ordering.py``). A request without keys (new, or dropped) gets them when an order first
    reads it.
    """

    def __init__(self, config: SchedulingConfig) -> None:
        super().__init__(config)
        self._table = _KEY_TABLES.setdefault(config, _KeyTable())

    def sorted_by_sjf(self, reqs) -> list:
        table = self._table
        result = self._read(reqs, table.sjf, self._compute_sjf, lambda: sorted(reqs, key=table.sjf.__getitem__))
        self._bound(reqs, table.sjf)
        return result

    def predicted_long(self, reqs) -> list:
        table = self._table
        result = self._read(reqs, table.long, self._compute_tail_safe,
                            lambda: list(compress(reqs, map(table.long.__getitem__, reqs))))
        self._bound(reqs, table.long)
        return result

    def arrivals(self, reqs) -> List[float]:
        # the stamps the cached keys were computed from, kept beside them: reading a Req's own is a cache miss
        table = self._table
        return self._read(reqs, table.arrival, self._compute_tail_safe, lambda: list(map(table.arrival.__getitem__, reqs)))

    def sorted_by_merge_key(self, reqs, long_reqs, long_keys) -> list:
        merge = self._table.merge
        merge.update(zip(long_reqs, long_keys))  # the short class's keys were cached with the rest
        return sorted(reqs, key=merge.__getitem__)

    def _read(self, reqs, keys: dict, compute, read):
        """``read()`` of ``reqs``' keys, after ``compute`` filled in the ``keys`` they lack."""
        if reqs and type(reqs[-1]).__hash__ is None:
            raise TypeError(f"the OUTLETS order keeps keys by request, so a {type(reqs[-1]).__name__} must hash by "
                            "identity, as SGLang's Req does")
        # Requests join at the end of the list (new arrivals, retractions): fill those in first, so
        # that the common round reads once; a request without keys anywhere else makes the read
        # raise, and then every request is checked.
        for req in reversed(reqs):
            if req in keys:
                break
            compute(req)
        try:
            return read()
        except KeyError:
            for req in reqs:
                if req not in keys:
                    compute(req)
            return read()

    def _bound(self, reqs, keys: dict) -> None:
        """Cut the tables back to the waiting list ``reqs`` once ``keys`` holds too many requests that left it."""
        if len(keys) > len(reqs) + KEY_TABLE_SLACK:
            self._table.keep_only(reqs)

    def _compute_sjf(self, req) -> None:
        config = self.config
        # The distribution keys are the core's too, read once per stay like the point key: a waiting
        # request's quantiles change only with a new prediction and its generated tokens only through a
        # retraction, and both drop its keys.
        if config.order_key is OrderKey.POINT:
            key = sjf_sort_key(prediction(req), num_generated(req), stamp_arrival(req), config)
        else:
            prompt_len = request_prompt_len(req) if config.order_key is OrderKey.KV_FOOTPRINT else 0
            key = sjf_sort_key(prediction(req), num_generated(req), stamp_arrival(req), config,
                               predicted_quantiles(req), prompt_len)
        self._table.sjf[req] = key

    def _compute_tail_safe(self, req) -> None:
        config, table = self.config, self._table
        quantiles = None if config.long_class_quantile is None else predicted_quantiles(req)
        table.long[req] = is_predicted_long(prediction(req), num_generated(req), config, quantiles)
        arrival = table.arrival[req] = stamp_arrival(req)
        table.merge[req] = short_merge_key(arrival)  # a long request's is set by each order

