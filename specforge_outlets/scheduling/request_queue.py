"""Waiting queues of one serving instance: FCFS, or shortest predicted remaining length first.

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
from typing import Deque, Iterator, List, Optional, Protocol, Tuple

from specforge_outlets.scheduling.keys import SchedulingConfig, sjf_sort_key


class QueuePolicy(Enum):
    """Order in which an instance admits its waiting requests."""

    FCFS = "fcfs"
    SJF = "sjf"


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
    def pop_request(self) -> SchedulableRequest:
        """Remove and return the next request to admit."""

    @abstractmethod
    def peek_request(self) -> SchedulableRequest:
        """Return the next request to admit without removing it."""

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

    def pop_request(self) -> SchedulableRequest:
        return self._requests.popleft()

    def peek_request(self) -> SchedulableRequest:
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

    def pop_request(self) -> SchedulableRequest:
        return heapq.heappop(self._heap)[2]

    def peek_request(self) -> SchedulableRequest:
        return self._heap[0][2]

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[SchedulableRequest]:
        return (entry[2] for entry in sorted(self._heap, key=lambda entry: entry[:2]))


def create_request_queue(policy: QueuePolicy, config: SchedulingConfig) -> RequestQueue:
    """Create the waiting queue for a policy."""
    if policy is QueuePolicy.FCFS:
        return FCFSRequestQueue()
    if policy is QueuePolicy.SJF:
        return SJFRequestQueue(config)
    raise ValueError(f"unknown queue policy: {policy!r}")
