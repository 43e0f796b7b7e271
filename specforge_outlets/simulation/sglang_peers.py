"""SGLang's own policies, simulated with the same step model as the plugin's so that one run compares them.

A user choosing a policy compares OUTLETS with what SGLang already ships. These are not
the plugin's: ``specforge_outlets.scheduling`` holds the orders and routing the plugin serves;
these reproduce SGLang 0.5.23's sort and dispatch keys.

- ``shortest-prefill-first`` (``SchedulePolicy._sort_by_shortest_prefill``): fewest prompt tokens
  still to prefill first, ties by the time the request entered the queue. The simulator has no
  prefix cache, so that is the prompt plus the tokens a retracted request generated before (its
  recomputation prefills them again).
- ``lof`` (``SchedulePolicy._sort_by_longest_output``): largest ``max_new_tokens`` first, a stable
  sort, so ties keep queue order. The simulated client asks for ``max(max_new_tokens, its output)``
  (the cluster's ``max_new_tokens``, as the KV reservation does): requests within the cap tie and are
  served FCFS; only those that ask for more go first. (``sglang.bench_serving`` sets
  ``max_new_tokens`` to each request's output length, which makes ``lof`` longest-true-output-first.)
- ``hrrn`` (``SchedulePolicy._sort_by_hrrn``): highest response ratio next with token-based aging,
  the largest ``(prefill tokens processed since the request queued) / (its prompt tokens)`` first
  (SGLang's ``_uncached_len``: the prompt, less a cached prefix, which the simulator does not have).
  SGLang counts the tokens its prefill forwards processed; the simulator counts the prefill tokens
  its queue handed out, frozen within a scheduling round (one sort per round, as SGLang). Ties go
  by queue entry (SGLang's go by request id, which is random). More than ``HRRN_FCFS_ABOVE``
  waiting requests make SGLang skip the sort (new requests join the end of the last sorted order);
  the simulator serves FCFS then. SGLang needs the prefix cache on for it (with
  ``--disable-radix-cache`` it runs FCFS).

SGLang's disaggregated decode instances do not sort their waiting queue by these orders, so the
simulator applies them to prefill instances and colocated instances only (decode instances: FCFS).
- ``total-tokens`` (``DPBudget.dispatch`` with ``LoadBalanceMethod.TOTAL_TOKENS``): the rank with the
  fewest tokens (KV in use plus the prompt tokens still to prefill), ties by fewer requests, then
  the lowest rank. SGLang reads the tokens from a snapshot and adds each dispatched prompt until
  the next one; the simulator reads them exact at every dispatch, which favours this peer slightly.
  SGLang's ``total_requests`` is the core's ``least-requests``.

Routing is also named as SGLang's ``--load-balance-method`` and sglang-router's ``--policy`` spell
it (``ROUTING_SPELLINGS``), so that a user's own command line works here too.
"""

from __future__ import annotations

import heapq
import itertools
from enum import Enum
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Type, Union

from specforge_outlets.scheduling import (
    PLUGIN_ROUTING,
    QueuePolicy,
    RankLoad,
    RequestQueue,
    Router,
    RoutingPolicy,
    SchedulingConfig,
    create_request_queue,
    create_router,
)


# SGLang's WAITING_QUEUE_PREFIX_MATCH_MAX: above this many waiting requests, hrrn (a cache-aware
# policy) skips its prefix matching and sort and serves FCFS.
HRRN_FCFS_ABOVE = 128


class PeerQueuePolicy(Enum):
    """Waiting-queue orders SGLang ships, simulated for comparison."""

    SHORTEST_PREFILL_FIRST = "shortest-prefill-first"
    LONGEST_OUTPUT_FIRST = "lof"
    HRRN = "hrrn"


class StaticKeyRequestQueue(RequestQueue):
    """A heap by a key fixed when a request is queued, ties by queue entry, then insertion."""

    def __init__(self) -> None:
        self._heap: List[Tuple[int, float, int, object]] = []
        self._counter = itertools.count()

    def key(self, request) -> int:
        """Smaller first."""
        raise NotImplementedError

    def add_request(self, request) -> None:
        heapq.heappush(self._heap, (self.key(request), request.enqueue_time, next(self._counter), request))

    def pop_request(self, now: float):
        return heapq.heappop(self._heap)[3]

    def peek_request(self, now: float):
        return self._heap[0][3]

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator:
        return (entry[3] for entry in sorted(self._heap, key=lambda entry: entry[:3]))


class ShortestPrefillRequestQueue(StaticKeyRequestQueue):
    """Fewest tokens to prefill first (prompt + tokens to recompute)."""

    def key(self, request) -> int:
        return request.input_len + request.num_generated_tokens


class LongestOutputRequestQueue(StaticKeyRequestQueue):
    """Largest requested max_new_tokens first (a stable sort in SGLang: ties keep queue order)."""

    def __init__(self, max_new_tokens: int) -> None:
        super().__init__()
        self.max_new_tokens = max_new_tokens

    def key(self, request) -> int:
        return -max(self.max_new_tokens, request.output_len)


class HighestResponseRatioRequestQueue(RequestQueue):
    """Largest (prefill tokens processed since queued) / (own prefill tokens) first; FCFS above HRRN_FCFS_ABOVE."""

    def __init__(self) -> None:
        self._waiting: List[Tuple[float, int, int, int, object]] = []  # (enqueue time, order, processed, prompt, request)
        self._counter = itertools.count()
        self._processed = 0  # prefill tokens handed out so far
        self._round: Tuple[float, int] = (float("nan"), 0)  # (now, processed) of the round being admitted

    def add_request(self, request) -> None:
        self._waiting.append((request.enqueue_time, next(self._counter), self._processed, max(1, request.input_len),
                              request))

    def _best(self, now: float) -> int:
        if self._round[0] != now:  # a new round: the counter as its sort sees it
            self._round = (now, self._processed)
        if len(self._waiting) > HRRN_FCFS_ABOVE:
            return min(range(len(self._waiting)), key=lambda i: self._waiting[i][:2])
        processed = self._round[1]
        return min(range(len(self._waiting)), key=lambda i: self._key(self._waiting[i], processed))

    @staticmethod
    def _key(entry, processed: int) -> Tuple[float, float, int]:
        entered, order, at_entry, prompt, _ = entry
        return -max(0, processed - at_entry) / prompt, entered, order

    def pop_request(self, now: float):
        request = self._waiting.pop(self._best(now))[4]
        self._processed += request.input_len + request.num_generated_tokens  # what its prefill processes
        return request

    def peek_request(self, now: float):
        return self._waiting[self._best(now)][4]

    def __len__(self) -> int:
        return len(self._waiting)

    def __iter__(self) -> Iterator:
        processed = self._round[1]
        if len(self._waiting) > HRRN_FCFS_ABOVE:
            return (entry[4] for entry in sorted(self._waiting, key=lambda entry: entry[:2]))
        return (entry[4] for entry in sorted(self._waiting, key=lambda entry: self._key(entry, processed)))


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


# SGLang's --load-balance-method (round_robin, total_requests, total_tokens, outlets: the plugin's, PLUGIN_ROUTING) and
# sglang-router's --policy (power_of_two) names of the simulated routings; least-predicted-work, a rule for studies
# that the plugin no longer serves, has none
ROUTING_SPELLINGS = {
    "round_robin": RoutingPolicy.ROUND_ROBIN,
    "total_requests": RoutingPolicy.LEAST_REQUESTS,
    "total_tokens": PeerRoutingPolicy.TOTAL_TOKENS,
    "outlets": PLUGIN_ROUTING,
    "power_of_two": RoutingPolicy.POWER_OF_TWO,
}


def _routings() -> Dict[str, AnyRoutingPolicy]:
    """Every routing by every name it has: the simulator's, then SGLang's and sglang-router's."""
    return {**{member.value: member for kind in (RoutingPolicy, PeerRoutingPolicy) for member in kind},
            **ROUTING_SPELLINGS}


def routing_names() -> List[str]:
    """Every name :func:`routing_policy` takes."""
    return list(_routings())


def routing_policy(name: str) -> AnyRoutingPolicy:
    """The plugin's routing or SGLang's of that name, in the simulator's spelling or SGLang's and sglang-router's."""
    routings = _routings()
    if name not in routings:
        raise ValueError(f"unknown routing {name!r}; one of {', '.join(routings)}")
    return routings[name]


def routing_spelling(policy: AnyRoutingPolicy) -> Optional[str]:
    """``policy`` as SGLang's --load-balance-method or sglang-router's --policy names it; None where neither serves it."""
    return next((name for name, member in ROUTING_SPELLINGS.items() if member is policy), None)


def create_queue(policy: AnyQueuePolicy, config: SchedulingConfig, max_new_tokens: int) -> RequestQueue:
    """The simulated waiting queue of an instance (``max_new_tokens``: the cluster's, for ``lof``)."""
    if policy is PeerQueuePolicy.SHORTEST_PREFILL_FIRST:
        return ShortestPrefillRequestQueue()
    if policy is PeerQueuePolicy.LONGEST_OUTPUT_FIRST:
        return LongestOutputRequestQueue(max_new_tokens)
    if policy is PeerQueuePolicy.HRRN:
        return HighestResponseRatioRequestQueue()
    return create_request_queue(policy, config)


def create_peer_or_router(policy: AnyRoutingPolicy, seed: int = 0) -> Router:
    """The simulated router of a cluster (``seed``: power-of-two's random draws)."""
    if policy is PeerRoutingPolicy.TOTAL_TOKENS:
        return TotalTokensRouter()
    return create_router(policy, seed)
