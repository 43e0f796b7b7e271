"""Routing a new request to one of several ranks (data-parallel ranks or decode instances).

Shaped like the queue module: a policy enum, an abstract router, one small class per policy and a
factory. The least-predicted-work choice is the pure function :func:`least_predicted_work_rank`
over :class:`RankLoad` values built by :func:`rank_load`; the SGLang plugin builds them from its
load snapshots, the simulator from its instances.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from enum import Enum
from typing import Iterable, NamedTuple, Optional, Sequence, Tuple

from specforge_outlets.scheduling.keys import predicted_remaining


class RoutingPolicy(Enum):
    """How a new request picks its rank."""

    ROUND_ROBIN = "round-robin"
    LEAST_REQUESTS = "least-requests"
    LEAST_PREDICTED_WORK = "least-predicted-work"


class RankLoad(NamedTuple):
    """What a router knows about one rank when it dispatches a request (a tuple: made at every dispatch)."""

    num_requests: int  # running + waiting
    predicted_work: float  # predicted remaining output tokens of running + waiting requests
    num_tokens: int = 0  # KV tokens held plus prompt tokens queued (what SGLang's total_tokens balances)


def rank_load(
    requests: Iterable[Tuple[Optional[float], int]], prior_output_len: float, base: RankLoad = RankLoad(0, 0.0)
) -> RankLoad:
    """Load of a rank from ``(predicted_output_len, num_generated_tokens)`` of its requests.

    A request without a prediction (a new one, routed before its prefill has predicted it) is
    counted with the prior. ``base`` carries requests whose contribution is already summed.
    """
    count, work = base.num_requests, base.predicted_work
    for predicted_output_len, num_generated_tokens in requests:
        count += 1
        work += predicted_remaining(predicted_output_len, num_generated_tokens, prior_output_len)
    return RankLoad(count, work)


def least_requests_rank(loads: Sequence[RankLoad]) -> int:
    """Rank with the fewest requests; ties to the lowest index."""
    return min(range(len(loads)), key=lambda rank: (loads[rank].num_requests, rank))


def least_predicted_work_rank(loads: Sequence[RankLoad]) -> int:
    """Rank with the least predicted outstanding work; ties by fewer requests, then lowest index."""
    return min(range(len(loads)), key=lambda rank: (loads[rank].predicted_work, loads[rank].num_requests, rank))


class Router(ABC):
    """Chooses the rank that receives a new request."""

    # Whether select() reads predicted_work / num_tokens; routers that do not are spared computing them.
    needs_predicted_work = False
    needs_tokens = False

    @abstractmethod
    def select(self, loads: Sequence[RankLoad]) -> int:
        """Index of the rank that receives the next request."""


class RoundRobinRouter(Router):
    """Ranks in turn, regardless of load."""

    def __init__(self) -> None:
        self._turn = itertools.count()

    def select(self, loads: Sequence[RankLoad]) -> int:
        return next(self._turn) % len(loads)


class LeastRequestsRouter(Router):
    """Fewest running + waiting requests."""

    def select(self, loads: Sequence[RankLoad]) -> int:
        return least_requests_rank(loads)


class LeastPredictedWorkRouter(Router):
    """Least predicted outstanding work (sum of predicted remaining tokens)."""

    needs_predicted_work = True

    def select(self, loads: Sequence[RankLoad]) -> int:
        return least_predicted_work_rank(loads)


def create_router(policy: RoutingPolicy) -> Router:
    """Create the router for a policy."""
    if policy is RoutingPolicy.ROUND_ROBIN:
        return RoundRobinRouter()
    if policy is RoutingPolicy.LEAST_REQUESTS:
        return LeastRequestsRouter()
    if policy is RoutingPolicy.LEAST_PREDICTED_WORK:
        return LeastPredictedWorkRouter()
    raise ValueError(f"unknown routing policy: {policy!r}")
