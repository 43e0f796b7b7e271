"""The serving simulator: hand-computed timelines, policies, KV blocking, traces, predictors, CLI."""

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from specforge_outlets.cli import main
from specforge_outlets.errors import OutletsError
from specforge_outlets.scheduling import (PLUGIN_ROUTING, LengthPrediction, QueuePolicy, RankLoad, RoutingPolicy,
                                         SchedulingConfig, aging_window_s)
from specforge_outlets.simulation.cluster import ClusterConfig, cluster_config_from_dict, load_cluster_config
from specforge_outlets.simulation.engine import Policy, Simulation
from specforge_outlets.simulation.hardware import H100_SXM, LLAMA_3_1_8B, StepTimeModel
from specforge_outlets.simulation.study import summarize
from specforge_outlets.simulation.sglang_peers import create_peer_or_router, queue_policy, routing_policy, routing_spelling
from specforge_outlets.simulation.predicted_lengths import PredictorKind, predict_lengths
from specforge_outlets.serving.trace import Trace, load_lengths, load_trace, synthetic_poisson

# Every step (prefill batch, decode step, mixed step) takes exactly one second; prefill tokens,
# KV bytes and weights cost nothing, so timelines can be computed by hand.
UNIT_STEPS = StepTimeModel(weight_bytes=0.0, kv_bytes_per_token=0.0, flops_per_prefill_token=0.0,
                           effective_bandwidth=1.0, effective_flops=1.0, step_overhead_s=1.0)


@pytest.fixture
def unit_steps(monkeypatch):
    monkeypatch.setattr(ClusterConfig, "step_time_model", lambda self: UNIT_STEPS)


def make_trace(rows, name="tiny"):
    """rows: (arrival s, input tokens, output tokens)."""
    arrivals, inputs, outputs = (np.array(column) for column in zip(*rows))
    return Trace(name, [str(i) for i in range(len(rows))], arrivals.astype(float), inputs, outputs)


def pd_cluster(**overrides):
    values = dict(prefill_instances=1, decode_instances=1, kv_transfer_latency_s=0.0, max_new_tokens=1,
                  kv_capacity_tokens=10_000, kv_admission="max-new-tokens")
    values.update(overrides)
    return cluster_config_from_dict(values, "test")


def simulation(trace, cluster, routing="round-robin", queue="fcfs", predictions=None, aging=10.0, seed=0,
               **scheduling):
    predictions = trace.output_lens.astype(float).tolist() if predictions is None else predictions
    policy = Policy(routing_policy(routing), queue_policy(queue))
    return Simulation(trace, predictions, cluster, policy, SchedulingConfig(256, aging, **scheduling), seed=seed)


def simulate(*args, **kwargs):
    return simulation(*args, **kwargs).run()


# A long request, then a medium and a short one that both wait behind it on one decode slot.
# Prefill: A alone 0-1 s, then B and C in one batch 1-2 s. A decodes 10 steps, 1-11 s.
def external(predicted_output_len):
    """A prediction that came with the request (a SimRequest's r̂_0 in these tests)."""
    return LengthPrediction.of_total(predicted_output_len, "external")


THREE = make_trace([(0.0, 50, 11), (0.1, 50, 6), (0.2, 50, 2)])


# --- step-time model ------------------------------------------------------------------------------
def test_decode_steps_time_is_the_sum_of_single_steps():
    model = StepTimeModel.for_pair(H100_SXM, LLAMA_3_1_8B)
    batch, kv = 37, 12_345
    by_step = sum(model.step_time(kv + batch * step) for step in range(200))
    assert model.decode_steps_time(200, batch, kv) == pytest.approx(by_step, rel=1e-12)
    for steps in (0, 1, 2, 57, 200):
        elapsed = model.decode_steps_time(steps, batch, kv)
        assert model.decode_steps_done(elapsed + 1e-12, batch, kv) == steps
        assert model.decode_steps_done(elapsed - 1e-9, batch, kv) == max(steps - 1, 0)


def test_step_time_formula_from_datasheet_numbers():
    model = StepTimeModel.for_pair(H100_SXM, LLAMA_3_1_8B, bandwidth_efficiency=1.0, prefill_mfu=1.0, step_overhead_s=0)
    assert LLAMA_3_1_8B.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 128 * 1024
    assert model.step_time(0) == pytest.approx(8.03e9 * 2 / 3.35e12)  # weights over bandwidth, ~4.8 ms
    assert model.step_time(0, 1000) - model.step_time(0) == pytest.approx(2 * 8.03e9 * 1000 / 989e12)


FITTED = {"fixed_s": 0.01, "per_request_s": 0.002, "per_kv_token_s": 1e-6, "per_prefill_token_s": 3e-5}


def test_fitted_step_time_charges_each_running_request():
    model = StepTimeModel.fitted(**FITTED)
    assert model.step_time(1000, 200, 8) == pytest.approx(0.01 + 8 * 0.002 + 1000 * 1e-6 + 200 * 3e-5)
    batch, kv = 9, 3_000
    by_step = sum(model.step_time(kv + batch * step, 0, batch) for step in range(150))
    assert model.decode_steps_time(150, batch, kv) == pytest.approx(by_step, rel=1e-12)
    for steps in (0, 1, 40, 150):
        elapsed = model.decode_steps_time(steps, batch, kv)
        assert model.decode_steps_done(elapsed + 1e-12, batch, kv) == steps
        assert model.decode_steps_done(elapsed - 1e-9, batch, kv) == max(steps - 1, 0)


def test_fitted_step_time_sets_a_colocated_instance_s_pace():
    # one request of 10 output tokens alone: a mixed prefill step (batch 0), then 9 decode steps of batch 1
    cluster = cluster_config_from_dict({"mode": "colocated", "instances": 1, "kv_capacity_tokens": 1000,
                                        "max_new_tokens": 10, "fitted_step_time": FITTED,
                                        "kv_admission": "max-new-tokens"}, "test")
    result = simulate(make_trace([(0.0, 100, 10)]), cluster)
    prefill = 0.01 + 100 * 3e-5
    decode = sum(0.01 + 0.002 + (101 + step) * 1e-6 for step in range(9))
    assert result.first_token_times[0] == pytest.approx(prefill, rel=1e-6)
    assert result.finish_times[0] == pytest.approx(prefill + decode, rel=1e-3)


@pytest.mark.parametrize("values, message", [
    ({"fitted_step_time": {**FITTED, "per_request_s": -1}, "kv_capacity_tokens": 100}, "fitted_step_time.per_request_s"),
    ({"fitted_step_time": {"fixed_s": 0.01}, "kv_capacity_tokens": 100}, "exactly fixed_s, per_request_s"),
    ({"fitted_step_time": FITTED}, "needs kv_capacity_tokens"),
])
def test_fitted_step_time_refuses_bad_coefficients(values, message):
    with pytest.raises(OutletsError, match=message):
        cluster_config_from_dict({"mode": "colocated", **values}, "test")


# --- hand-computed timelines ----------------------------------------------------------------------
def test_fcfs_timeline_on_one_decode_slot(unit_steps):
    result = simulate(THREE, pd_cluster(max_running_requests=1), queue="fcfs")
    # B admitted when A finishes at 11 s, runs 5 steps; C after B.
    assert result.finish_times.tolist() == pytest.approx([11.0, 16.0, 17.0])
    assert result.first_token_times.tolist() == pytest.approx([1.0, 2.0, 2.0])
    assert result.queue_delays.tolist() == pytest.approx([0.0, 0.9 + 9.0, 0.8 + 14.0])
    # where they waited: for the prefill instance (A's batch, 0-1 s), then for the one decode slot
    assert result.prefill_queue_delays.tolist() == pytest.approx([0.0, 0.9, 0.8])
    assert result.decode_queue_delays.tolist() == pytest.approx([0.0, 9.0, 14.0])
    assert result.transfer_times.tolist() == pytest.approx([0.0] * 3)  # pd_cluster: no transfer latency
    metrics = summarize(result)["all"]
    assert metrics["decode_queue_mean_s"] == pytest.approx(23.0 / 3) and metrics["prefill_queue_p50_s"] == 0.8


@pytest.mark.parametrize("admission", ["max-new-tokens", "sglang"])
def test_pd_ttft_as_sglang_reports_it_is_the_first_decode_batch(unit_steps, admission):
    # THREE on one decode slot: the KV lands at 1, 2, 2 s (the simulator's TTFT); A joins the batch at once,
    # B when A leaves at 11 s, C when B leaves at 16 s; SGLang's PD decode streams the first token then
    result = simulate(THREE, pd_cluster(max_running_requests=1, kv_admission=admission), queue="fcfs")
    assert result.first_token_times.tolist() == pytest.approx([1.0, 2.0, 2.0])
    assert result.first_batch_times.tolist() == pytest.approx([1.0, 11.0, 16.0])
    reported, landed = summarize(result, as_sglang_reports=True)["all"], summarize(result)["all"]
    assert reported["ttft_mean_s"] == pytest.approx((1.0 + 10.9 + 15.8) / 3)
    assert landed["ttft_mean_s"] == pytest.approx((1.0 + 1.9 + 1.8) / 3)  # the existing figure is unchanged
    # TPOT follows: every request then makes a token a step (1 s); landed, B's and C's waits count as decoding
    assert reported["tpot_mean_s"] == pytest.approx(1.0)
    assert landed["tpot_mean_s"] == pytest.approx((1.0 + 14.0 / 5 + 15.0) / 3)
    assert reported["e2e_mean_s"] == landed["e2e_mean_s"]


def test_colocated_first_batch_is_the_first_token(unit_steps):
    cluster = cluster_config_from_dict({"mode": "colocated", "instances": 1, "max_running_requests": 1,
                                        "max_new_tokens": 1, "kv_capacity_tokens": 10_000,
                                        "kv_admission": "max-new-tokens"}, "test")
    result = simulate(THREE, cluster)
    assert result.reported_first_token_times.tolist() == pytest.approx(result.first_token_times.tolist())


def gap_multiset(result, request):
    """{gap seconds: count} of one request's inter-token gaps."""
    values, weights = result.token_gaps.gaps(np.arange(len(result.output_lens)) == request)
    counts = {}
    for value, weight in zip(values.round(9), weights):
        if weight:
            counts[float(value)] = counts.get(float(value), 0) + int(weight)
    return counts


def test_inter_token_gaps_include_the_decode_queue_wait_after_the_first_token(unit_steps):
    """A's tokens come every step; B's second token waits for the slot (2 s to 12 s); C's for B's."""
    result = simulate(THREE, pd_cluster(max_running_requests=1), queue="fcfs")
    assert gap_multiset(result, 0) == {1.0: 10}
    assert gap_multiset(result, 1) == {10.0: 1, 1.0: 4}
    assert gap_multiset(result, 2) == {15.0: 1}
    metrics = summarize(result)["all"]  # 16 gaps: fourteen of 1 s, one of 10 s, one of 15 s
    assert (metrics["itl_p50_s"], metrics["itl_p99_s"]) == (1.0, 15.0)
    assert metrics["itl_mean_s"] == pytest.approx(39 / 16)


def test_a_retracted_request_has_one_gap_from_its_retraction_to_its_resumption(unit_steps):
    # the timeline of test_underestimated_requests_are_retracted_and_recomputed: B's tokens at 2, 3, 13, 14 s
    trace = make_trace([(0.0, 10, 11), (0.1, 10, 4)])
    cluster = pd_cluster(max_running_requests=8, kv_capacity_tokens=26, kv_admission="predicted",
                         kv_margin=0.0)
    result = simulate(trace, cluster, predictions=[3.0, 3.0])
    assert result.retractions.tolist() == [0, 1]
    assert gap_multiset(result, 0) == {1.0: 10}
    assert gap_multiset(result, 1) == {1.0: 2, 10.0: 1}


@pytest.mark.parametrize("mode", ["disaggregated", "colocated"])
def test_every_request_has_its_output_minus_one_gaps_summing_to_its_decode_time(mode):
    """The gaps telescope: a request's sum to finish - first token, and there is one per token after the first."""
    lengths = make_trace([(0.0, 1 + i * 37 % 3000, 1 + i * 53 % 900) for i in range(200)])
    trace = synthetic_poisson(lengths, rate_rps=200.0, num_requests=300, seed=1)
    cluster = cluster_config_from_dict({"mode": mode, "decode_instances": 2, "instances": 2, "max_running_requests": 64,
                                        "kv_capacity_tokens": 20_000, "chunked_prefill_size": 256,
                                        "kv_admission": "predicted", "predict_at": "arrival"}, "test")
    under = (trace.output_lens / 4.0).tolist()  # every request outgrows its reservation
    result = simulate(trace, cluster, "least-predicted-work", "tail-safe", predictions=under)
    assert result.retractions.sum() > 20  # retractions, some right after a join, are exercised
    for request in range(len(trace)):
        values, weights = result.token_gaps.gaps(np.arange(len(trace)) == request)
        assert weights.sum() == pytest.approx(trace.output_lens[request] - 1), request
        decode_s = result.finish_times[request] - result.first_token_times[request]
        assert float(np.dot(values, weights)) == pytest.approx(decode_s, rel=1e-9, abs=1e-9), request


def test_a_request_retracted_before_a_step_keeps_its_pause_running():
    """Joined at 5 s and retracted before any step, resumed at 9 s: one gap from its last token (4 s) on."""
    from specforge_outlets.simulation.token_gaps import TokenGapLog

    log = TokenGapLog(num_engines=1)
    request = SimpleNamespace(index=0, last_token_time=4.0, span_start=0, span_pause=0.0)
    log.joined(0, request, now=5.0)
    log.left(0, request, now=5.0)  # no segment ended in between: no token
    log.joined(0, request, now=9.0)
    log.segment(0, duration_s=3.0, steps=3)  # 9-12 s: tokens at 10, 11, 12
    log.left(0, request, now=12.0)
    values, weights = log.gaps(np.array([True]))
    assert sorted(value for value, weight in zip(values, weights) for _ in range(int(weight))) == [1.0, 1.0, 6.0]


def test_weighted_percentile_is_the_smallest_value_reaching_the_share():
    from specforge_outlets.serving.metrics import weighted_percentile

    assert weighted_percentile(np.array([3.0, 1.0, 2.0]), np.array([1.0, 1.0, 2.0]), 50) == 2.0
    assert weighted_percentile(np.array([3.0, 1.0, 2.0]), np.array([1.0, 1.0, 2.0]), 25) == 1.0
    assert weighted_percentile(np.array([3.0, 1.0, 2.0]), np.array([1.0, 1.0, 2.0]), 99) == 3.0
    assert weighted_percentile(np.array([5.0, 1.0]), np.array([0.0, 4.0]), 99) == 1.0  # zero weight: absent
    assert np.isnan(weighted_percentile(np.zeros(0), np.zeros(0), 50))


def test_colocated_waits_before_the_first_prefill_are_the_prefill_queue(unit_steps):
    """One request at a time: B waits for A's 5 tokens before its prompt is ever prefilled."""
    cluster = cluster_config_from_dict({"mode": "colocated", "instances": 1, "max_running_requests": 1,
                                        "chunked_prefill_size": 100, "max_new_tokens": 1,
                                        "kv_admission": "max-new-tokens"}, "test")
    result = simulate(make_trace([(0.0, 10, 5), (0.5, 10, 2)]), cluster)
    assert result.prefill_queue_delays[1] > 0 and result.decode_queue_delays.tolist() == [0.0, 0.0]
    assert result.prefill_queue_delays[1] == pytest.approx(result.queue_delays[1])


def test_sjf_timeline_on_one_decode_slot(unit_steps):
    result = simulate(THREE, pd_cluster(max_running_requests=1), queue="sjf")
    # C (1 token left) overtakes B (5 left): C 11-12 s, B 12-17 s.
    assert result.finish_times.tolist() == pytest.approx([11.0, 17.0, 12.0])
    fcfs = summarize(simulate(THREE, pd_cluster(max_running_requests=1), queue="fcfs"))
    sjf = summarize(result)
    assert sjf["all"]["e2e_mean_s"] < fcfs["all"]["e2e_mean_s"]


@pytest.mark.parametrize("holdback, finish_times", [(0.5, [11.0, 17.0, 12.0]), (0.005, [11.0, 16.0, 17.0])])
def test_tail_safe_timeline_on_one_decode_slot(unit_steps, holdback, finish_times):
    # B (5 left) is in the long class (long_output_len 5), C (1 left) in the short one. When A ends
    # at 11 s, B has waited 10.9 s: C, which arrived 0.1 s after B, overtakes only if 0.1 s lies
    # within the hold-back window (0.5 x 10.9 = 5.45 s: yes; 0.005 x 10.9 = 0.0545 s: no).
    result = simulate(THREE, pd_cluster(max_running_requests=1), queue="tail-safe",
                      long_output_len=5, long_holdback=holdback)
    assert result.finish_times.tolist() == pytest.approx(finish_times)


# A blocks the one decode slot 1-11 s; B (2 tokens) and C (6 tokens) wait for it in the decode queue.
BATCH = make_trace([(0.0, 50, 11), (0.1, 50, 2), (0.2, 50, 6)])


def test_longest_predicted_first_timeline_on_one_decode_slot(unit_steps):
    # At 11 s B has 1 token left, C 5: C 11-16 s, then B 16-17 s (FCFS: B 11-12 s, C 12-17 s).
    result = simulate(BATCH, pd_cluster(max_running_requests=1), queue="longest-predicted-first")
    assert result.finish_times.tolist() == pytest.approx([11.0, 17.0, 16.0])
    assert simulate(BATCH, pd_cluster(max_running_requests=1)).finish_times.tolist() == pytest.approx([11.0, 12.0, 17.0])


@pytest.mark.parametrize("queue, finish_times", [("tail-safe-ranks", [11.0, 17.0, 12.0]), ("tail-safe", [11.0, 16.0, 17.0])])
def test_tail_safe_ranks_timeline_on_one_decode_slot(unit_steps, queue, finish_times):
    # Predictions 1, 6, 2 (A's is wrong: it runs 11), all far below the fixed 800. The decode queue's window
    # (share 0.5 of the last 2) sees the remaining lengths as each joins, one token generated at prefill:
    # A max(1 - 1, 1) = 1: one prediction, floor(0.5 x 1) = 0 -> short; B 5: window [1 5], top 1 = 5 -> long;
    # C 1: window [5 1] -> 5 -> short. At 11 s B has waited 10.9 s and C arrived 0.1 s after it, within
    # 0.5 x 10.9: C 11-12 s, B 12-17 s. Tail-safe's fixed 800 makes all short: FCFS.
    result = simulate(THREE, pd_cluster(max_running_requests=1), queue=queue, predictions=[1.0, 6.0, 2.0],
                      long_holdback=0.5, long_class_share=0.5, rank_window=2)
    assert result.finish_times.tolist() == pytest.approx(finish_times)


def test_sjf_without_predictions_is_fcfs(unit_steps):
    cluster = pd_cluster(max_running_requests=1)
    result = simulate(THREE, cluster, queue="sjf", predictions=[None] * 3)
    assert result.finish_times.tolist() == pytest.approx([11.0, 16.0, 17.0])


def test_continuous_batching_admits_at_the_next_step_boundary(unit_steps):
    # Room for all: B and C join A's batch at 2 s (a step boundary) and decode alongside it.
    result = simulate(THREE, pd_cluster(max_running_requests=8))
    assert result.finish_times.tolist() == pytest.approx([11.0, 7.0, 3.0])
    # Arriving mid-step (2.5 s) waits for the step in progress to end at 3 s.
    late = make_trace([(0.0, 50, 11), (1.5, 50, 3)])
    assert simulate(late, pd_cluster(max_running_requests=8)).finish_times.tolist() == pytest.approx([11.0, 5.0])


def test_kv_admission_blocks_until_a_request_frees_its_cache(unit_steps):
    # A reserves 50 + 11 = 61 tokens, B 56: together over 100, so B waits for A despite free slots.
    blocked = simulate(THREE.head(2), pd_cluster(max_running_requests=8, kv_capacity_tokens=100))
    assert blocked.finish_times.tolist() == pytest.approx([11.0, 16.0])
    assert blocked.queue_delays[1] == pytest.approx(0.9 + 9.0)
    roomy = simulate(THREE.head(2), pd_cluster(max_running_requests=8, kv_capacity_tokens=117))
    assert roomy.finish_times.tolist() == pytest.approx([11.0, 7.0])


def test_least_predicted_work_routing_avoids_the_rank_with_a_long_request(unit_steps):
    # A (long) goes to rank 0, B to rank 1. C, routed at 3 s, follows B to rank 1 under
    # least-predicted-work (1 token left there, 99 on rank 0): it waits for B (4 s) and decodes
    # 2 steps. Under round-robin it lands behind A.
    trace = make_trace([(0.0, 10, 101), (1.0, 10, 3), (2.0, 10, 3)])
    cluster = pd_cluster(decode_instances=2, max_running_requests=1)
    round_robin = simulate(trace, cluster, routing="round-robin")
    least_work = simulate(trace, cluster, routing="least-predicted-work")
    assert round_robin.finish_times.tolist() == pytest.approx([101.0, 4.0, 103.0])
    assert least_work.finish_times.tolist() == pytest.approx([101.0, 4.0, 6.0])


@pytest.mark.parametrize("seed", range(4))
def test_power_of_two_with_fresh_loads_on_two_ranks_avoids_the_long_request_as_least_work_does(unit_steps, seed):
    # The same timeline as least-predicted-work's above whatever the draws: A takes either idle rank,
    # B the other (0 against 100 tokens), C B's (1 against 99).
    trace = make_trace([(0.0, 10, 101), (1.0, 10, 3), (2.0, 10, 3)])
    cluster = pd_cluster(decode_instances=2, max_running_requests=1, load_poll_interval_s=0)
    result = simulate(trace, cluster, routing="power-of-two", seed=seed)
    assert result.finish_times.tolist() == pytest.approx([101.0, 4.0, 6.0])


def routing_decisions(sim):
    """Record (loads seen, rank chosen) of every routing decision of a simulation."""
    decisions, select = [], sim.router.select
    sim.router.select = lambda loads: decisions.append((list(loads), select(loads))) or decisions[-1][1]
    return decisions


@pytest.mark.parametrize("seed", range(4))
def test_power_of_two_routes_a_burst_within_one_poll_by_the_polled_loads(unit_steps, seed):
    # Colocated, polls at 0, 5, 10 s. A (1,000 tokens) takes a rank at 0 s; the poll at 5 s sees it
    # there and the other rank idle, so the whole burst at 5.5-5.8 s (600 tokens each) goes to the
    # idle rank: the requests sent since the poll are not counted. D at 10.5 s reads the poll at
    # 10 s, which counts the burst, and goes to A's rank. With fresh loads the burst spreads.
    rows = [(0.0, 10, 1000)] + [(5.5 + 0.1 * i, 10, 600) for i in range(4)] + [(10.5, 10, 5)]
    values = {"mode": "colocated", "instances": 2, "max_new_tokens": 1, "kv_capacity_tokens": 10_000,
              "predict_at": "arrival", "kv_admission": "max-new-tokens"}
    stale = simulation(make_trace(rows), cluster_config_from_dict({**values, "load_poll_interval_s": 5.0}, "test"),
                       routing="power-of-two", seed=seed)
    decisions = routing_decisions(stale)
    stale.run()
    a_rank, burst, late = decisions[0][1], decisions[1:5], decisions[5]
    assert all(loads == burst[0][0] for loads, _ in burst) and burst[0][0][a_rank].predicted_work > 900
    assert {rank for _, rank in burst} == {1 - a_rank} and late[1] == a_rank
    assert late[0][1 - a_rank].num_requests == 4  # the poll at 10 s counts the burst
    fresh = simulation(make_trace(rows), cluster_config_from_dict({**values, "load_poll_interval_s": 0}, "test"),
                       routing="power-of-two", seed=seed)
    decisions = routing_decisions(fresh)
    fresh.run()
    assert {rank for _, rank in decisions[1:5]} == {0, 1}


def test_power_of_two_runs_are_reproducible_with_a_seed():
    lengths = make_trace([(0.0, 1 + i * 37 % 3000, 1 + i * 53 % 900) for i in range(200)])
    trace = synthetic_poisson(lengths, rate_rps=40.0, num_requests=300, seed=1)
    cluster = cluster_config_from_dict({"decode_instances": 3, "max_running_requests": 16,
                                        "kv_capacity_tokens": 40_000, "kv_admission": "max-new-tokens"}, "test")
    runs = [simulate(trace, cluster, "power-of-two", "sjf", seed=seed).finish_times for seed in (3, 3, 4)]
    assert np.array_equal(runs[0], runs[1]) and not np.array_equal(runs[0], runs[2])


def test_colocated_chunked_prefill_then_decode(unit_steps):
    cluster = cluster_config_from_dict(
        {"mode": "colocated", "instances": 1, "chunked_prefill_size": 1000, "max_new_tokens": 1,
         "kv_admission": "max-new-tokens"}, "test")
    trace = make_trace([(0.0, 2500, 5), (0.0, 10, 1)])
    result = simulate(trace, cluster)
    # A's prompt takes three 1000-token chunks (0-3 s); B's 10 tokens share the third step.
    assert result.first_token_times.tolist() == pytest.approx([3.0, 3.0])
    assert result.finish_times.tolist() == pytest.approx([7.0, 3.0])


def test_aging_bounds_the_wait_of_a_long_request_under_overload(unit_steps):
    # One decode slot, overloaded: a 1-step request arrives every 0.5 s. A long request (500 tokens
    # left) at 0.5 s: without aging it waits for the whole stream; with 50 tokens/s of aging no
    # request arriving after 0.5 s + (500 - 1) / 50 s is ordered ahead of it.
    rows = [(0.0, 10, 11), (0.5, 10, 501)] + [(1.0 + 0.5 * i, 10, 2) for i in range(60)]
    trace = make_trace(rows)
    cluster = pd_cluster(max_running_requests=1)
    starved = simulate(trace, cluster, queue="sjf", aging=0.0)
    aged = simulate(trace, cluster, queue="sjf", aging=50.0)
    assert starved.queue_delays[1] > 60.0  # served after all 60 short requests
    assert aged.queue_delays[1] < 35.0  # after the ~19 that arrived within its window
    window_end = 0.5 + aging_window_s(500.0, SchedulingConfig(256, 50.0))
    after = trace.arrival_times > window_end
    assert np.all(aged.finish_times[after] > aged.finish_times[1])
    assert np.all(aged.finish_times[2:][~after[2:]] < aged.finish_times[1])


# --- KV admission by predicted length ---------------------------------------------------------------
def test_predicted_admission_runs_requests_together_that_full_reservations_serialise(unit_steps):
    # Reserving max_new_tokens (20) each, A (30) and B (30) do not fit 50 tokens together: B waits
    # for A (11 s). Reserving prompt + generated + exact remaining (A 21, B 14) they decode side by
    # side: B joins at 2 s and finishes 3 steps later, nothing is retracted.
    trace = make_trace([(0.0, 10, 11), (0.1, 10, 4)])
    full = simulate(trace, pd_cluster(max_running_requests=8, kv_capacity_tokens=50, max_new_tokens=20))
    assert full.finish_times.tolist() == pytest.approx([11.0, 14.0])
    predicted = simulate(trace, pd_cluster(max_running_requests=8, kv_capacity_tokens=50, max_new_tokens=20,
                                           kv_admission="predicted", kv_margin=0.0))
    assert predicted.finish_times.tolist() == pytest.approx([11.0, 5.0])
    assert predicted.retractions.tolist() == [0, 0]


def test_underestimated_requests_are_retracted_and_recomputed(unit_steps):
    # Both predicted at 3 tokens: A (10 left) and B (3 left) reserve 13 each and are admitted into 26
    # tokens. At 3 s the next step would overflow (25 + 2 > 26): of the two (1 predicted token left
    # each) the later arrival, B, is retracted with its 2 tokens. A finishes at 11 s; B is readmitted
    # with a full reservation, recomputed (10 + 2 prompt tokens, one step, 11-12 s) and resumes.
    trace = make_trace([(0.0, 10, 11), (0.1, 10, 4)])
    cluster = pd_cluster(max_running_requests=8, kv_capacity_tokens=26, kv_admission="predicted",
                         kv_margin=0.0)
    result = simulate(trace, cluster, predictions=[3.0, 3.0])
    assert result.finish_times.tolist() == pytest.approx([11.0, 14.0])
    assert result.retractions.tolist() == [0, 1]
    assert result.queue_delays.tolist() == pytest.approx([0.0, 0.9 + (11.0 - 3.0)])
    assert result.first_token_times.tolist() == pytest.approx([1.0, 2.0])  # recomputation is not a first token


@pytest.fixture
def overflow_check(monkeypatch):
    """Records every segment (decode run or mixed step) whose steps would take more cache than there is."""
    from specforge_outlets.simulation.schedulers import Scheduler

    original = Scheduler._start_segment
    overflows = []

    def checked(self, now):
        original(self, now)
        if self.busy:
            used = self._kv_in_use() + len(self.running) * self.segment_steps
            overflows.extend([used - self.capacity] if used > self.capacity else [])

    monkeypatch.setattr(Scheduler, "_start_segment", checked)
    return overflows


@pytest.mark.parametrize("mode", ["disaggregated", "colocated"])
def test_predicted_admission_never_overflows_the_cache(overflow_check, mode):
    lengths = make_trace([(0.0, 1 + i * 37 % 3000, 1 + i * 53 % 900) for i in range(200)])
    trace = synthetic_poisson(lengths, rate_rps=200.0, num_requests=300, seed=1)
    cluster = cluster_config_from_dict({"mode": mode, "decode_instances": 2, "instances": 2, "max_running_requests": 64,
                                        "kv_capacity_tokens": 20_000, "chunked_prefill_size": 256,
                                        "kv_admission": "predicted", "predict_at": "arrival"}, "test")
    # a tenth of each length: admitted on a charge far below what the requests take, so the cache fills
    degraded = (trace.output_lens * 0.1).tolist()
    result = simulate(trace, cluster, "least-predicted-work", "tail-safe", predictions=degraded)
    assert not overflow_check
    assert np.all(np.isfinite(result.finish_times))
    assert result.retractions.sum() > 0  # the path is exercised


def test_a_long_prompt_is_prefilled_alone_and_retracted_when_the_next_decode_step_does_not_fit(unit_steps,
                                                                                               overflow_check):
    # A (predicted 1, generates 500) runs alone; B's 1,000-token prompt is admitted and prefilled in
    # 64-token chunks, batches of their own (SGLang without --enable-mixed-chunk): A waits, so nothing
    # overflows while B is prefilled; the first decode step after does not fit, and SGLang retracts B
    # (the fewest output tokens).
    cluster = cluster_config_from_dict({"mode": "colocated", "instances": 1, "chunked_prefill_size": 64,
                                        "kv_capacity_tokens": 1108, "max_new_tokens": 1, "predict_at": "arrival",
                                        "kv_admission": "predicted", "kv_margin": 0.0}, "test")
    result = simulate(make_trace([(0.0, 100, 500), (3.5, 1000, 10)]), cluster, predictions=[1.0, 1.0])
    assert not overflow_check
    assert np.all(np.isfinite(result.finish_times))
    assert result.retractions.tolist() == [0, 1]


def test_a_predicted_reservation_is_never_above_the_full_one(unit_steps):
    # Predicted at 1000 with max_new_tokens 50: reserving prompt + 1 + 50 tokens would exceed the
    # 150-token cache that the full reservation (100 + 50) fits, and the request would never start.
    cluster = pd_cluster(max_new_tokens=50, kv_capacity_tokens=150, kv_admission="predicted")
    result = simulate(make_trace([(0.0, 100, 10)]), cluster, predictions=[1000.0])
    assert np.isfinite(result.finish_times[0])


def test_retraction_victim_is_the_longest_predicted_remaining_under_the_retraction_limit():
    from specforge_outlets.simulation.request import SimRequest

    sim = Simulation(THREE, [None] * 3, pd_cluster(), Policy(RoutingPolicy.ROUND_ROBIN, QueuePolicy.FCFS),
                     SchedulingConfig(max_retractions=2))
    engine = sim.engines[0]
    engine.steps_done = 10
    requests = {}
    for index, (predicted, arrival, retractions) in enumerate([(500, 0.0, 0), (900, 1.0, 2), (500, 2.0, 0), (100, 3.0, 0)]):
        request = SimRequest(index, arrival, 10, 1000, external(predicted), 0)
        request.reveal_prediction()
        request.join_step, request.retractions = 0, retractions
        requests[index] = request
    engine.running = dict(requests)
    # 900 predicted has the most left but was retracted twice already; of the two 500s the later
    # arrival goes
    assert engine._retraction_victim().index == 2
    for request in requests.values():
        request.retractions = 2
    assert engine._retraction_victim().index == 1  # all at the limit: the longest again


# --- dynamic predictions (a predictor that re-predicts as tokens come, as EAGLE-3 mode does) ------------
def test_a_dynamic_prediction_is_the_latest_estimate_counting_its_token():
    from specforge_outlets.simulation.request import SimRequest

    request = SimRequest(0, 0.0, 10, 6, external(50.0), 0, trajectory=np.array([50.0, 20.0, 4.0]))
    assert request.prediction_at(3) is None  # not revealed yet: the prediction point has not come
    request.reveal_prediction()
    assert request.prediction_at(0) is request.prediction  # no token yet: the prediction made at the prediction point
    totals = [request.prediction_at(k).predicted_output_len for k in (1, 2, 3)]
    assert totals == [50.0, 1 + 20.0, 2 + 4.0]
    assert request.prediction_at(9).predicted_output_len == 2 + 4.0  # past the trajectory: its last estimate
    assert request.prediction_at(3).remaining(3) == 3.0  # 2 + 4 in all, 3 generated
    static = SimRequest(1, 0.0, 10, 6, external(50.0), 0)
    static.reveal_prediction()
    assert static.prediction_at(3) is static.prediction


def test_routing_follows_the_latest_estimate_of_the_running_requests(unit_steps):
    """One request at a time per instance. A runs on 0 predicted 100 at its first token, then known to
    end at 10; B runs on 1, 25 tokens, predicted exactly. At 5 s C goes where least predicted work is:
    behind B with A's static 100 (first token after B ends), behind A with A's re-predictions."""
    trace = make_trace([(0.0, 10, 10), (0.001, 10, 25), (5.0, 10, 2)])
    cluster = cluster_config_from_dict({"mode": "colocated", "instances": 2, "max_running_requests": 1,
                                        "chunked_prefill_size": 100, "max_new_tokens": 1,
                                        "kv_admission": "max-new-tokens"}, "test")
    policy = Policy(routing_policy("least-predicted-work"), queue_policy("fcfs"))
    exact = lambda length: np.arange(length, 0, -1, dtype=float)  # noqa: E731  L, L-1, ..., 1
    a_trajectory = np.concatenate([[100.0], exact(10)[1:]])  # r̂_0 = 100, exact from the second token on
    runs = {}
    for name, trajectories in (("static", None), ("dynamic", [a_trajectory, exact(25), exact(2)])):
        runs[name] = Simulation(trace, [100.0, 25.0, 2.0], cluster, policy, SchedulingConfig(256, 10.0),
                                trajectories).run()
    b_finish = runs["static"].finish_times[1]
    assert runs["static"].first_token_times[2] > b_finish  # waited for B
    assert runs["dynamic"].first_token_times[2] == pytest.approx(runs["dynamic"].finish_times[0] + 1.0)  # behind A
    assert runs["dynamic"].first_token_times[2] < b_finish


def test_retraction_reads_the_latest_estimate():
    from specforge_outlets.simulation.request import SimRequest

    sim = Simulation(THREE, [None] * 3, pd_cluster(), Policy(RoutingPolicy.ROUND_ROBIN, QueuePolicy.FCFS),
                     SchedulingConfig(), trajectories=[None] * 3)
    engine = sim.engines[0]
    engine.steps_done = 10
    early_high = SimRequest(0, 0.0, 10, 1000, external(900.0), 0, trajectory=np.full(1000, 5.0))  # now expects 5 more
    steady = SimRequest(1, 1.0, 10, 1000, external(300.0), 0)
    for request in (early_high, steady):
        request.reveal_prediction()
        request.join_step = 0
    engine.running = {0: early_high, 1: steady}
    assert engine._retraction_victim().index == 1  # 300 - 11 left beats 10 + 5 - 11; statically 0 would go


def test_kv_admission_by_prediction_follows_the_latest_estimate(unit_steps):
    """A (20 tokens) is predicted 50 at its first token, exactly from its second on. With 100 KV tokens
    B (not predicted before its prefill: 5 + max_new_tokens 60 reserved) does not fit beside A's static
    reservation (10 + 1 + 49) and waits for A; once A's reservation follows its estimate (10 + 3 + 17 at
    3 s) B is admitted at its arrival."""
    trace = make_trace([(0.0, 10, 20), (3.0, 5, 5)])
    cluster = cluster_config_from_dict({"mode": "colocated", "instances": 1, "max_running_requests": 4,
                                        "chunked_prefill_size": 100, "max_new_tokens": 60, "kv_capacity_tokens": 100,
                                        "kv_admission": "predicted", "kv_margin": 0.0}, "test")
    policy = Policy(routing_policy("round-robin"), queue_policy("fcfs"))
    a_trajectory = np.concatenate([[50.0], np.arange(20, 0, -1, dtype=float)[1:]])
    b_trajectory = np.arange(5, 0, -1, dtype=float)
    static, dynamic = (Simulation(trace, [50.0, 5.0], cluster, policy, SchedulingConfig(256, 10.0), trajectories).run()
                       for trajectories in (None, [a_trajectory, b_trajectory]))
    assert static.first_token_times[1] > static.finish_times[0]
    assert dynamic.first_token_times[1] < dynamic.finish_times[0]


@pytest.mark.parametrize("mode", ["disaggregated", "colocated"])
@pytest.mark.parametrize("kv_admission", ["max-new-tokens", "predicted"])
def test_every_request_finishes_with_dynamic_predictions(mode, kv_admission):
    rng = np.random.default_rng(3)
    lengths = make_trace([(0.0, 1 + i * 37 % 3000, 1 + i * 53 % 900) for i in range(200)])
    trace = synthetic_poisson(lengths, rate_rps=40.0, num_requests=300, seed=1)
    trajectories = [np.maximum(np.arange(n, 0, -1) * np.exp(rng.normal(0, 0.5, n)), 0.0) for n in trace.output_lens]
    cluster = cluster_config_from_dict({"mode": mode, "decode_instances": 2, "instances": 2,
                                        "max_running_requests": 32, "kv_capacity_tokens": 40_000,
                                        "kv_admission": kv_admission}, "test")
    policy = Policy(routing_policy("least-predicted-work"), queue_policy("sjf"))
    result = Simulation(trace, [float(t[0]) for t in trajectories], cluster, policy, SchedulingConfig(256, 10.0),
                        trajectories).run()
    assert np.all(np.isfinite(result.finish_times))
    assert np.all(result.first_token_times > result.arrival_times)
    assert np.all(result.finish_times >= result.first_token_times)


def test_file_dynamic_needs_a_trajectory_for_every_trace_request(tmp_path):
    from specforge_outlets.simulation.predicted_lengths import predicted_trajectories

    trace = make_trace([(0.0, 5, 3), (1.0, 5, 2)])
    path = write(tmp_path, "p.jsonl", '{"id": "0", "predicted_output_len": 3, "trajectory": [3, 2, 1]}\n'
                                      '{"id": "1", "predicted_output_len": 2}\n')
    with pytest.raises(OutletsError, match="trace id '1' has no trajectory"):
        predicted_trajectories(PredictorKind.FILE_DYNAMIC, trace, path)
    assert predicted_trajectories(PredictorKind.FILE, trace, path) is None
    bad = write(tmp_path, "b.jsonl", '{"id": "0", "predicted_output_len": 3, "trajectory": [3, -1]}\n')
    with pytest.raises(OutletsError, match="line 1: trajectory must be a non-empty list"):
        predicted_trajectories(PredictorKind.FILE_DYNAMIC, trace, bad)


@pytest.mark.parametrize("mode", ["disaggregated", "colocated"])
@pytest.mark.parametrize("routing", ["round-robin", "least-requests", "least-predicted-work", "total-tokens",
                                     "power-of-two"])
@pytest.mark.parametrize("queue", ["fcfs", "sjf", "tail-safe", "tail-safe-ranks", "longest-predicted-first",
                                   "shortest-prefill-first", "lof", "hrrn"])
@pytest.mark.parametrize("kv_admission", ["max-new-tokens", "predicted"])
def test_every_request_finishes_in_order_of_its_stages(mode, routing, queue, kv_admission):
    lengths = make_trace([(0.0, 1 + i * 37 % 3000, 1 + i * 53 % 900) for i in range(200)])
    trace = synthetic_poisson(lengths, rate_rps=40.0, num_requests=300, seed=1)
    cluster = cluster_config_from_dict({"mode": mode, "decode_instances": 2, "instances": 2,
                                        "max_running_requests": 32, "kv_capacity_tokens": 40_000,
                                        "kv_admission": kv_admission}, "test")
    result = simulate(trace, cluster, routing, queue, predictions=predict_lengths(PredictorKind.NOISY, trace, 0))
    assert np.all(np.isfinite(result.finish_times))
    assert np.all(result.first_token_times > result.arrival_times)
    assert np.all(result.finish_times >= result.first_token_times)
    assert np.all(result.queue_delays >= 0)


# --- bad input ------------------------------------------------------------------------------------
def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text, message", [
    ("TIMESTAMP,ContextTokens\n1,2\n", "missing column(s) GeneratedTokens"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n-1.0,10,5\n", "line 2 (row 0): TIMESTAMP must be a non-negative"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n5,10,5\n4,10,5\n", "line 3 (row 1): TIMESTAMP goes back in time"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n1,10,5\n2,10,0\n", "line 3 (row 1): GeneratedTokens must be at least 1"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n1,ten,5\n", "ContextTokens must be an integer"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,10,5\n", "neither seconds nor a date-time"),
])
def test_bad_azure_traces_name_the_row_and_field(tmp_path, text, message):
    with pytest.raises(OutletsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_trace(write(tmp_path, "bad.csv", text))


def test_azure_trace_with_dates_and_jsonl_trace_load(tmp_path):
    csv_trace = load_trace(write(tmp_path, "t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                 "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"))
    assert csv_trace.arrival_times.tolist() == pytest.approx([0.0, 4.314579])
    assert csv_trace.output_lens.tolist() == [44, 109] and csv_trace.ids == ["0", "1"]
    jsonl = load_trace(write(tmp_path, "t.jsonl", '{"id": "a", "timestamp": 3, "input_length": 5, "output_length": 7}\n'
                             '{"id": "b", "timestamp": 5, "input_length": 6, "output_length": 8}\n'))
    assert jsonl.ids == ["a", "b"] and jsonl.arrival_times.tolist() == [0.0, 2.0]
    assert jsonl.scaled(2.0).arrival_times.tolist() == [0.0, 1.0] and jsonl.scaled(2.0).offered_rps == 2.0


def test_mooncake_trace_timestamps_are_milliseconds(tmp_path):
    """The Mooncake format SGLang's bench_serving replays (hash_ids, timestamps in ms) offers its real load."""
    rows = "".join(f'{{"timestamp": {ms}, "input_length": 300, "output_length": 20, "hash_ids": [1, 2]}}\n'
                   for ms in (27482, 28482, 30982))
    trace = load_trace(write(tmp_path, "mooncake.jsonl", rows))
    assert trace.arrival_times.tolist() == pytest.approx([0.0, 1.0, 3.5])
    assert trace.offered_rps == pytest.approx(3 / 3.5)  # read as seconds it would be 3 / 3500
    mixed = rows + '{"timestamp": 31000, "input_length": 5, "output_length": 7}\n'
    with pytest.raises(OutletsError, match=r"line 4: has no hash_ids, unlike line 1: the trace mixes Mooncake rows"):
        load_trace(write(tmp_path, "mixed.jsonl", mixed))


def test_lengths_only_csv_feeds_poisson_traces_and_is_refused_as_a_trace(tmp_path):
    """sarathi-serve's ShareGPT statistics: lengths without arrival times, so only --lengths-from takes them."""
    path = write(tmp_path, "lengths.csv", "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
                 "74,918,992,0.08\n290,905,1195,0.32\n")
    lengths = load_lengths(path)
    assert lengths.input_lens.tolist() == [74, 290] and lengths.output_lens.tolist() == [918, 905]
    poisson = synthetic_poisson(lengths, rate_rps=5.0, num_requests=50, seed=0)
    assert set(poisson.output_lens.tolist()) == {918, 905}
    with pytest.raises(OutletsError, match=r"no arrival times; draw requests from it with --lengths-from"):
        load_trace(path)
    with pytest.raises(OutletsError, match=r"line 3 \(row 1\): num_decode_tokens must be at least 1, got 0; drop the row"):
        load_lengths(write(tmp_path, "bad.csv", "num_prefill_tokens,num_decode_tokens\n5,7\n5,0\n"))
    azure = write(tmp_path, "t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n1,10,5\n")
    assert load_lengths(azure).output_lens.tolist() == [5]


def test_sglang_shortest_prefill_first_orders_by_prompt_length_whatever_the_output(unit_steps):
    """SGLang's peer order: B (the shortest prompt) is prefilled before C and A although it arrived last."""
    trace = make_trace([(0.0, 50, 2), (0.1, 300, 2), (0.2, 290, 2), (0.3, 20, 30)])
    cluster = pd_cluster(max_prefill_tokens=300)  # no two of the waiting prompts fit one prefill batch
    result = simulate(trace, cluster, queue="shortest-prefill-first")
    fcfs = simulate(trace, cluster, queue="fcfs")
    first_tokens = result.first_token_times.tolist()
    # the first request is alone and starts at once; then 20 < 290 < 300 tokens: 3, 2, 1 (FCFS: 1, 2, 3)
    assert first_tokens[3] < first_tokens[2] < first_tokens[1]
    assert fcfs.first_token_times[1] < fcfs.first_token_times[2] < fcfs.first_token_times[3]
    with pytest.raises(ValueError, match="unknown queue order 'lpm'; one of fcfs, sjf, tail-safe, tail-safe-ranks, "
                                         "longest-predicted-first, shortest-prefill-first, lof, hrrn"):
        queue_policy("lpm")


def test_sglang_lof_serves_the_largest_max_new_tokens_first_and_ties_fcfs(unit_steps):
    """SGLang's lof sorts by max_new_tokens: with the cap below every output (the client asks for the
    output), longest output first; with every output under the cap, all tie and it is FCFS."""
    trace = make_trace([(0.0, 50, 2), (0.1, 50, 5), (0.2, 50, 30), (0.3, 50, 10)])
    uncapped = simulate(trace, pd_cluster(max_prefill_tokens=50), queue="lof").first_token_times.tolist()
    assert uncapped[2] < uncapped[3] < uncapped[1]  # 30, 10, 5 tokens asked: C, D, B
    capped = simulate(trace, pd_cluster(max_prefill_tokens=50, max_new_tokens=100), queue="lof")
    fcfs = simulate(trace, pd_cluster(max_prefill_tokens=50, max_new_tokens=100), queue="fcfs")
    assert capped.first_token_times.tolist() == fcfs.first_token_times.tolist()


@pytest.mark.parametrize("queue", ["lof", "hrrn", "shortest-prefill-first"])
def test_sglangs_orders_leave_a_disaggregated_decode_queue_fcfs(unit_steps, queue):
    """SGLang sorts a PD decode instance's waiting queue only for the plugin's order: C (6 tokens,
    lof would serve it first) waits behind B on the one decode slot, as under FCFS."""
    trace = make_trace([(0.0, 50, 11), (0.1, 50, 2), (1.5, 50, 6)])  # prefilled one by one, in arrival order
    cluster = pd_cluster(max_running_requests=1, max_prefill_tokens=50)
    assert simulate(trace, cluster, queue=queue).finish_times.tolist() == \
        simulate(trace, cluster, queue="fcfs").finish_times.tolist()


def test_a_retracted_request_waits_with_its_latest_estimate():
    from specforge_outlets.simulation.request import SimRequest

    sim = Simulation(THREE, [None] * 3, pd_cluster(), Policy(RoutingPolicy.ROUND_ROBIN, QueuePolicy.SJF),
                     SchedulingConfig(), trajectories=[None] * 3)
    engine = sim.engines[0]
    engine.steps_done = 10
    request = SimRequest(0, 0.0, 10, 100, external(900.0), 0, trajectory=np.full(100, 7.0))
    request.reveal_prediction()
    request.join_step, request.reservation = 0, 0
    engine.running, engine.kv_tokens = {0: request}, 21
    engine._retract(0.0, request)
    assert request.predicted_output_len == 10 + 7.0  # 11 generated: the estimate at token 11, not r̂_0
    assert engine.queue.peek_request(0.0) is request


def test_sglang_hrrn_serves_the_highest_ratio_of_prefill_waited_to_own_prefill(unit_steps):
    """SGLang's hrrn: the prefill tokens processed since a request queued, over its own prompt.

    One prompt per 1 s prefill batch. A is alone at 0 s (60 tokens handed out); B, Z and X queue
    during it and tie at ratio 0 at 1 s (FCFS: B). At 2 s 120 tokens were handed out: X (30 tokens)
    has waited 60 / 30, Z 60 / 60, Y (queued at 120) 0: X. At 3 s: Y 30 / 5 beats Z 90 / 60."""
    trace = make_trace([(0.0, 60, 1), (0.05, 60, 1), (0.1, 60, 1), (0.2, 30, 1), (1.5, 5, 1)])
    first = {name: simulate(trace, pd_cluster(max_prefill_tokens=30), queue=name).first_token_times.tolist()
             for name in ("hrrn", "fcfs", "shortest-prefill-first")}
    a, b, z, x, y = first["hrrn"]
    assert a < b < x < y < z
    assert first["fcfs"][2] < first["fcfs"][3] < first["fcfs"][4]  # Z, X, Y
    assert first["shortest-prefill-first"][4] < first["shortest-prefill-first"][2]  # Y (5 tokens) before Z


def hrrn_queue():
    from types import SimpleNamespace

    from specforge_outlets.simulation.sglang_peers import HighestResponseRatioRequestQueue

    queue = HighestResponseRatioRequestQueue()

    def add(entered, tokens):
        queue.add_request(SimpleNamespace(input_len=tokens, num_generated_tokens=0, enqueue_time=entered))

    return queue, add


def test_sglang_hrrn_sorts_once_per_round():
    """Within one round (one ``now``) every pick uses the counter the round's sort saw, as SGLang sorts once."""
    queue, add = hrrn_queue()
    add(0.0, 995)
    add(0.1, 50)
    add(0.2, 100)
    assert queue.pop_request(0.0).input_len == 995  # all at ratio 0: FCFS; 995 tokens handed out
    add(0.5, 1)
    # at 1 s: 995/50 = 19.9, 995/100 = 9.95, 0/1. After the first pick the live counter is 1045, which
    # would rank the 1-token prompt (50) above the 100-token one (10.45); the round's sort does not.
    assert [queue.pop_request(1.0).input_len for _ in range(2)] == [50, 100]
    assert queue.pop_request(2.0).input_len == 1


def test_sglang_hrrn_serves_fcfs_above_its_queue_limit():
    """Above SGLang's WAITING_QUEUE_PREFIX_MATCH_MAX waiting requests hrrn skips its sort: FCFS."""
    from specforge_outlets.simulation.sglang_peers import HRRN_FCFS_ABOVE

    queue, add = hrrn_queue()

    add(0.0, 500)
    for index in range(HRRN_FCFS_ABOVE):
        add(1.0 + index, 100 if index == 0 else 10)  # the first will have waited the least per own token
    assert queue.pop_request(0.0).input_len == 500  # 129 waiting: FCFS; 500 tokens handed out since they queued
    assert queue.peek_request(2.0).input_len == 10  # 128 waiting: the highest ratio, 500 / 10
    add(500.0, 10)
    assert queue.peek_request(3.0).enqueue_time == 1.0  # 129 waiting: FCFS


def test_sglang_total_tokens_routing_avoids_the_instance_with_a_long_prompt(unit_steps):
    """SGLang's peer balancing: C goes where fewer tokens are, not to the tie of request counts (instance 0)."""
    cluster = cluster_config_from_dict(
        {"mode": "colocated", "instances": 2, "chunked_prefill_size": 1000, "max_new_tokens": 1,
         "kv_admission": "max-new-tokens"}, "test")
    trace = make_trace([(0.0, 2500, 5), (0.1, 10, 1), (0.2, 10, 1)])
    by_tokens = simulate(trace, cluster, routing="total-tokens")
    by_requests = simulate(trace, cluster, routing="least-requests")  # 1 request each: C to instance 0, behind A
    # behind B on instance 1: its step after B's (1.1-2.1 s); behind A's three prompt chunks on instance 0: 3 s
    assert by_tokens.first_token_times[2] == pytest.approx(2.1) and by_requests.first_token_times[2] == pytest.approx(3.0)
    with pytest.raises(ValueError, match="unknown routing 'cache-aware'; one of round-robin, .*, power_of_two"):
        routing_policy("cache-aware")
    assert [routing_policy(name) for name in ("total_tokens", "total_requests")] == [
        routing_policy("total-tokens"), routing_policy("least-requests")]


def test_outlets_spelling_is_the_plugins_rule_fewest_requests_over_least_work():
    """SGLang's ``--load-balance-method outlets`` simulates what the plugin serves: PLUGIN_ROUTING, whose rank
    with fewer requests wins over one with less predicted work (least-predicted-work would take rank 1)."""
    assert routing_policy("outlets") is PLUGIN_ROUTING is routing_policy("least-requests-then-work")
    loads = [RankLoad(1, 2000.0), RankLoad(2, 20.0)]
    assert create_peer_or_router(routing_policy("outlets")).select(loads) == 0
    assert create_peer_or_router(routing_policy("least-predicted-work")).select(loads) == 1
    assert routing_spelling(routing_policy("least-predicted-work")) is None  # neither SGLang nor its router serves it


def test_bad_jsonl_trace_names_the_line(tmp_path):
    with pytest.raises(OutletsError, match="line 2: missing field.*output_length"):
        load_trace(write(tmp_path, "t.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 7}\n'
                                              '{"timestamp": 1, "input_length": 5}\n'))
    with pytest.raises(OutletsError, match="line 1: output_length must be at least 1"):
        load_trace(write(tmp_path, "z.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 0}\n'))


def test_cluster_that_cannot_hold_one_request_names_row_and_field(unit_steps):
    trace = make_trace([(0.0, 10, 5), (1.0, 900, 5)])
    with pytest.raises(OutletsError, match=r"row 1 \(id 1\): needs 1000 KV tokens.*kv_capacity_tokens=500"):
        simulate(trace, pd_cluster(kv_capacity_tokens=500, max_new_tokens=100))


@pytest.mark.parametrize("text, message", [
    ("decode_instance: 3\n", "unknown field.*decode_instance"),
    ("max_running_requests: 0\n", "max_running_requests must be a positive integer"),
    ("mode: pipelined\n", "mode must be one of disaggregated, colocated"),
    ("gpu: A100\n", "gpu must be one of"),
    ("kv_transfer_bandwidth: -1\n", "kv_transfer_bandwidth must be a positive number"),
    ("memory_fraction: 0.1\nkv_admission: max-new-tokens\n", "does not fit on H100-SXM"),
    ("kv_admission: guess\n", "kv_admission must be one of max-new-tokens, predicted"),
    ("kv_admission: predicted\nkv_margin: -0.1\n", r"kv_margin=-0.1: give a number >= 0$"),
    ("mode: colocated\nkv_margin: 0.1\n", r"kv_margin is read by kv_admission predicted, not by kv_admission sglang "
                                          r"\(the default\): leave it out or use kv_admission predicted$"),
    ("kv_admission: sglang\nkv_quantile: 0.5\n", r"kv_quantile is read by kv_admission quantile or peak, not by "
                                                 r"kv_admission sglang: leave it out"),
    ("decode_instances: 2\nkv_admission: peak\n", r"kv_admission peak gates SGLang's PrefillAdder.*name kv_admission "
                                                 r"sglang"),
    ("load_poll_interval_s: -1\n", "load_poll_interval_s must be a non-negative number, got -1"),
    ("load_poll_interval_s: often\n", "load_poll_interval_s must be a non-negative number, got 'often'"),
])
def test_bad_cluster_configs_name_the_field(tmp_path, text, message):
    with pytest.raises(OutletsError, match=message):
        load_cluster_config(write(tmp_path, "c.yaml", text))


def test_recipes_load_with_expected_capacity():
    config = load_cluster_config("recipes/cluster-h100-1p3d.yaml")
    assert (config.prefill_instances, config.decode_instances) == (1, 3)
    assert config.kv_transfer_bandwidth == 50e9  # YAML reads 50.0e9 as a string; accepted as a number
    assert 400_000 < config.kv_capacity() < 500_000  # (0.88 * 80 GiB - 16 GB) / 128 KiB
    assert load_cluster_config("recipes/cluster-h200-1p3d.yaml").kv_capacity() > 1.7 * config.kv_capacity()


# --- predictors -----------------------------------------------------------------------------------
def test_oracle_and_noisy_predictors():
    trace = make_trace([(float(i), 10, 100) for i in range(4000)])
    assert predict_lengths(PredictorKind.ORACLE, trace, 0) == [100.0] * 4000
    assert predict_lengths(PredictorKind.NONE, trace, 0) == [None] * 4000
    noisy = np.log(np.array(predict_lengths(PredictorKind.NOISY, trace, 0, noise_sigma=0.5)) / 100)
    assert abs(np.median(noisy)) < 0.03 and abs(noisy.std() - 0.5) < 0.03


def test_file_predictor_joins_by_id_or_samples_bucketed_errors(tmp_path):
    trace = make_trace([(0.0, 10, 10), (1.0, 10, 1000)])
    joined = write(tmp_path, "p.jsonl", '{"id": "0", "predicted_output_len": 12}\n{"id": "1", "predicted_output_len": 900}\n')
    assert predict_lengths(PredictorKind.FILE, trace, 0, predictions_path=joined) == [12.0, 900.0]
    # Other ids: errors from the file's own (predicted, true) pairs; short ones x2, long ones x0.5.
    rows = [{"id": f"s{i}", "predicted_output_len": 2 * (5 + i), "true_output_len": 5 + i} for i in range(50)]
    rows += [{"id": f"l{i}", "predicted_output_len": (900 + i) / 2, "true_output_len": 900 + i} for i in range(50)]
    sampled = write(tmp_path, "e.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    assert predict_lengths(PredictorKind.FILE, trace, 0, predictions_path=sampled) == pytest.approx([20.0, 500.0])
    bare = write(tmp_path, "b.jsonl", '{"id": "x", "predicted_output_len": 12}\n')
    with pytest.raises(OutletsError, match="2 trace id\\(s\\) missing"):
        predict_lengths(PredictorKind.FILE, trace, 0, predictions_path=bare)


@pytest.mark.parametrize("rows, message", [
    # one id matches, one does not: a join gone wrong, not a lengths-only trace
    (['{"id": "0", "predicted_output_len": 12, "true_output_len": 10}', '{"id": "z", "predicted_output_len": 9}'],
     r"1 of 2 trace ids are missing \(first: '1'\)"),
    (['{"id": "0", "predicted_output_len": 12}', '{"id": "1", "predicted_output_len": 900, "true_output_len": 999}'],
     r"id '1' has true_output_len 999 but the trace's output_length is 1000"),
    (['{"id": "0", "predicted_output_len": 12}', '{"id": "1", "predicted_output_len": 9}', '{"id": "0", "predicted_output_len": 5}'],
     r"line 3: id '0' again \(first on line 1\)"),
])
def test_prediction_files_that_do_not_match_the_trace_name_the_first_offending_id(tmp_path, rows, message):
    trace = make_trace([(0.0, 10, 10), (1.0, 10, 1000)])
    path = write(tmp_path, "p.jsonl", "".join(row + "\n" for row in rows))
    with pytest.raises(OutletsError, match=message):
        predict_lengths(PredictorKind.FILE, trace, 0, predictions_path=path)


# --- command --------------------------------------------------------------------------------------
def test_simulate_command_writes_summary_and_plots(tmp_path, capsys):
    lines = "".join(f'{{"timestamp": {i * 0.05}, "input_length": {100 + i % 7 * 300}, "output_length": {5 + i * 37 % 1200}}}\n'
                    for i in range(300))
    trace = write(tmp_path, "trace.jsonl", lines)
    out = tmp_path / "out"
    code = main(["simulate", "--trace", trace, "--config", "recipes/cluster-h100-1p3d.yaml", "--output", str(out),
                 "--rate-scale", "1", "3", "--routing", "round_robin", "outlets"])  # SGLang's spellings
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["routing_in_sglang"] == {"round-robin": "round_robin", "least-requests-then-work": "outlets"}
    assert "'order_key': 'point'" in (out / "summary.md").read_text()  # values, not enum reprs
    assert len(summary["runs"]) == 2 * (6 + 3)  # rate scales x (2 routings x 3 queues + controlled study)
    run = summary["runs"][0]["metrics"]
    assert run["all"]["requests"] == 300 and run["short"]["requests"] + run["long"]["requests"] == 300
    assert math.isfinite(run["short"]["e2e_p99_s"]) and run["all"]["throughput_tok_s"] > 0
    assert "Controlled study" in (out / "summary.md").read_text()
    assert (out / "policies.png").stat().st_size > 0 and (out / "controlled_study.png").stat().st_size > 0


def test_simulate_command_runs_power_of_two_with_its_seed_and_poll_interval(tmp_path, capsys):
    lines = "".join(f'{{"timestamp": {i * 0.05}, "input_length": {100 + i % 7 * 300}, "output_length": {5 + i * 37 % 1200}}}\n'
                    for i in range(300))
    trace = write(tmp_path, "trace.jsonl", lines)
    config = write(tmp_path, "c.yaml", "decode_instances: 3\nload_poll_interval_s: 2.5\nkv_admission: max-new-tokens\n")
    summaries = []
    for run in ("a", "b"):
        code = main(["simulate", "--trace", trace, "--config", config, "--output", str(tmp_path / run), "--routing",
                     "power_of_two", "--queue", "fcfs", "--study-routing", "power-of-two", "--seed", "5"])
        assert code == 0
        summaries.append(json.loads((tmp_path / run / "summary.json").read_text()))
    assert summaries[0]["cluster"]["load_poll_interval_s"] == 2.5 and summaries[0]["seed"] == 5
    assert {run["routing"] for run in summaries[0]["runs"]} == {"power-of-two"}
    metrics = [[run["metrics"] for run in summary["runs"]] for summary in summaries]
    assert metrics[0] == metrics[1]


def test_simulate_command_reports_bad_input_without_traceback(tmp_path, capsys):
    trace = write(tmp_path, "bad.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n1,10,5\n0,10,5\n")
    code = main(["simulate", "--trace", trace, "--config", "recipes/cluster-h100-1p3d.yaml", "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and "line 3 (row 1): TIMESTAMP goes back in time" in err and "Traceback" not in err
