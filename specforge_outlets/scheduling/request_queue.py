"""Waiting queues of one serving instance: FCFS, shortest predicted remaining first, or tail-safe.

Shaped like vLLM v1's ``request_queue.py``: a policy enum, an abstract queue, one small class per
policy and a factory. Requests are any objects with the attributes of :class:`SchedulableRequest`
(the simulator's requests; SGLang ``Req`` objects carry them through the plugin).
"""

from __future__ import annotations

import heapq
import itertools
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


def admission_order(
    requests: Sequence[SchedulableRequest], policy: QueuePolicy, config: SchedulingConfig, now: Optional[float] = None
) -> List[SchedulableRequest]:
    """The order in which a ``policy`` queue holding these requests (added in list order) admits them at ``now``.

    For schedulers that keep their waiting requests in a list (SGLang sorts its list every round):
    one sort per round instead of a queue rebuilt and drained, with the same result as the queue
    classes above (tests/test_scheduling.py checks it on random queues, ties included). ``now``
    defaults to the latest arrival.
    """
    if policy is QueuePolicy.FCFS:
        return list(requests)
    if policy is QueuePolicy.SJF:  # a stable sort breaks exact ties by list order, as the heap's counter does
        return sorted(requests, key=lambda r: sjf_sort_key(
            r.predicted_output_len, r.num_generated_tokens, r.arrival_time, config))
    if policy is QueuePolicy.TAIL_SAFE:
        if now is None:
            now = max((request.arrival_time for request in requests), default=0.0)
        return _merge_tail_safe_classes(requests, config, now)
    raise ValueError(f"unknown queue policy: {policy!r}")


def _merge_tail_safe_classes(
    requests: Sequence[SchedulableRequest], config: SchedulingConfig, now: float
) -> List[SchedulableRequest]:
    """Each class in arrival order, merged head against head as :class:`TailSafeRequestQueue` pops them."""
    short: List[SchedulableRequest] = []
    long: List[SchedulableRequest] = []
    for request in requests:
        is_long = is_predicted_long(request.predicted_output_len, request.num_generated_tokens, config)
        (long if is_long else short).append(request)
    short.sort(key=attrgetter("arrival_time"))  # stable: equal arrivals keep list order, as the heaps' counter
    long.sort(key=attrgetter("arrival_time"))
    order: List[SchedulableRequest] = []
    i = j = 0
    while i < len(short) and j < len(long):
        if _long_head_first(long[j].arrival_time, short[i].arrival_time, now, config):
            order.append(long[j])
            j += 1
        else:
            order.append(short[i])
            i += 1
    return order + short[i:] + long[j:]
