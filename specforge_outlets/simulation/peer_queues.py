"""SGLang's own length-aware waiting-queue orders, simulated with the same step model as the plugin's.

A user choosing a policy compares OUTLETS with what SGLang already ships, so those orders run in
the same simulations (issue 13). They are not the plugin's: ``specforge_outlets.scheduling`` holds
the orders the plugin serves; these reproduce SGLang 0.5.23's sort keys.

- ``shortest-prefill-first`` (``SchedulePolicy._sort_by_shortest_prefill``): fewest prompt tokens
  still to prefill first, ties by the time the request entered the queue. The simulator has no
  prefix cache, so that is the prompt plus the tokens a retracted request generated before (its
  recomputation prefills them again).
"""

from __future__ import annotations

import heapq
import itertools
from enum import Enum
from typing import Iterator, List, Tuple, Union

from specforge_outlets.scheduling import QueuePolicy, RequestQueue, SchedulingConfig, create_request_queue


class PeerQueuePolicy(Enum):
    """Waiting-queue orders SGLang ships, simulated for comparison."""

    SHORTEST_PREFILL_FIRST = "shortest-prefill-first"


class ShortestPrefillRequestQueue(RequestQueue):
    """Fewest tokens to prefill first (prompt + tokens to recompute), ties by queue-entry time, then insertion."""

    def __init__(self) -> None:
        self._heap: List[Tuple[int, float, int, object]] = []
        self._counter = itertools.count()

    def add_request(self, request) -> None:
        work = request.input_len + request.num_generated_tokens
        heapq.heappush(self._heap, (work, request.enqueue_time, next(self._counter), request))

    def pop_request(self, now: float):
        return heapq.heappop(self._heap)[3]

    def peek_request(self, now: float):
        return self._heap[0][3]

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator:
        return (entry[3] for entry in sorted(self._heap, key=lambda entry: entry[:3]))


AnyQueuePolicy = Union[QueuePolicy, PeerQueuePolicy]


def queue_policy(name: str) -> AnyQueuePolicy:
    """The plugin's order or SGLang's of that name."""
    for kind in (QueuePolicy, PeerQueuePolicy):
        try:
            return kind(name)
        except ValueError:
            continue
    names = [policy.value for policy in QueuePolicy] + [policy.value for policy in PeerQueuePolicy]
    raise ValueError(f"unknown queue order {name!r}; one of {', '.join(names)}")


def create_queue(policy: AnyQueuePolicy, config: SchedulingConfig) -> RequestQueue:
    """The simulated waiting queue of an instance."""
    if policy is PeerQueuePolicy.SHORTEST_PREFILL_FIRST:
        return ShortestPrefillRequestQueue()
    return create_request_queue(policy, config)
