"""Routing a new request to one of several ranks (data-parallel ranks or decode instances).

Shaped like the queue module: a policy enum, an abstract router, one small class per policy and a
factory. The least-predicted-work choice is the pure function :func:`least_predicted_work_rank`
over :class:`RankLoad` values built by :func:`rank_load`; the SGLang plugin builds them from its
load snapshots, the simulator from its instances.

``power-of-two`` is sglang-router's ``power_of_two``, which the external router runs in front of PD
decode instances (docs/serving.md step 7); the plugin serves only least-predicted-work
(``--load-balance-method outlets``), and the simulator runs power-of-two to measure what the router
gives up against it. ``least-requests-then-work`` is SGLang's ``total_requests`` with its ties broken
by the predicted work; the simulator runs it (``benchmarks/routing_rule.py``) as the candidate for
``--load-balance-method outlets``.
"""

from __future__ import annotations

import itertools
import random
from abc import ABC, abstractmethod
from enum import Enum
from typing import Iterable, NamedTuple, Optional, Sequence, Tuple

from specforge_outlets.scheduling.keys import predicted_remaining

# Seconds between sglang-router's polls of every worker's GET /get_load (its LoadMonitor, interval
# --worker-startup-check-interval): 1 s is the least it accepts (its default is 30 s) and what
# docs/serving.md step 7 sets. A router that polls (Router.polls_loads) sees loads this stale.
DEFAULT_LOAD_POLL_INTERVAL_S = 1.0


class RoutingPolicy(Enum):
    """How a new request picks its rank."""

    ROUND_ROBIN = "round-robin"
    LEAST_REQUESTS = "least-requests"
    LEAST_PREDICTED_WORK = "least-predicted-work"
    LEAST_REQUESTS_THEN_WORK = "least-requests-then-work"
    POWER_OF_TWO = "power-of-two"  # sglang-router's power_of_two, simulated (the plugin does not route by it)


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


def least_requests_then_work_rank(loads: Sequence[RankLoad]) -> int:
    """Rank with the fewest requests; ties by least predicted work, then lowest index.

    Where SGLang's ``total_requests`` has one choice this is it: when the running-request slots bind,
    a request's admission waits on the queue ahead of it, so the count, not the predicted work,
    decides its TTFT (the regime map's colocated overload: least predicted work 4.46x total_requests'
    P99 TTFT, this rule 1.01x; ``benchmarks/data/routing-rule``). The predicted work only picks among
    ranks that total_requests cannot tell apart.
    """
    return min(range(len(loads)), key=lambda rank: (loads[rank].num_requests, loads[rank].predicted_work, rank))


class Router(ABC):
    """Chooses the rank that receives a new request."""

    # Whether select() reads predicted_work / num_tokens; routers that do not are spared computing them.
    needs_predicted_work = False
    needs_tokens = False
    # Whether its loads come from a poll every load-poll interval (sglang-router's LoadMonitor) rather
    # than from the ranks at dispatch: the simulator then hands it the last poll's.
    polls_loads = False

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


class LeastRequestsThenWorkRouter(Router):
    """Fewest requests, ties by least predicted work (:func:`least_requests_then_work_rank`)."""

    needs_predicted_work = True

    def select(self, loads: Sequence[RankLoad]) -> int:
        return least_requests_then_work_rank(loads)


class PowerOfTwoRouter(Router):
    """sglang-router 0.3.2's power_of_two: the less loaded of two distinct ranks drawn at random.

    As its ``src/policies/power_of_two.rs``: the first rank uniformly, the second uniformly among the
    others (the first plus 1 + a uniform draw from ``n - 1``, modulo ``n``), and the second only if
    its load is strictly lower, so ties go to the first drawn. The load is the integer ``num_tokens``
    that ``GET /get_load`` reports, which the plugin sets to the rank's predicted remaining output
    tokens rounded (``sglang_patches/load_endpoint.py``): ``predicted_work`` here. The loads are what
    the router's last poll read (``polls_loads``): nothing is added for requests it sent since. The
    draws come from a generator seeded here, so that a simulated run can be repeated.
    """

    needs_predicted_work = True
    polls_loads = True

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def select(self, loads: Sequence[RankLoad]) -> int:
        count = len(loads)
        if count == 1:
            return 0
        first = self._rng.randrange(count)
        second = (first + 1 + self._rng.randrange(count - 1)) % count
        return second if round(loads[second].predicted_work) < round(loads[first].predicted_work) else first


def create_router(policy: RoutingPolicy, seed: int = 0) -> Router:
    """Create the router for a policy (``seed``: power-of-two's random draws)."""
    if policy is RoutingPolicy.ROUND_ROBIN:
        return RoundRobinRouter()
    if policy is RoutingPolicy.LEAST_REQUESTS:
        return LeastRequestsRouter()
    if policy is RoutingPolicy.LEAST_PREDICTED_WORK:
        return LeastPredictedWorkRouter()
    if policy is RoutingPolicy.LEAST_REQUESTS_THEN_WORK:
        return LeastRequestsThenWorkRouter()
    if policy is RoutingPolicy.POWER_OF_TWO:
        return PowerOfTwoRouter(seed)
    raise ValueError(f"unknown routing policy: {policy!r}")
