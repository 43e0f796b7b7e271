"""Waiting queues of one serving instance: FCFS, shortest predicted remaining first, or tail-safe.

Shaped like vLLM v1's ``request_queue.py``: a policy enum, an abstract queue, one small class per
policy and a factory. Requests are any objects with the attributes of :class:`SchedulableRequest`
(the simulator's requests; SGLang ``Req`` objects carry them through the plugin).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import operator
from abc import ABC, abstractmethod
from collections import deque
from enum import Enum
from operator import attrgetter
from typing import Deque, Iterator, List, Optional, Protocol, Sequence, Tuple

from specforge_outlets.scheduling.keys import SchedulingConfig, is_predicted_long, sjf_sort_key, tail_safe_sort_key


class QueuePolicy(Enum):
    """Order in which an instance admits its waiting requests."""

    FCFS = "fcfs"
    SJF = "sjf"  # shortest predicted remaining first, linear aging
    TAIL_SAFE = "tail-safe"  # FCFS within predicted-length classes, bounded hold-back of the long class


class SchedulableRequest(Protocol):
    """What the ordering key reads from a request."""

    arrival_time: float
    predicted_output_len: Optional[float]
    num_generated_tokens: int


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

    def pop_request(self, now: float) -> SchedulableRequest:
        return self._requests.popleft()

    def peek_request(self, now: float) -> SchedulableRequest:
        return self._requests[0]

    def __len__(self) -> int:
        return len(self._requests)

    def __iter__(self) -> Iterator[SchedulableRequest]:
        return iter(self._requests)


class SJFRequestQueue(RequestQueue):
    """Shortest aged predicted remaining length first (:func:`sjf_sort_key`), on a heap.

    The key is computed once when the request is added: a waiting request generates no tokens
    and the aging term is linear in arrival time, so its rank among the others cannot change.
    """

    def __init__(self, config: SchedulingConfig) -> None:
        self._config = config
        self._heap: List[Tuple[Tuple[float, float], int, SchedulableRequest]] = []
        self._counter = itertools.count()  # insertion order breaks exact ties deterministically

    def add_request(self, request: SchedulableRequest) -> None:
        key = sjf_sort_key(
            request.predicted_output_len, request.num_generated_tokens, request.arrival_time, self._config
        )
        heapq.heappush(self._heap, (key, next(self._counter), request))

    def pop_request(self, now: float) -> SchedulableRequest:
        return heapq.heappop(self._heap)[2]

    def peek_request(self, now: float) -> SchedulableRequest:
        return self._heap[0][2]

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[SchedulableRequest]:
        return (entry[2] for entry in sorted(self._heap, key=lambda entry: entry[:2]))


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
        long = is_predicted_long(request.predicted_output_len, request.num_generated_tokens, self._config)
        heapq.heappush(self._long if long else self._short, (request.arrival_time, next(self._counter), request))

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
        """Admission order if everything were admitted now, at the latest arrival."""
        requests = [entry[2] for entry in sorted(self._short + self._long, key=lambda entry: entry[1])]
        return iter(admission_order(requests, QueuePolicy.TAIL_SAFE, self._config))


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
    raise ValueError(f"unknown queue policy: {policy!r}")


class RequestKeys:
    """What an admission order reads from a request: its SJF key and its tail-safe class key.

    This provider computes both from the request's fields at every call. Neither changes while a
    request waits, so a scheduler that re-sorts the same waiting list every round (SGLang) gives
    :func:`admission_order` a provider that caches them on its requests instead.
    """

    def __init__(self, config: SchedulingConfig) -> None:
        self.config = config

    def sjf(self, request: SchedulableRequest) -> Tuple[float, float]:
        """:func:`sjf_sort_key` of the request."""
        return sjf_sort_key(
            request.predicted_output_len, request.num_generated_tokens, request.arrival_time, self.config)

    def tail_safe_class(self, request: SchedulableRequest) -> Tuple[bool, float]:
        """(predicted long, arrival time): ascending puts the short class first, each class in arrival order."""
        long = is_predicted_long(request.predicted_output_len, request.num_generated_tokens, self.config)
        return long, request.arrival_time

    def arrivals(self, requests: Sequence[SchedulableRequest]) -> List[float]:
        """The arrival times of requests whose :meth:`tail_safe_class` was just read, as that read them."""
        return list(map(attrgetter("arrival_time"), requests))


def admission_order(
    requests: Sequence[SchedulableRequest], policy: QueuePolicy, config: SchedulingConfig,
    now: Optional[float] = None, keys: Optional[RequestKeys] = None,
) -> List[SchedulableRequest]:
    """The order in which a ``policy`` queue holding these requests (added in list order) admits them at ``now``.

    For schedulers that keep their waiting requests in a list (SGLang sorts its list every round):
    one sort per round instead of a queue rebuilt and drained, with the same result as the queue
    classes above (tests/test_scheduling.py checks it on random queues, ties included). ``now``
    defaults to, and is at least, the latest arrival. ``keys`` (built for ``config``) reads the
    requests; by default from their :class:`SchedulableRequest` fields.
    """
    keys = RequestKeys(config) if keys is None else keys
    assert keys.config is config, "the key provider must be built for this config"
    if policy is QueuePolicy.FCFS:
        return list(requests)
    if policy is QueuePolicy.SJF:  # a stable sort breaks exact ties by list order, as the heap's counter does
        return sorted(requests, key=keys.sjf)
    if policy is QueuePolicy.TAIL_SAFE:
        return _merge_tail_safe_classes(sorted(requests, key=keys.tail_safe_class), keys, now)
    raise ValueError(f"unknown queue policy: {policy!r}")


def _merge_tail_safe_classes(
    by_class: List[SchedulableRequest], keys: RequestKeys, now: Optional[float]
) -> List[SchedulableRequest]:
    """The two classes merged head against head, as :class:`TailSafeRequestQueue` pops them.

    ``by_class`` is the short class then the long class, each in arrival order (equal arrivals in
    list order, as the heaps' counter). Whether the long head goes before a short head is monotone
    in the short head's arrival (never while the short one is older; from a threshold on when it is
    younger), so each predicted-long request's place among the short ones is a binary search over
    the short class's arrival times, read in one pass by ``keys.arrivals``. This runs every round:
    past the sort, the per-request work is list built-ins, and Python code runs per long request.
    """
    def is_long(request: SchedulableRequest) -> bool:
        return keys.tail_safe_class(request)[0]

    config = keys.config
    num_short = bisect.bisect_left(by_class, True, key=is_long)
    if num_short in (0, len(by_class)):
        return by_class
    short_arrivals = keys.arrivals(by_class[:num_short])
    long_requests = by_class[num_short:]
    long_arrivals = keys.arrivals(long_requests)
    # No request can arrive after the time it is admitted at: now is at least the latest arrival.
    latest = max(short_arrivals[-1], long_arrivals[-1])
    now = latest if now is None else max(now, latest)
    # The long head goes first iff (T, a_long) < (a_short, a_short): a_short > T, or a_short == T > a_long;
    # so the short requests ahead of it are those arrived before T (at T too, when T == a_long: no hold-back).
    thresholds = [tail_safe_sort_key(True, arrival, now - arrival, config)[0] for arrival in long_arrivals]
    ahead = list(map(bisect.bisect_left, itertools.repeat(short_arrivals), thresholds))
    for j in itertools.compress(range(len(ahead)), map(operator.eq, thresholds, long_arrivals)):
        ahead[j] = bisect.bisect_right(short_arrivals, thresholds[j])
    order: List[SchedulableRequest] = []
    placed = 0  # short requests already in the order; a merge never moves back (hence the running maximum)
    for request, place in zip(long_requests, itertools.accumulate(ahead, max)):
        order += by_class[placed:place]
        order.append(request)
        placed = place
    return order + by_class[placed:num_short]
