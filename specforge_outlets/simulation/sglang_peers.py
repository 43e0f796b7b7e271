"""SGLang's own policies, simulated with the same step model as the plugin's so that one run compares them.

A user choosing a policy compares OUTLETS with what SGLang already ships (issue 13). These are not
the plugin's: ``specforge_outlets.scheduling`` holds the orders and routing the plugin serves;
these reproduce SGLang 0.5.23's sort and dispatch keys.

- ``shortest-prefill-first`` (``SchedulePolicy._sort_by_shortest_prefill``): fewest prompt tokens
  still to prefill first, ties by the time the request entered the queue. The simulator has no
  prefix cache, so that is the prompt plus the tokens a retracted request generated before (its
  recomputation prefills them again).
- ``total-tokens`` (``DPBudget.dispatch`` with ``LoadBalanceMethod.TOTAL_TOKENS``): the rank with the
  fewest tokens (KV in use plus the prompt tokens still to prefill), ties by fewer requests, then
  the lowest rank. SGLang reads the tokens from a snapshot and adds each dispatched prompt until
  the next one; the simulator reads them exact at every dispatch, which favours this peer slightly.
  SGLang's ``total_requests`` is the core's ``least-requests``.
"""

from __future__ import annotations

import heapq
import itertools
from enum import Enum
from typing import Iterator, List, Sequence, Tuple, Type, Union

from specforge_outlets.scheduling import (
    QueuePolicy,
    RankLoad,
    RequestQueue,
    Router,
    RoutingPolicy,
    SchedulingConfig,
    create_request_queue,
    create_router,
)


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


class PeerRoutingPolicy(Enum):
    """Data-parallel balancing SGLang ships, simulated for comparison."""

    TOTAL_TOKENS = "total-tokens"


class TotalTokensRouter(Router):
    """Fewest tokens held or queued; ties by fewer requests, then the lowest rank."""

    needs_tokens = True

    def select(self, loads: Sequence[RankLoad]) -> int:
        return min(range(len(loads)), key=lambda rank: (loads[rank].num_tokens, loads[rank].num_requests, rank))


AnyQueuePolicy = Union[QueuePolicy, PeerQueuePolicy]
AnyRoutingPolicy = Union[RoutingPolicy, PeerRoutingPolicy]


def _by_name(name: str, kinds: Sequence[Type[Enum]], what: str):
    """The member named ``name`` of the plugin's enum or SGLang's peer enum."""
    for kind in kinds:
        try:
            return kind(name)
        except ValueError:
            continue
    names = [member.value for kind in kinds for member in kind]
    raise ValueError(f"unknown {what} {name!r}; one of {', '.join(names)}")


def queue_policy(name: str) -> AnyQueuePolicy:
    """The plugin's order or SGLang's of that name."""
    return _by_name(name, (QueuePolicy, PeerQueuePolicy), "queue order")


def routing_policy(name: str) -> AnyRoutingPolicy:
    """The plugin's routing or SGLang's of that name."""
    return _by_name(name, (RoutingPolicy, PeerRoutingPolicy), "routing")


def create_queue(policy: AnyQueuePolicy, config: SchedulingConfig) -> RequestQueue:
    """The simulated waiting queue of an instance."""
    if policy is PeerQueuePolicy.SHORTEST_PREFILL_FIRST:
        return ShortestPrefillRequestQueue()
    return create_request_queue(policy, config)


def create_peer_or_router(policy: AnyRoutingPolicy) -> Router:
    """The simulated router of a cluster."""
    if policy is PeerRoutingPolicy.TOTAL_TOKENS:
        return TotalTokensRouter()
    return create_router(policy)
