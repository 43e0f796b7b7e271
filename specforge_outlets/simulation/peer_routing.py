"""SGLang's own data-parallel balancing, simulated with the same step model as least-predicted-work routing.

Like ``peer_queues.py``, this reproduces what SGLang 0.5.23 ships so that one run compares it with
the plugin; the plugin's routing rules are ``specforge_outlets.scheduling.routing``.

- ``total-tokens`` (``DPBudget.dispatch`` with ``LoadBalanceMethod.TOTAL_TOKENS``): the rank with the
  fewest tokens (KV in use plus the prompt tokens still to prefill), ties by fewer requests, then
  the lowest rank. SGLang reads the tokens from a snapshot and adds each dispatched prompt until
  the next one; the simulator reads them exact at every dispatch, which favours this peer slightly.
- ``total_requests`` is the core's ``least-requests``.
"""

from __future__ import annotations

from enum import Enum
from typing import Sequence, Union

from specforge_outlets.scheduling import RankLoad, Router, RoutingPolicy, create_router


class PeerRoutingPolicy(Enum):
    """Data-parallel balancing SGLang ships, simulated for comparison."""

    TOTAL_TOKENS = "total-tokens"


class TotalTokensRouter(Router):
    """Fewest tokens held or queued; ties by fewer requests, then the lowest rank."""

    needs_tokens = True

    def select(self, loads: Sequence[RankLoad]) -> int:
        return min(range(len(loads)), key=lambda rank: (loads[rank].num_tokens, loads[rank].num_requests, rank))


AnyRoutingPolicy = Union[RoutingPolicy, PeerRoutingPolicy]


def routing_policy(name: str) -> AnyRoutingPolicy:
    """The plugin's routing or SGLang's of that name."""
    for kind in (RoutingPolicy, PeerRoutingPolicy):
        try:
            return kind(name)
        except ValueError:
            continue
    names = [policy.value for policy in RoutingPolicy] + [policy.value for policy in PeerRoutingPolicy]
    raise ValueError(f"unknown routing {name!r}; one of {', '.join(names)}")


def create_peer_or_router(policy: AnyRoutingPolicy) -> Router:
    """The simulated router of a cluster."""
    if policy is PeerRoutingPolicy.TOTAL_TOKENS:
        return TotalTokensRouter()
    return create_router(policy)
