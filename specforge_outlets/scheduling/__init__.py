"""Shared scheduling core: the ordering keys (SJF with aging, tail-safe), waiting queues, routing and KV budgets.

Pure Python (no torch, no SGLang) so that the SGLang plugin and the serving simulator use the same
code: what is simulated is what is served.
"""

from specforge_outlets.scheduling.keys import (
    DEFAULT_AGING_TOKENS_PER_S,
    DEFAULT_LONG_HOLDBACK,
    DEFAULT_LONG_OUTPUT_LEN,
    DEFAULT_MAX_RETRACTIONS,
    DEFAULT_PRIOR_OUTPUT_LEN,
    MIN_PREDICTED_REMAINING,
    SchedulingConfig,
    aging_window_s,
    holdback_window_s,
    is_predicted_long,
    predicted_remaining,
    retraction_order_key,
    sjf_sort_key,
    tail_safe_sort_key,
)
from specforge_outlets.scheduling.kv_budget import DEFAULT_KV_MARGIN, predicted_output_budget
from specforge_outlets.scheduling.request_queue import (
    FCFSRequestQueue,
    QueuePolicy,
    RequestKeys,
    RequestQueue,
    SJFRequestQueue,
    TailSafeRequestQueue,
    admission_order,
    create_request_queue,
)
from specforge_outlets.scheduling.routing import (
    LeastPredictedWorkRouter,
    LeastRequestsRouter,
    RankLoad,
    RoundRobinRouter,
    Router,
    RoutingPolicy,
    create_router,
    least_predicted_work_rank,
    least_requests_rank,
    rank_load,
)

__all__ = [
    "DEFAULT_AGING_TOKENS_PER_S",
    "DEFAULT_LONG_HOLDBACK",
    "DEFAULT_LONG_OUTPUT_LEN",
    "DEFAULT_MAX_RETRACTIONS",
    "DEFAULT_PRIOR_OUTPUT_LEN",
    "MIN_PREDICTED_REMAINING",
    "SchedulingConfig",
    "aging_window_s",
    "holdback_window_s",
    "is_predicted_long",
    "predicted_remaining",
    "retraction_order_key",
    "sjf_sort_key",
    "tail_safe_sort_key",
    "DEFAULT_KV_MARGIN",
    "predicted_output_budget",
    "FCFSRequestQueue",
    "QueuePolicy",
    "RequestKeys",
    "RequestQueue",
    "SJFRequestQueue",
    "TailSafeRequestQueue",
    "admission_order",
    "create_request_queue",
    "LeastPredictedWorkRouter",
    "LeastRequestsRouter",
    "RankLoad",
    "RoundRobinRouter",
    "Router",
    "RoutingPolicy",
    "create_router",
    "least_predicted_work_rank",
    "least_requests_rank",
    "rank_load",
]
