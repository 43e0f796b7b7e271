"""The waiting-queue order's keys of SGLang requests, computed once per stay in the queue and sorted by at C speed."""

from __future__ import annotations

from itertools import compress
from typing import List

from sglang_patches import key_tables
from sglang_patches.predictions import num_generated, predicted_output_len, predicted_output_quantiles, stamp_arrival
from specforge_outlets.scheduling import (
    OrderKey,
    RequestKeys,
    SchedulingConfig,
    is_predicted_long,
    longest_first_sort_key,
    request_prompt_len,
    short_merge_key,
    sjf_sort_key,
)


class CachedOrderKeys(RequestKeys):
    """Order keys of SGLang requests, computed once per stay in the waiting list and sorted by at C speed.

    SGLang re-sorts its waiting list every scheduling round, and a waiting request's keys cannot
    change: it generates nothing, and aging is linear in arrival time. So they are computed once
    and kept in dicts keyed by the request (SGLang's ``Req`` hashes by identity), and a round sorts
    with ``dict.__getitem__`` as the key, with no Python call per request. The keys are kept beside
    the requests rather than on them: a ``Req`` has about 160 attributes, and reading one of each
    touches memory all over the heap, which made the same sort twice as slow inside a server as on
    small stand-ins (benchmarks/data/scheduler-overhead/server_check_sort_timing.json). The
    tail-safe order rewrites the merge keys of its long class, which move with time. Each order
    computes only the keys it reads (``key_tables.KeyTable``). Keys are dropped whenever they could change
    (``key_tables.drop_order_keys``): a new prediction (``predictions.set_predicted_output_len``), and
    ``Req.reset_for_retract``, through which every request that ran goes back to a waiting queue
    (hook in ``ordering.py``). A request without keys (new, or dropped) gets them when an order first
    reads it.
    """

    def __init__(self, config: SchedulingConfig) -> None:
        super().__init__(config)
        self._table = key_tables.key_table(config)

    def sorted_by_sjf(self, reqs) -> list:
        return self._sorted(reqs, self._table.sjf, self._compute_sjf)

    def sorted_by_longest_first(self, reqs) -> list:
        return self._sorted(reqs, self._table.longest, self._compute_longest)

    def _sorted(self, reqs, keys: dict, compute) -> list:
        """``reqs`` sorted by their cached ``keys`` (``compute`` fills in those they lack)."""
        result = self._read(reqs, keys, compute, lambda: sorted(reqs, key=keys.__getitem__))
        self._bound(reqs, keys)
        return result

    def rank_long(self, reqs) -> list:
        # a request is classified once, when an order first reads it, against the window of the requests
        # classified before it (in list order within a round), as the core's queue classifies on entry
        table = self._table
        result = self._read(reqs, table.rank_long, self._compute_rank_tail_safe,
                            lambda: list(compress(reqs, map(table.rank_long.__getitem__, reqs))))
        self._bound(reqs, table.rank_long)
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
        return self._read(reqs, table.arrival, self._compute_tail_safe,
                          lambda: list(map(table.arrival.__getitem__, reqs)))

    def sorted_by_merge_key(self, reqs, long_reqs, long_keys) -> list:
        merge = self._table.merge
        merge.update(zip(long_reqs, long_keys))  # the short class's keys were cached with the rest
        return sorted(reqs, key=merge.__getitem__)

    def _read(self, reqs, keys: dict, compute, read):
        """``read()`` of ``reqs``' keys, after ``compute`` filled in the ``keys`` they lack."""
        if reqs and type(reqs[-1]).__hash__ is None:
            raise TypeError(f"the OUTLETS order keeps keys by request, so a {type(reqs[-1]).__name__} must hash by "
                            "identity, as SGLang's Req does")
        # Requests join at the end of the list (new arrivals, retractions): fill those in first, in list
        # order (the ranked classes depend on it), so that the common round reads once; a request
        # without keys anywhere else makes the read raise, and then every request is checked.
        first_new = len(reqs)
        while first_new and reqs[first_new - 1] not in keys:
            first_new -= 1
        for req in reqs[first_new:]:
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
        if len(keys) > len(reqs) + key_tables.KEY_TABLE_SLACK:
            self._table.keep_only(reqs)

    def _compute_sjf(self, req) -> None:
        config = self.config
        # The distribution keys are the core's too, read once per stay like the point key: a waiting
        # request's quantiles change only with a new prediction and its generated tokens only through a
        # retraction, and both drop its keys.
        if config.order_key is OrderKey.POINT:
            key = sjf_sort_key(predicted_output_len(req), num_generated(req), stamp_arrival(req), config)
        else:
            prompt_len = request_prompt_len(req) if config.order_key is OrderKey.KV_FOOTPRINT else 0
            key = sjf_sort_key(predicted_output_len(req), num_generated(req), stamp_arrival(req), config,
                               predicted_output_quantiles(req), prompt_len)
        self._table.sjf[req] = key

    def _compute_longest(self, req) -> None:
        self._table.longest[req] = longest_first_sort_key(predicted_output_len(req), num_generated(req),
                                                          stamp_arrival(req), self.config)

    def _compute_tail_safe(self, req) -> None:
        config, table = self.config, self._table
        quantiles = None if config.long_class_quantile is None else predicted_output_quantiles(req)
        table.long[req] = is_predicted_long(predicted_output_len(req), num_generated(req), config, quantiles)
        self._compute_merge(req)

    def _compute_rank_tail_safe(self, req) -> None:
        table = self._table
        table.rank_long[req] = table.recent.classify(predicted_output_len(req), num_generated(req), self.config)
        self._compute_merge(req)

    def _compute_merge(self, req) -> None:
        table = self._table
        arrival = table.arrival[req] = stamp_arrival(req)
        table.merge[req] = short_merge_key(arrival)  # a long request's is set by each order
