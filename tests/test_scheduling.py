"""The shared scheduling core: ordering key, aging bound, queues and routers."""

import math
import random
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional

import pytest

from specforge_outlets.scheduling import (
    MIN_PREDICTED_REMAINING,
    FCFSRequestQueue,
    KVRequest,
    LongestFirstRequestQueue,
    LeastPredictedWorkRouter,
    LengthPrediction,
    PredictionSource,
    LeastRequestsRouter,
    PowerOfTwoRouter,
    QueuePolicy,
    RankLoad,
    RankTailSafeRequestQueue,
    RecentPredictions,
    RoundRobinRouter,
    RoutingPolicy,
    SchedulingConfig,
    SJFRequestQueue,
    TailSafeRequestQueue,
    admission_order,
    aging_window_s,
    create_request_queue,
    holdback_window_s,
    is_predicted_long,
    create_router,
    least_predicted_work_rank,
    least_requests_rank,
    least_requests_then_work_rank,
    predicted_output_budget,
    predicted_remaining,
    rank_load,
    remaining_or_prior,
    retraction_order_key,
    short_merge_key,
    sjf_sort_key,
    tail_safe_long_merge_keys,
    tail_safe_sort_key,
)


@dataclass
class Req:
    name: str
    arrival_time: float
    predicted_output_len: Optional[float]
    num_generated_tokens: int = 0


def drain(queue, now=0.0):
    return [queue.pop_request(now).name for _ in range(len(queue))]


# --- key ------------------------------------------------------------------------------------------
def test_predicted_remaining_subtracts_generated_tokens_and_uses_prior_when_unknown():
    assert predicted_remaining(100.0, 30, prior_output_len=256) == 70.0
    assert predicted_remaining(None, 6, prior_output_len=256) == 250.0
    # A request that ran past its prediction is about to finish, not negative work.
    assert predicted_remaining(10.0, 50, prior_output_len=256) == MIN_PREDICTED_REMAINING



def test_a_prediction_from_the_head_keeps_the_total_and_reads_the_remaining_at_any_age():
    """The head's r̂ₜ at the t-th output token counts that token: the request ends after t - 1 + r̂ₜ tokens."""
    prediction = LengthPrediction.from_remaining(120.0, 3, remaining_quantiles=[0.0, 50.0, 40.0])
    assert (prediction.predicted_output_len, prediction.source, prediction.at_generated) == (122.0, "draft", 3)
    assert prediction.predicted_output_quantiles == (2.0, 52.0, 52.0)  # totals, non-decreasing
    assert prediction.remaining(3) == 119.0 and prediction.remaining(500) == MIN_PREDICTED_REMAINING
    assert prediction.remaining_quantiles(3) == (0.0, 49.0, 49.0)
    config = SchedulingConfig(prior_output_len=256)
    assert remaining_or_prior(prediction, 22, config) == 100.0 and remaining_or_prior(None, 6, config) == 250.0
    external = LengthPrediction.of_total(40, "external")
    assert external.is_external and external.source is PredictionSource.EXTERNAL
    assert external.predicted_output_quantiles is None and not prediction.is_external


def test_kv_admission_reads_a_prediction_as_its_total_and_quantiles():
    prediction = LengthPrediction.of_total(90.0, PredictionSource.PREFILL, [10.0, 90.0, 200.0])
    assert KVRequest.from_prediction(prediction, 4, 2, 500, held=9) == KVRequest(
        4, 2, 500, 90.0, (10.0, 90.0, 200.0), False, 9)
    assert KVRequest.from_prediction(None, 4, 2, 500, ignore_eos=True) == KVRequest(4, 2, 500, ignore_eos=True)


def test_sjf_key_orders_shortest_remaining_first_and_ties_by_arrival():
    config = SchedulingConfig(prior_output_len=256, aging_tokens_per_s=0.0)
    assert sjf_sort_key(50, 0, 5.0, config) < sjf_sort_key(60, 0, 1.0, config)
    assert sjf_sort_key(90, 40, 5.0, config) < sjf_sort_key(60, 0, 1.0, config)  # 50 left < 60 left
    assert sjf_sort_key(60, 0, 1.0, config) < sjf_sort_key(60, 0, 2.0, config)  # tie -> earlier arrival


def test_is_predicted_long_reads_the_remaining_length_against_the_threshold():
    config = SchedulingConfig(prior_output_len=256, long_output_len=800)
    assert is_predicted_long(800.0, 0, config) and not is_predicted_long(799.0, 0, config)  # the threshold is long
    assert not is_predicted_long(1000.0, 201, config)  # 799 left: it has become short
    assert not is_predicted_long(None, 0, config)  # the prior (256) is short
    assert is_predicted_long(None, 0, SchedulingConfig(prior_output_len=900, long_output_len=800))


def test_retraction_order_keeps_the_shortest_remaining_and_requests_at_their_retraction_limit():
    config = SchedulingConfig(prior_output_len=256, max_retractions=2)
    keys = {
        "short": retraction_order_key(100.0, 0, 1.0, 0, config),  # 100 left
        "long": retraction_order_key(3000.0, 0, 1.0, 0, config),  # 3000 left
        "long-later": retraction_order_key(3000.0, 0, 2.0, 0, config),  # same work, arrived later
        "long-run": retraction_order_key(3000.0, 2900, 0.5, 0, config),  # 100 left after 2900 tokens
        "at-limit": retraction_order_key(5000.0, 0, 0.0, 2, config),  # retracted twice already
    }
    kept_first = sorted(keys, key=keys.__getitem__)  # SGLang retracts from the end
    assert kept_first == ["at-limit", "long-run", "short", "long", "long-later"]


def test_sjf_key_ages_linearly_with_waiting_time():
    config = SchedulingConfig(prior_output_len=256, aging_tokens_per_s=10.0)
    # 100 tokens at t=0 vs 60 tokens at t=5: 100 + 0 > 60 + 50 is false -> the old long one goes first.
    assert sjf_sort_key(100, 0, 0.0, config) < sjf_sort_key(60, 0, 5.0, config)
    assert sjf_sort_key(100, 0, 0.0, config) > sjf_sort_key(60, 0, 3.0, config)


@pytest.mark.parametrize("kwargs", [{"long_output_len": 0}, {"long_holdback": -0.1}, {"long_holdback": float("inf")},
                                    {"max_retractions": 0}, {"max_retractions": 1.5},
                                    {"prior_output_len": 0}, {"aging_tokens_per_s": -1.0},
                                    {"prior_output_len": float("nan")}, {"long_class_share": 0.0},
                                    {"long_class_share": 1.0}, {"long_class_share": float("nan")},
                                    {"rank_window": 0}, {"rank_window": 2.5}, {"rank_window": True}])
def test_scheduling_config_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError):
        SchedulingConfig(**kwargs)


def test_aging_window_is_the_stated_bound_at_its_edges():
    config = SchedulingConfig(aging_tokens_per_s=10.0)
    window = aging_window_s(100.0, config)
    assert window == pytest.approx((100.0 - MIN_PREDICTED_REMAINING) / 10.0)
    assert aging_window_s(100.0, SchedulingConfig(aging_tokens_per_s=0.0)) == float("inf")
    queue = SJFRequestQueue(config)
    queue.add_request(Req("long", 0.0, 100.0))
    queue.add_request(Req("shortest-inside", window - 0.01, MIN_PREDICTED_REMAINING))
    queue.add_request(Req("shortest-after", window + 0.01, MIN_PREDICTED_REMAINING))
    assert drain(queue) == ["shortest-inside", "long", "shortest-after"]


def test_aging_bound_holds_for_random_requests():
    """No request is popped before an earlier one whose window it arrived after."""
    rng = random.Random(0)
    config = SchedulingConfig(prior_output_len=200, aging_tokens_per_s=7.0)
    requests = [Req(str(i), rng.uniform(0, 100), rng.choice([None, rng.uniform(1, 2000)])) for i in range(400)]
    queue = SJFRequestQueue(config)
    for request in requests:
        queue.add_request(request)
    order = [queue.pop_request(0.0) for _ in requests]
    position = {id(request): index for index, request in enumerate(order)}
    for r in requests:
        window = aging_window_s(predicted_remaining(r.predicted_output_len, 0, config.prior_output_len), config)
        for later in requests:
            if later.arrival_time > r.arrival_time + window:
                assert position[id(later)] > position[id(r)]


def test_without_aging_sjf_can_starve_a_long_request():
    """The bound needs aging: with rate 0 any number of later short requests overtake."""
    queue = SJFRequestQueue(SchedulingConfig(aging_tokens_per_s=0.0))
    queue.add_request(Req("long", 0.0, 100.0))
    for second in range(1, 1000):
        queue.add_request(Req(f"short{second}", float(second), 5.0))
    assert drain(queue)[-1] == "long"


# --- queues ---------------------------------------------------------------------------------------
def test_fcfs_queue_keeps_arrival_order():
    queue = create_request_queue(QueuePolicy.FCFS, SchedulingConfig())
    assert isinstance(queue, FCFSRequestQueue) and not queue
    for request in (Req("a", 0, 500), Req("b", 1, 5), Req("c", 2, 50)):
        queue.add_request(request)
    assert len(queue) == 3 and queue and queue.peek_request(0.0).name == "a"
    assert [r.name for r in queue] == ["a", "b", "c"]
    assert drain(queue) == ["a", "b", "c"]


def test_sjf_queue_orders_by_predicted_remaining_with_prior_for_unknown():
    queue = create_request_queue(QueuePolicy.SJF, SchedulingConfig(prior_output_len=100, aging_tokens_per_s=0))
    assert isinstance(queue, SJFRequestQueue)
    for request in (Req("a", 0, 500), Req("b", 1, 5), Req("unknown", 2, None), Req("c", 3, 50),
                    Req("half-done", 4, 300, num_generated_tokens=280)):
        queue.add_request(request)
    assert queue.peek_request(0.0).name == "b"
    assert [r.name for r in queue] == ["b", "half-done", "c", "unknown", "a"]
    assert drain(queue) == ["b", "half-done", "c", "unknown", "a"]


def test_sjf_queue_without_predictions_is_fcfs():
    queue = SJFRequestQueue(SchedulingConfig())
    for index in range(20):
        queue.add_request(Req(str(index), float(index // 3), None))  # equal arrival times too
    assert drain(queue) == [str(index) for index in range(20)]


def tail_safe(**kwargs) -> SchedulingConfig:
    return SchedulingConfig(prior_output_len=100, long_output_len=800, **kwargs)


def test_tail_safe_queue_is_fcfs_within_each_class_and_classifies_by_predicted_remaining():
    queue = create_request_queue(QueuePolicy.TAIL_SAFE, tail_safe(long_holdback=1.0))
    assert isinstance(queue, TailSafeRequestQueue) and not queue
    for request in (Req("long-a", 0, 900), Req("short-b", 1, 50), Req("long-c", 2, 5000),
                    Req("unknown-d", 3, None),  # the prior (100): short class
                    Req("nearly-done-e", 4, 900, num_generated_tokens=850), Req("short-f", 5, 700)):
        queue.add_request(request)
    # hold-back 1: strict priority of the short class, FCFS inside each class
    assert drain(queue, now=10.0) == ["short-b", "unknown-d", "nearly-done-e", "short-f", "long-a", "long-c"]


def test_tail_safe_with_zero_holdback_is_fcfs():
    requests = [Req(str(i), float(i), 5000.0 if i % 3 else 10.0) for i in range(12)]
    assert [r.name for r in admission_order(requests, QueuePolicy.TAIL_SAFE, tail_safe(long_holdback=0.0), now=50.0)] \
        == [str(i) for i in range(12)]


def test_tail_safe_holdback_window_at_its_edges():
    """A long request that waited W yields to short requests that arrived less than f * W after it."""
    config = tail_safe(long_holdback=0.25)
    waited = 40.0
    window = holdback_window_s(waited, config)
    assert window == 10.0
    for delay, overtaken in ((window - 0.5, True), (window + 0.5, False)):
        queue = TailSafeRequestQueue(config)
        queue.add_request(Req("long", 0.0, 5000.0))
        queue.add_request(Req("short", delay, 10.0))
        assert (queue.peek_request(now=waited).name == "short") is overtaken, delay


@pytest.mark.parametrize("holdback, starves", [(0.3, False), (0.6, True)])
def test_tail_safe_starves_only_when_holdback_times_overload_reaches_one(holdback, starves):
    """Short requests arrive at twice the service rate (rho_s = 2): the bound needs f * rho_s < 1."""
    queue = TailSafeRequestQueue(tail_safe(long_holdback=holdback))
    queue.add_request(Req("long", 0.0, 5000.0))
    served = []
    for second in range(1, 200):
        queue.add_request(Req(f"short{2 * second}", second - 0.5, 10.0))
        queue.add_request(Req(f"short{2 * second + 1}", float(second), 10.0))
        served.append(queue.pop_request(now=float(second)).name)
    if starves:
        assert "long" not in served
    else:
        # W <= W_fcfs / (1 - f * rho_s) with W_fcfs = 1 s (it was first)
        assert served.index("long") + 1 <= 1 / (1 - holdback * 2)


# Nine requests one second apart, predictions far below the fixed 800 (as a learned r0's are). Ranked classes with
# share 0.25 over a window of 4: the top floor(0.25 x n) of the last n <= 4 predictions, own included.
#   a 100, b 300, c 200: n = 1..3, floor(0.25 n) = 0: no long class yet -> short
#   d 400: window [100 300 200 400], top 1 = 400, 400 >= 400 -> LONG
#   e 150: window [300 200 400 150], top 1 = 400 -> short;  f 350: [200 400 150 350] -> 400 -> short
#   g None: the prior (100) against 400, joins no window -> short
#   h 500: window [400 150 350 500] -> 500 -> LONG
#   i 450: window [150 350 500 450] -> 500 -> short (all eight predictions, n = 8: top 2 = 450 -> long: the window
#          bound matters)
RANKED = [Req("a", 0.0, 100.0), Req("b", 1.0, 300.0), Req("c", 2.0, 200.0), Req("d", 3.0, 400.0),
          Req("e", 4.0, 150.0), Req("f", 5.0, 350.0), Req("g", 6.0, None), Req("h", 7.0, 500.0),
          Req("i", 8.0, 450.0)]
# Drained at now = 10 with hold-back 0.5: the long head (arrival L) goes before the short head (arrival s) iff
# L + 0.5 x (10 - min(L, s)) < s.
#   d vs a/b/c: 3 + 0.5 x (10 - 0|1|2) = 8 | 7.5 | 7, all later than 0 | 1 | 2 -> a, b, c
#   d vs e/f/g: 3 + 0.5 x (10 - 3) = 6.5, later than 4, 5, 6 -> e, f, g;  d vs i: 6.5 < 8 -> d
#   h vs i: 7 + 0.5 x (10 - 7) = 8.5, later than 8 -> i, then h
RANKED_ORDER = ["a", "b", "c", "e", "f", "g", "d", "i", "h"]


def ranked(**kwargs) -> SchedulingConfig:
    return tail_safe(**{"long_holdback": 0.5, "long_class_share": 0.25, "rank_window": 4, **kwargs})


def test_recent_predictions_threshold_is_the_top_share_of_a_bounded_window():
    recent = RecentPredictions(ranked())
    thresholds = []
    for value in (100.0, 300.0, 200.0, 400.0, 150.0, 350.0, 500.0, 450.0):
        recent.add(value)
        thresholds.append(recent.long_threshold())
    assert thresholds == [math.inf] * 3 + [400.0, 400.0, 400.0, 500.0, 500.0]
    wide = RecentPredictions(ranked(rank_window=8))
    for value in (100.0, 300.0, 200.0, 400.0, 150.0, 350.0, 500.0, 450.0):
        wide.add(value)
    assert wide.long_threshold() == 450.0  # top floor(0.25 x 8) = 2


def test_tail_safe_ranks_timeline_by_hand():
    queue = create_request_queue(QueuePolicy.TAIL_SAFE_RANKS, ranked())
    assert isinstance(queue, RankTailSafeRequestQueue)
    for request in RANKED:
        queue.add_request(request)
    assert [r.name for r in queue] == [r.name for r in admission_order(RANKED, QueuePolicy.TAIL_SAFE_RANKS, ranked(),
                                                                       now=8.0)]
    assert drain(queue, now=10.0) == RANKED_ORDER
    assert [r.name for r in admission_order(RANKED, QueuePolicy.TAIL_SAFE_RANKS, ranked(), now=10.0)] == RANKED_ORDER
    # the fixed split at 800 puts all nine in the short class: FCFS, what tail-safe is for learned predictions
    assert [r.name for r in admission_order(RANKED, QueuePolicy.TAIL_SAFE, ranked(), now=10.0)] == list("abcdefghi")
    # an unbounded window (n = 8 at i) makes i long too: i then waits for d and h
    assert [r.name for r in admission_order(RANKED, QueuePolicy.TAIL_SAFE_RANKS, ranked(rank_window=100), now=10.0)] \
        == ["a", "b", "c", "e", "f", "g", "d", "h", "i"]


def test_longest_predicted_first_timeline_by_hand():
    config = SchedulingConfig(prior_output_len=100, aging_tokens_per_s=10.0)  # longest-first reads no aging
    requests = [Req("a", 0.0, 300.0), Req("unknown-b", 1.0, None), Req("c", 2.0, 900.0), Req("d", 3.0, 900.0),
                Req("nearly-done-e", 4.0, 500.0, num_generated_tokens=450)]
    # remaining: a 300, b the prior 100, c 900, d 900 (tie: c arrived first), e 500 - 450 = 50
    expected = ["c", "d", "a", "unknown-b", "nearly-done-e"]
    queue = create_request_queue(QueuePolicy.LONGEST_FIRST, config)
    assert isinstance(queue, LongestFirstRequestQueue)
    for request in requests:
        queue.add_request(request)
    assert [r.name for r in queue] == expected and queue.peek_request(9.0).name == "c"
    assert drain(queue, now=1000.0) == expected  # waiting changes nothing: no aging
    assert [r.name for r in admission_order(requests, QueuePolicy.LONGEST_FIRST, config)] == expected


def test_tail_safe_bound_holds_for_random_requests():
    rng = random.Random(7)
    config = tail_safe(long_holdback=0.3)
    queue = TailSafeRequestQueue(config)
    arrivals = sorted(rng.uniform(0, 100) for _ in range(300))
    requests = [Req(str(i), a, rng.choice([50.0, 400.0, 1200.0, 4000.0])) for i, a in enumerate(arrivals)]
    now, order = 0.0, []
    pending = list(requests)
    while pending or queue:
        while pending and pending[0].arrival_time <= now:
            queue.add_request(pending.pop(0))
        if queue:
            order.append((now, queue.pop_request(now)))
        now += 0.4  # slower than arrivals: a backlog builds
    position = {id(r): i for i, (_, r) in enumerate(order)}
    for admitted_at, request in order:
        if request.predicted_output_len < config.long_output_len:
            continue
        window = holdback_window_s(admitted_at - request.arrival_time, config)
        for other in requests:
            if position[id(other)] < position[id(request)] and other.arrival_time > request.arrival_time:
                assert other.arrival_time - request.arrival_time < window + 1e-9


def reference_rank_classes(requests, config):
    """tail-safe-ranks' classes written independently of RecentPredictions: for each request in list order, its
    predicted remaining length against the floor(share x n)-th largest of the last rank_window predictions (its own
    included; no prediction: the prior, recorded nowhere), the window sorted afresh each time."""
    seen, classes = [], []
    for r in requests:
        remaining = predicted_remaining(r.predicted_output_len, r.num_generated_tokens, config.prior_output_len)
        if r.predicted_output_len is not None:
            seen.append(remaining)
        window = sorted(seen[-config.rank_window:], reverse=True)
        top = int(config.long_class_share * len(window))
        classes.append(top > 0 and remaining >= window[top - 1])
    return classes


def reference_classes(requests, policy, config):
    """The tail-safe orders' classes, one bool per request: ranked, or at the fixed long_output_len."""
    if policy is QueuePolicy.TAIL_SAFE_RANKS:
        return reference_rank_classes(requests, config)
    return [is_predicted_long(r.predicted_output_len, r.num_generated_tokens, config) for r in requests]


def brute_force_order(requests, policy, config, now):
    """Reference orders written independently of the queues: a stable sort, or for tail-safe the
    request with the smallest key picked one at a time, the head-of-line age taken over what is left."""
    if policy is QueuePolicy.FCFS:
        return list(requests)
    if policy is QueuePolicy.SJF:
        return sorted(requests, key=lambda r: sjf_sort_key(r.predicted_output_len, r.num_generated_tokens,
                                                           r.arrival_time, config))
    if policy is QueuePolicy.LONGEST_FIRST:
        return sorted(requests, key=lambda r: (-predicted_remaining(r.predicted_output_len, r.num_generated_tokens,
                                                                    config.prior_output_len), r.arrival_time))
    long = {id(r): is_long for r, is_long in zip(requests, reference_classes(requests, policy, config))}
    left, order = list(requests), []
    while left:
        age = now - min(r.arrival_time for r in left)
        best = min(left, key=lambda r: tail_safe_sort_key(long[id(r)], r.arrival_time, age, config))
        left.remove(best)
        order.append(best)
    return order


@pytest.mark.parametrize("policy", list(QueuePolicy))
def test_admission_order_matches_an_independent_reference(policy):
    rng = random.Random(3)
    # distinct arrival times, so that the reference needs no tie rule
    requests = [Req(str(i), rng.uniform(0, 30), rng.choice([None, 20.0, 900.0, 3000.0])) for i in range(40)]
    config = tail_safe(long_holdback=0.4, aging_tokens_per_s=0.0, rank_window=10)
    expected = [r.name for r in brute_force_order(requests, policy, config, now=45.0)]
    assert [r.name for r in admission_order(requests, policy, config, now=45.0)] == expected
    if policy in (QueuePolicy.TAIL_SAFE, QueuePolicy.TAIL_SAFE_RANKS):
        assert expected != [r.name for r in sorted(requests, key=lambda r: r.arrival_time)]  # the hold-back acts


# --- KV budget ------------------------------------------------------------------------------------
def test_predicted_output_budget_is_remaining_plus_margin_capped():
    config = SchedulingConfig(prior_output_len=100)
    assert predicted_output_budget(300, 100, kv_margin=0.2, cap=1024, config=config) == 240  # 200 left x 1.2
    assert predicted_output_budget(300, 100, kv_margin=0.2, cap=150, config=config) == 150
    assert predicted_output_budget(None, 0, kv_margin=0.0, cap=1024, config=config) == 100  # the prior
    assert predicted_output_budget(10, 50, kv_margin=0.5, cap=1024, config=config) == 2  # past its prediction: 1 left


# --- routing --------------------------------------------------------------------------------------
def test_rank_load_counts_requests_without_prediction_with_the_prior():
    load = rank_load([(100.0, 40), (None, 0), (10.0, 30)], prior_output_len=256, base=RankLoad(2, 7.0))
    assert load == RankLoad(5, 7.0 + 60.0 + 256.0 + MIN_PREDICTED_REMAINING)


def test_round_robin_cycles_regardless_of_load():
    router = create_router(RoutingPolicy.ROUND_ROBIN)
    assert isinstance(router, RoundRobinRouter)
    loads = [RankLoad(100, 1e6), RankLoad(0, 0.0), RankLoad(5, 5.0)]
    assert [router.select(loads) for _ in range(5)] == [0, 1, 2, 0, 1]


def test_least_requests_picks_fewest_with_ties_to_lowest_index():
    router = create_router(RoutingPolicy.LEAST_REQUESTS)
    assert isinstance(router, LeastRequestsRouter) and not router.needs_predicted_work
    assert router.select([RankLoad(3, 0.0), RankLoad(1, 1e6), RankLoad(1, 0.0)]) == 1


def test_least_predicted_work_picks_least_work_then_fewest_requests():
    router = create_router(RoutingPolicy.LEAST_PREDICTED_WORK)
    assert isinstance(router, LeastPredictedWorkRouter) and router.needs_predicted_work
    # One long request (1000 left) against five short ones (50 left each): the long rank is busier.
    long_rank = rank_load([(1000.0, 0)], 256)
    short_rank = rank_load([(60.0, 10)] * 5, 256)
    assert router.select([long_rank, short_rank]) == 1
    assert least_predicted_work_rank([RankLoad(4, 10.0), RankLoad(2, 10.0), RankLoad(2, 10.0)]) == 1


def test_least_requests_then_work_keeps_the_fewest_requests_over_less_work():
    router = create_router(RoutingPolicy.LEAST_REQUESTS_THEN_WORK)
    assert router.needs_predicted_work and not router.polls_loads
    # A rank with one more request loses to the fewest, however little its predicted work.
    loads = [RankLoad(3, 5.0), RankLoad(2, 1e6), RankLoad(4, 0.0)]
    assert router.select(loads) == least_requests_rank(loads) == 1
    assert least_predicted_work_rank(loads) != 1


def test_least_requests_then_work_breaks_count_ties_by_least_work_then_lowest_index():
    loads = [RankLoad(2, 900.0), RankLoad(5, 0.0), RankLoad(2, 300.0), RankLoad(2, 300.0)]
    assert least_requests_then_work_rank(loads) == 2  # total_requests would take rank 0
    assert least_requests_rank(loads) == 0


def shares_chosen(router, loads, draws=6000):
    """The share of ``draws`` selections that went to each rank."""
    counts = [0] * len(loads)
    for _ in range(draws):
        counts[router.select(loads)] += 1
    return [count / draws for count in counts]


def test_power_of_two_picks_the_less_loaded_of_two_distinct_ranks():
    router = create_router(RoutingPolicy.POWER_OF_TWO, seed=0)
    assert isinstance(router, PowerOfTwoRouter) and router.needs_predicted_work and router.polls_loads
    # Three ranks, distinct loads: the pair holds the least loaded in 2 of its 3 equally likely draws,
    # and the most loaded is never the lesser of two distinct ranks (independent draws: 1/9).
    shares = shares_chosen(router, [RankLoad(1, 30.0), RankLoad(1, 10.0), RankLoad(1, 20.0)])
    assert shares[0] == 0.0
    assert shares[1] == pytest.approx(2 / 3, abs=0.02) and shares[2] == pytest.approx(1 / 3, abs=0.02)
    # Loads equal as the integer num_tokens the router compares: the first drawn, uniform over the ranks.
    tied = shares_chosen(router, [RankLoad(5, 10.2), RankLoad(1, 10.4), RankLoad(0, 9.6)])
    assert tied == pytest.approx([1 / 3] * 3, abs=0.02)
    assert create_router(RoutingPolicy.POWER_OF_TWO).select([RankLoad(3, 1e6)]) == 0


def test_power_of_two_on_two_ranks_is_the_exact_argmin():
    router, draw = create_router(RoutingPolicy.POWER_OF_TWO, seed=1), random.Random(2)
    for _ in range(500):
        work = draw.sample(range(10_000), 2)
        loads = [RankLoad(draw.randrange(10), float(w)) for w in work]
        assert router.select(loads) == least_predicted_work_rank(loads)


def test_power_of_two_draws_are_reproducible_with_a_seed():
    loads = [RankLoad(0, float(work)) for work in (40, 10, 30, 20, 50)]
    runs = [[router.select(loads) for _ in range(200)]
            for router in (create_router(RoutingPolicy.POWER_OF_TWO, seed) for seed in (7, 7, 8))]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_factories_reject_unknown_policies():
    with pytest.raises(ValueError):
        create_request_queue("sjf", SchedulingConfig())
    with pytest.raises(ValueError):
        create_router("round-robin")


def test_core_imports_no_framework():
    code = ("import sys, specforge_outlets.scheduling; "
            "bad = [m for m in ('torch', 'sglang', 'numpy') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def queue_order(requests, policy, config, now):
    """The reference: the policy's queue, filled in list order and drained at ``now``."""
    queue = create_request_queue(policy, config)
    for request in requests:
        queue.add_request(request)
    return [queue.pop_request(now) for _ in range(len(requests))]


@pytest.mark.parametrize("policy", list(QueuePolicy))
def test_admission_order_equals_the_queue_it_stands_for(policy):
    rng = random.Random(11)
    for trial in range(200):
        n = rng.randint(0, 60)
        # coarse arrival times and a few predictions: many exact ties, which the order must break as the queue does
        requests = [Req(f"{trial}-{i}", float(rng.randint(0, 20)), rng.choice([None, 20.0, 300.0, 900.0, 3000.0]),
                        rng.choice([0, 0, 50, 400])) for i in range(n)]
        config = tail_safe(long_holdback=rng.choice([0.0, 0.05, 0.4, 2.0]), aging_tokens_per_s=rng.choice([0.0, 10.0]),
                           long_class_share=rng.choice([0.2, 0.5]), rank_window=rng.choice([3, 10, 1000]))
        now = rng.uniform(20, 60)
        assert admission_order(requests, policy, config, now) == queue_order(requests, policy, config, now)


def reference_admission_order(requests, policy, config, now):
    """The admission order as first written (every key from the fields, a head-against-head merge), kept as the reference."""
    if policy is QueuePolicy.FCFS:
        return list(requests)
    if policy in (QueuePolicy.SJF, QueuePolicy.LONGEST_FIRST):
        return brute_force_order(requests, policy, config, now)  # stable sorts: exact ties in list order
    classes = reference_classes(requests, policy, config)
    short = sorted((r for r, is_long in zip(requests, classes) if not is_long), key=lambda r: r.arrival_time)
    long = sorted((r for r, is_long in zip(requests, classes) if is_long), key=lambda r: r.arrival_time)
    order, i, j = [], 0, 0
    while i < len(short) and j < len(long):
        age = now - min(long[j].arrival_time, short[i].arrival_time)
        if tail_safe_sort_key(True, long[j].arrival_time, age, config) < tail_safe_sort_key(
                False, short[i].arrival_time, age, config):
            order.append(long[j])
            j += 1
        else:
            order.append(short[i])
            i += 1
    return order + short[i:] + long[j:]


@pytest.mark.parametrize("policy", list(QueuePolicy))
def test_admission_order_equals_the_reference_on_large_queues(policy):
    rng = random.Random(5)
    for trial in range(60):
        n = rng.choice([1, 2, 300, 1000])
        long_share = rng.choice([0.0, 0.02, 0.3, 0.9, 1.0])
        offset = rng.choice([0.0, 0.0, -50.0, -100.0])  # negative times too, and -0.0 (the merge keys' bit patterns)
        requests = [Req(f"{trial}-{i}", round(rng.uniform(0, 100), rng.choice([0, 1, 6])) + offset,
                        rng.choice([None, rng.uniform(900, 4000) if rng.random() < long_share else rng.uniform(1, 700)]),
                        rng.choice([0, 0, 30])) for i in range(n)]
        config = tail_safe(long_holdback=rng.choice([0.0, 0.05, 0.4, 1.0, 2.0]),
                           aging_tokens_per_s=rng.choice([0.0, 10.0]), long_class_share=rng.choice([0.02, 0.2, 0.6]),
                           rank_window=rng.choice([1, 50, 1000]))
        if offset < 0:
            requests[0].arrival_time = -0.0
        latest = max(r.arrival_time for r in requests)
        now = rng.choice([latest, latest + rng.uniform(0, 300)])
        expected = reference_admission_order(requests, policy, config, now)
        assert admission_order(requests, policy, config, now) == expected, trial


def test_tail_safe_order_is_by_default_at_the_latest_arrival():
    config = tail_safe(long_holdback=0.5)
    requests = [Req("long", 0.0, 5000.0), Req("short-1", 10.0, 20.0), Req("short-2", 25.0, 20.0)]
    assert [r.name for r in admission_order(requests, QueuePolicy.TAIL_SAFE, config)] == \
        [r.name for r in admission_order(requests, QueuePolicy.TAIL_SAFE, config, now=25.0)] == \
        ["short-1", "long", "short-2"]  # T = 0 + 0.5 * 25 = 12.5
    assert [r.name for r in admission_order(requests, QueuePolicy.TAIL_SAFE, config, now=60.0)] == \
        ["short-1", "short-2", "long"]  # T = 30


def test_merge_keys_order_a_long_and_a_short_request_as_the_tail_safe_key_does():
    """Every pair, at exact ties too: held back (T > a) the long one goes first at T, not held back after."""
    config = tail_safe(long_holdback=0.5)
    for long_arrival in (-3.0, -0.0, 0.0, 2.0, 4.0):
        for now in (long_arrival, 4.0, 8.0):
            threshold = tail_safe_sort_key(True, long_arrival, now - long_arrival, config)
            [long_key] = tail_safe_long_merge_keys([long_arrival], now, config)
            for short_arrival in (-3.0, -1.5, -0.0, 0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0):
                expected = threshold < tail_safe_sort_key(False, short_arrival, now - long_arrival, config)
                assert (long_key < short_merge_key(short_arrival)) is expected, (long_arrival, now, short_arrival)
    assert short_merge_key(-0.0) == short_merge_key(0.0) < short_merge_key(5e-324) < short_merge_key(1.0)
    assert short_merge_key(-2.0) < short_merge_key(-1.0) < short_merge_key(-5e-324) < short_merge_key(-0.0)
