"""Waiting queues of one serving instance: FCFS, shortest predicted remaining first, tail-safe (classes at a fixed
length or from the ranks of recent predictions), or longest predicted first.

Shaped like vLLM v1's ``request_queue.py``: a policy enum, an abstract queue, one small class per
policy and a factory. Requests are any objects with the attributes of :class:`SchedulableRequest`
(the simulator's requests; SGLang ``Req`` objects carry them through the plugin), and optionally
``predicted_output_quantiles`` and a prompt length, which the distribution keys read
(:func:`request_quantiles`, :func:`request_prompt_len`).
"""

from __future__ import annotations

import heapq
import itertools
import operator
from abc import ABC, abstractmethod
from collections import deque
from enum import Enum
from operator import attrgetter
from typing import Deque, Iterator, List, Optional, Protocol, Sequence, Tuple

from specforge_outlets.scheduling.keys import (
    OrderKey,
    SchedulingConfig,
    is_predicted_long,
    longest_first_sort_key,
    sjf_sort_key,
    short_merge_key,
    tail_safe_long_merge_keys,
    tail_safe_sort_key,
)
from specforge_outlets.scheduling.prediction_ranks import RecentPredictions


class QueuePolicy(Enum):
    """Order in which an instance admits its waiting requests."""

    FCFS = "fcfs"
    SJF = "sjf"  # shortest predicted remaining first, linear aging
    TAIL_SAFE = "tail-safe"  # FCFS within predicted-length classes, bounded hold-back of the long class
    TAIL_SAFE_RANKS = "tail-safe-ranks"  # tail-safe, the long class the top share of recent predictions
    LONGEST_FIRST = "longest-predicted-first"  # longest predicted remaining first: offline batches' makespan


class SchedulableRequest(Protocol):
    """What the ordering key reads from a request.

    Optional too: ``predicted_output_quantiles`` (total-length quantiles at the config's
    ``quantile_levels``, or None) and ``prompt_len`` (or SGLang's ``origin_input_ids``).
    """

    arrival_time: float
    predicted_output_len: Optional[float]
    num_generated_tokens: int


def request_quantiles(request: SchedulableRequest) -> Optional[Sequence[float]]:
    """The request's ``predicted_output_quantiles``, None if it has none (or no such attribute)."""
    return getattr(request, "predicted_output_quantiles", None)


def request_prompt_len(request: SchedulableRequest) -> int:
    """Prompt tokens of a request: its ``prompt_len`` (the simulator's), else SGLang's ``origin_input_ids``, else 0."""
    prompt_len = getattr(request, "prompt_len", None)
    if prompt_len is not None:
        return prompt_len
    input_ids = getattr(request, "origin_input_ids", None)
    return 0 if input_ids is None else len(input_ids)


def request_sjf_key(request: SchedulableRequest, config: SchedulingConfig) -> Tuple[float, float]:
    """:func:`sjf_sort_key` of a request, its distribution and prompt read when the config's order key needs them."""
    if config.order_key is OrderKey.POINT:
        return sjf_sort_key(request.predicted_output_len, request.num_generated_tokens, request.arrival_time, config)
    return sjf_sort_key(request.predicted_output_len, request.num_generated_tokens, request.arrival_time, config,
                        request_quantiles(request),
                        request_prompt_len(request) if config.order_key is OrderKey.KV_FOOTPRINT else 0)


def request_longest_first_key(request: SchedulableRequest, config: SchedulingConfig) -> Tuple[float, float]:
    """:func:`longest_first_sort_key` of a request."""
    return longest_first_sort_key(request.predicted_output_len, request.num_generated_tokens, request.arrival_time,
                                  config)


def request_is_long(request: SchedulableRequest, config: SchedulingConfig) -> bool:
    """:func:`is_predicted_long` of a request, by its distribution when the config's long class reads one."""
    if config.long_class_quantile is None:
        return is_predicted_long(request.predicted_output_len, request.num_generated_tokens, config)
    return is_predicted_long(request.predicted_output_len, request.num_generated_tokens, config,
                             request_quantiles(request))


class RequestQueue(ABC):
    """Waiting requests of one instance, in the order the scheduler admits them."""

    @abstractmethod
    def add_request(self, request: SchedulableRequest) -> None:
        """Add a request according to the policy."""

    @abstractmethod
    def pop_request(self, now: float) -> SchedulableRequest:
        """Remove and return the next request to admit at time ``now``."""

    @abstractmethod
    def peek_request(self, now: float) -> SchedulableRequest:
        """Return the next request to admit at time ``now`` without removing it."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of waiting requests."""

    @abstractmethod
    def __iter__(self) -> Iterator[SchedulableRequest]:
        """Iterate in admission order."""

    def __bool__(self) -> bool:
        return len(self) > 0


class FCFSRequestQueue(RequestQueue):
    """First come, first served."""

    def __init__(self) -> None:
        self._requests: Deque[SchedulableRequest] = deque()

    def add_request(self, request: SchedulableRequest) -> None:
        self._requests.append(request)

    def prepend_request(self, request: SchedulableRequest) -> None:
        """Put a request at the front, as vLLM's FCFS queue does with a preempted one."""
        self._requests.appendleft(request)

    def pop_request(self, now: float) -> SchedulableRequest:
        return self._requests.popleft()

    def peek_request(self, now: float) -> SchedulableRequest:
        return self._requests[0]

    def __len__(self) -> int:
        return len(self._requests)

    def __iter__(self) -> Iterator[SchedulableRequest]:
        return iter(self._requests)


class SortKeyRequestQueue(RequestQueue):
    """A heap by a sort key computed once, when a request is added: a waiting request generates no tokens, so its
    key (or, with linear aging, its rank among the others) cannot change while it waits."""

    def __init__(self, config: SchedulingConfig) -> None:
        self._config = config
        self._heap: List[Tuple[Tuple[float, float], int, SchedulableRequest]] = []
        self._counter = itertools.count()  # insertion order breaks exact ties deterministically

    @abstractmethod
    def _key(self, request: SchedulableRequest) -> Tuple[float, float]:
        """Ascending sort key of a request joining the queue."""

    def add_request(self, request: SchedulableRequest) -> None:
        heapq.heappush(self._heap, (self._key(request), next(self._counter), request))

    def pop_request(self, now: float) -> SchedulableRequest:
        return heapq.heappop(self._heap)[2]

    def peek_request(self, now: float) -> SchedulableRequest:
        return self._heap[0][2]

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[SchedulableRequest]:
        return (entry[2] for entry in sorted(self._heap, key=lambda entry: entry[:2]))


class SJFRequestQueue(SortKeyRequestQueue):
    """Shortest aged predicted remaining length first (:func:`sjf_sort_key`); aging is linear in arrival time,
    so the key is the request's for as long as it waits."""

    def _key(self, request: SchedulableRequest) -> Tuple[float, float]:
        return request_sjf_key(request, self._config)


class LongestFirstRequestQueue(SortKeyRequestQueue):
    """Longest predicted remaining length first (:func:`longest_first_sort_key`)."""

    def _key(self, request: SchedulableRequest) -> Tuple[float, float]:
        return request_longest_first_key(request, self._config)


class TailSafeRequestQueue(RequestQueue):
    """Earliest arrival first within a short and a predicted-long class; the long head yields to later short ones briefly.

    The class is fixed when a request is added (a waiting request generates nothing), so the next
    request is one of the two class heads, compared by :func:`tail_safe_sort_key` at the current
    time: the age of the oldest waiting request (the older head) sets the long class's hold-back.
    """

    def __init__(self, config: SchedulingConfig) -> None:
        self._config = config
        self._short: List[Tuple[float, int, SchedulableRequest]] = []  # heaps on arrival time
        self._long: List[Tuple[float, int, SchedulableRequest]] = []
        self._counter = itertools.count()

    def add_request(self, request: SchedulableRequest) -> None:
        long = self._is_long(request)
        heapq.heappush(self._long if long else self._short, (request.arrival_time, next(self._counter), request))

    def _is_long(self, request: SchedulableRequest) -> bool:
        """The class of a request joining the queue (:func:`request_is_long`)."""
        return request_is_long(request, self._config)

    def _next_class(self, now: float) -> List[Tuple[float, int, SchedulableRequest]]:
        if not self._long or not self._short:
            return self._long or self._short
        long_first = _long_head_first(self._long[0][0], self._short[0][0], now, self._config)
        return self._long if long_first else self._short

    def pop_request(self, now: float) -> SchedulableRequest:
        return heapq.heappop(self._next_class(now))[2]

    def peek_request(self, now: float) -> SchedulableRequest:
        return self._next_class(now)[0][2]

    def __len__(self) -> int:
        return len(self._short) + len(self._long)

    def __iter__(self) -> Iterator[SchedulableRequest]:
        """Admission order if everything were admitted now, at the latest arrival (by the classes given on entry)."""
        requests = [entry[2] for entry in sorted(self._short + self._long, key=lambda entry: entry[1])]
        long_requests = [entry[2] for entry in sorted(self._long, key=lambda entry: entry[1])]
        return iter(_tail_safe_order(requests, RequestKeys(self._config), None, long_requests))


class RankTailSafeRequestQueue(TailSafeRequestQueue):
    """Tail-safe with the long class from the ranks of recent predictions (:class:`RecentPredictions`), not a fixed
    length: a request is long when its predicted remaining length is among the top ``long_class_share`` of the last
    ``rank_window`` predictions this queue received, its own included. Its class is fixed when it joins."""

    def __init__(self, config: SchedulingConfig) -> None:
        super().__init__(config)
        self._recent = RecentPredictions(config)

    def _is_long(self, request: SchedulableRequest) -> bool:
        return self._recent.classify(request.predicted_output_len, request.num_generated_tokens, self._config)


def _long_head_first(long_arrival: float, short_arrival: float, now: float, config: SchedulingConfig) -> bool:
    """Whether the predicted-long class head is admitted before the short one at ``now``.

    The age of the older head, the oldest waiting request, sets the long class's hold-back.
    """
    age = now - min(long_arrival, short_arrival)
    return tail_safe_sort_key(True, long_arrival, age, config) < tail_safe_sort_key(False, short_arrival, age, config)


def create_request_queue(policy: QueuePolicy, config: SchedulingConfig) -> RequestQueue:
    """Create the waiting queue for a policy."""
    if policy is QueuePolicy.FCFS:
        return FCFSRequestQueue()
    if policy is QueuePolicy.SJF:
        return SJFRequestQueue(config)
    if policy is QueuePolicy.TAIL_SAFE:
        return TailSafeRequestQueue(config)
    if policy is QueuePolicy.TAIL_SAFE_RANKS:
        return RankTailSafeRequestQueue(config)
    if policy is QueuePolicy.LONGEST_FIRST:
        return LongestFirstRequestQueue(config)
    raise ValueError(f"unknown queue policy: {policy!r}")


class RequestKeys:
    """What an admission order reads from requests: their SJF or longest-first key, tail-safe class and arrival time.

    This provider computes every key from the request's fields at every read. None of them changes
    while a request waits, so a scheduler that re-sorts the same waiting list every round (SGLang)
    gives :func:`admission_order` a provider that caches them on its requests and sorts by the
    cached values at C speed instead (``sglang_patches.predictions.CachedOrderKeys``).
    """

    def __init__(self, config: SchedulingConfig) -> None:
        self.config = config

    def sjf(self, request: SchedulableRequest) -> Tuple[float, float]:
        """:func:`sjf_sort_key` of the request."""
        return request_sjf_key(request, self.config)

    def sorted_by_sjf(self, requests: Sequence[SchedulableRequest]) -> List[SchedulableRequest]:
        """The requests by :meth:`sjf`, ascending; a stable sort, so exact ties stay in list order."""
        return sorted(requests, key=self.sjf)

    def sorted_by_longest_first(self, requests: Sequence[SchedulableRequest]) -> List[SchedulableRequest]:
        """The requests by :func:`longest_first_sort_key`, ascending; a stable sort, so exact ties stay in list order."""
        config = self.config
        return sorted(requests, key=lambda request: request_longest_first_key(request, config))

    def rank_long(self, requests: Sequence[SchedulableRequest]) -> List[SchedulableRequest]:
        """The requests of the ranked long class (:class:`RecentPredictions`), in list order, as a fresh
        :class:`RankTailSafeRequestQueue` classifies them when they are added in list order."""
        recent, config = RecentPredictions(self.config), self.config
        return [request for request in requests
                if recent.classify(request.predicted_output_len, request.num_generated_tokens, config)]

    def predicted_long(self, requests: Sequence[SchedulableRequest]) -> List[SchedulableRequest]:
        """The requests of the tail-safe key's long class (:func:`is_predicted_long`), in list order."""
        config = self.config
        return [request for request in requests if request_is_long(request, config)]

    def arrivals(self, requests: Sequence[SchedulableRequest]) -> List[float]:
        """The requests' arrival times."""
        return list(map(attrgetter("arrival_time"), requests))

    def sorted_by_merge_key(
        self, requests: Sequence[SchedulableRequest], long_requests: Sequence[SchedulableRequest],
        long_keys: Sequence[int],
    ) -> List[SchedulableRequest]:
        """The requests by tail-safe merge key: :func:`short_merge_key`, and these keys for the long ones (all)."""
        by_id = dict(zip(map(id, long_requests), long_keys))

        def merge_key(request: SchedulableRequest) -> int:
            key = by_id.get(id(request))
            return short_merge_key(request.arrival_time) if key is None else key

        return sorted(requests, key=merge_key)


def admission_order(
    requests: Sequence[SchedulableRequest], policy: QueuePolicy, config: SchedulingConfig,
    now: Optional[float] = None, keys: Optional[RequestKeys] = None,
) -> List[SchedulableRequest]:
    """The order in which a ``policy`` queue holding these requests (added in list order) admits them at ``now``.

    For schedulers that keep their waiting requests in a list (SGLang sorts its list every round):
    one sort per round instead of a queue rebuilt and drained, with the same result as the queue
    classes above (tests/test_scheduling.py checks it on random queues, ties included). ``now`` is
    the time of admission, so at or after every arrival (SGLang: its monotonic clock, which stamped
    the arrivals); by default the latest arrival. ``keys`` (built for ``config``) reads the
    requests; by default from their :class:`SchedulableRequest` fields. ``tail-safe-ranks`` classifies
    a request against the predictions of the requests that joined before it: by default those in the
    list (a fresh queue's window); a scheduler that keeps its list across rounds passes ``keys`` that
    keep the window and each request's class from the round it joined (the plugin's ``CachedOrderKeys``).
    """
    keys = RequestKeys(config) if keys is None else keys
    assert keys.config is config, "the key provider must be built for this config"
    if policy is QueuePolicy.FCFS:
        return list(requests)
    if policy is QueuePolicy.SJF:  # a stable sort breaks exact ties by list order, as the heap's counter does
        return keys.sorted_by_sjf(requests)
    if policy is QueuePolicy.TAIL_SAFE:
        return _tail_safe_order(requests, keys, now, keys.predicted_long(requests))
    if policy is QueuePolicy.TAIL_SAFE_RANKS:
        return _tail_safe_order(requests, keys, now, keys.rank_long(requests))
    if policy is QueuePolicy.LONGEST_FIRST:
        return keys.sorted_by_longest_first(requests)
    raise ValueError(f"unknown queue policy: {policy!r}")


def _tail_safe_order(
    requests: Sequence[SchedulableRequest], keys: RequestKeys, now: Optional[float],
    long_requests: List[SchedulableRequest],
) -> List[SchedulableRequest]:
    """The order in which :class:`TailSafeRequestQueue` pops these requests at ``now``, as one sort, given those of
    them in the long class (in list order).

    The short class's merge keys are their arrival times, fixed; only the long class's move with
    time (:func:`tail_safe_long_merge_keys`), so per round Python code runs per long request and the
    rest is one sort of a list that the last round left nearly in order.
    """
    long_keys: List[int] = []
    if long_requests:
        long_requests, long_arrivals = _by_arrival(long_requests, keys)
        if now is None:
            now = max(keys.arrivals(requests))
        long_keys = tail_safe_long_merge_keys(long_arrivals, now, keys.config)
    return keys.sorted_by_merge_key(requests, long_requests, long_keys)


def _by_arrival(
    requests: List[SchedulableRequest], keys: RequestKeys
) -> Tuple[List[SchedulableRequest], List[float]]:
    """The requests in arrival order (a stable sort: equal arrivals in list order) and their arrival times."""
    arrivals = keys.arrivals(requests)
    if all(map(operator.le, arrivals, itertools.islice(arrivals, 1, None))):
        return requests, arrivals
    order = sorted(range(len(requests)), key=arrivals.__getitem__)
    return list(map(requests.__getitem__, order)), list(map(arrivals.__getitem__, order))
