"""``kv_admission: vllm``: vLLM v1's admission and preemption, on cases computed by hand.

That vLLM's own ``Scheduler`` decides the same at every step is tested where vLLM is importable
(tests/test_vllm_admission_against_vllm.py). Here, with blocks of 64 tokens and a pool of 5 blocks
(4 usable: ``BlockPool`` keeps one as its null block): a preemption when the blocks run out, the
preempted request re-admitted first and recomputing its prompt and tokens, block rounding at
admission, and no admission in a step that preempted.
"""

import dataclasses
from typing import List, Tuple

import numpy as np
import pytest

from specforge_outlets.errors import OutletsError
from specforge_outlets.scheduling import SchedulingConfig
from specforge_outlets.scheduling.request_queue import FCFSRequestQueue
from specforge_outlets.serving.trace import Trace
from specforge_outlets.simulation import vllm_admission
from specforge_outlets.simulation.cluster import cluster_config_from_dict
from specforge_outlets.simulation.engine import EngineInstance, Policy, Simulation
from specforge_outlets.simulation.predictors import PredictorKind
from specforge_outlets.simulation.sglang_peers import queue_policy, routing_policy
from tests.binding_cache import binding_cluster, binding_trace
from specforge_outlets.simulation.study import StudyPlan, run_study

BLOCK = vllm_admission.BLOCK_SIZE
USABLE_BLOCKS = 4


def test_blocks_round_up_and_the_pool_keeps_its_null_block():
    assert BLOCK == 64  # vLLM 0.34.0's default; the cases below are computed with it
    assert [vllm_admission.blocks_for(t) for t in (0, 1, 64, 65, 128, 129)] == [0, 1, 1, 2, 2, 3]
    assert vllm_admission.pool_blocks(6000) == 93 and vllm_admission.usable_blocks(6000) == 92
    assert vllm_admission.watermark_blocks(6000) == 0  # off by default


@pytest.mark.parametrize("blocks, free, kept", [
    ([(1, 2), (2, 2)], 1, 2),  # both fit
    ([(1, 2), (2, 2), (3, 3)], 0, 2),  # the first needs a block: the last goes, its 3 free
    ([(2, 3)], 0, 0),  # a lone request that does not fit preempts itself
    ([(4, 5), (1, 1), (0, 0)], 0, 1),  # the last freed nothing, so the one before goes too
    ([(1, 1), (2, 4)], 1, 1),  # the last needs 2 more with 1 free: it preempts itself
])
def test_preemption_takes_the_last_running_request_until_the_allocation_fits(blocks, free, kept):
    assert vllm_admission.running_kept(blocks, free) == kept


def test_admission_needs_the_whole_sequences_blocks_and_the_watermark_only_while_others_run():
    assert vllm_admission.admits(128, 2, 0, True) and not vllm_admission.admits(129, 2, 0, True)
    assert not vllm_admission.admits(128, 2, 1, True) and vllm_admission.admits(128, 2, 1, False)


def test_decode_steps_that_fit_are_the_step_by_step_count():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        tokens = [int(t) for t in rng.integers(1, 400, int(rng.integers(1, 8)))]
        total = sum(vllm_admission.blocks_for(t) for t in tokens) + int(rng.integers(0, 20))
        steps = 0
        while sum(vllm_admission.blocks_for(t + steps) for t in tokens) <= total:
            steps += 1
        assert vllm_admission.decode_steps_that_fit(tokens, total) == steps, (tokens, total)


# --- one instance of 4 usable blocks, step by step -----------------------------------------------


def run_one_instance(monkeypatch, requests: List[Tuple[float, int, int]], chunk: int = 8192):
    """Run (arrival s, prompt, output) requests on one vLLM instance of 4 usable blocks and a step
    budget of ``chunk`` tokens; the result, the steps it ran and a log of (step, event, request,
    tokens): admitted with the tokens it computes, preempted with the tokens it had generated (or,
    still prefilling, computed), joined the decode batch with the tokens it has."""
    log = []
    take_head, retract, preempt_prefill, start_decoding = (
        EngineInstance._take_head, EngineInstance._retract, EngineInstance._preempt_prefill, EngineInstance._start_decoding)

    def logged_take_head(engine, now, reservation):
        request = take_head(engine, now, reservation)
        log.append((engine.steps_done, "admitted", request.index, request.prefill_left))
        return request

    def logged_retract(engine, now, request):
        log.append((engine.steps_done, "preempted", request.index, 1 + engine.steps_done - request.join_step))
        retract(engine, now, request)

    def logged_preempt_prefill(engine, now, request):
        log.append((engine.steps_done, "preempted prefilling", request.index, request.prefill_claim - request.prefill_left))
        preempt_prefill(engine, now, request)

    def logged_start_decoding(engine, now, request):
        log.append((engine.steps_done, "joined", request.index, request.num_generated_tokens))
        start_decoding(engine, now, request)

    for name, logged in (("_take_head", logged_take_head), ("_retract", logged_retract),
                         ("_preempt_prefill", logged_preempt_prefill), ("_start_decoding", logged_start_decoding)):
        monkeypatch.setattr(EngineInstance, name, logged)
    arrivals, inputs, outputs = (np.array(column) for column in zip(*requests))
    trace = Trace("hand", [str(i) for i in range(len(requests))], arrivals, inputs, outputs)
    cluster = cluster_config_from_dict({"mode": "colocated", "instances": 1, "max_new_tokens": 1, "max_running_requests": 8,
                                        "chunked_prefill_size": chunk, "kv_capacity_tokens": (USABLE_BLOCKS + 1) * BLOCK,
                                        "kv_admission": "vllm"}, "test")
    simulation = Simulation(trace, [None] * len(trace), cluster, Policy(routing_policy("round-robin"),
                                                                         queue_policy("fcfs")), SchedulingConfig())
    result = simulation.run()
    assert np.isfinite(result.finish_times).all()
    return result, simulation.engines[0].steps_done, log


A, B, C = 0, 1, 2
# A and B: a block of prompt each, 150 tokens out; C, later: 20 tokens of prompt, 5 out
PREEMPTION_CASE = [(0.0, 64, 150), (0.0, 64, 150), (0.3, 20, 5)]


def test_a_preempted_request_goes_first_and_recomputes_its_prompt_and_tokens(monkeypatch):
    result, steps, log = run_one_instance(monkeypatch, PREEMPTION_CASE)
    assert log == [
        (0, "admitted", A, 64),  # A's prompt: 1 block of 4
        (1, "joined", A, 1),
        (1, "admitted", B, 64),  # A holds 2 blocks for its first decode step, B's prompt takes 1
        (2, "joined", B, 1),
        # steps 2-64: A and B decode in 2 blocks each; at step 65 A's token 129 needs a third: B, the
        # last admitted, is preempted (64 tokens generated) and goes in front of C, waiting since 0.3 s
        (65, "preempted", B, 64),
        # B's 128 tokens need 2 blocks; A holds 3 until it finishes at step 150. Then B first, then C
        (150, "admitted", B, 64 + 64),
        (150, "admitted", C, 20),
        (151, "joined", B, 65),  # the recomputation samples B's token 65
        (151, "joined", C, 1),
    ]
    assert steps == 151 + 150 - 65  # B decodes its other 85 tokens (C finishes within them)
    assert result.retractions.tolist() == [0, 1, 0]
    assert len(result.token_gaps.lone_gaps) == 1  # B's token 65 came outside a decode segment


def test_no_request_is_admitted_in_a_step_that_preempted(monkeypatch):
    # Put the preempted request behind C instead of in front (vLLM's order makes the victim the head,
    # which never fits in that step): C fits the block B left, and still waits out that step.
    monkeypatch.setattr(FCFSRequestQueue, "prepend_request", FCFSRequestQueue.add_request)
    _, _, log = run_one_instance(monkeypatch, PREEMPTION_CASE)
    assert log[4:6] == [(65, "preempted", B, 64), (66, "admitted", C, 20)]


@pytest.mark.parametrize("prompt, admitted_at", [(64, 1), (65, 100)])
def test_admission_rounds_the_whole_sequence_up_to_blocks(monkeypatch, prompt, admitted_at):
    # A's prompt fills 2 blocks and its first decode step a third: a second prompt of 64 tokens fits
    # the one block left (to be preempted at the next step), one of 65 needs two and waits for A to
    # finish (100 tokens, at step 100)
    _, _, log = run_one_instance(monkeypatch, [(0.0, 128, 100), (0.0, prompt, 10)])
    assert [(step, index) for step, event, index, _ in log if event == "admitted"][:2] == [(0, A), (admitted_at, B)]


def test_a_prompt_still_prefilling_is_preempted_when_it_is_the_last(monkeypatch):
    # 64 tokens a step. A (100 tokens) and D (60) decode; D finishes at step 29 and frees the blocks
    # B's 128 tokens need; B computes 63 of them (the budget less A's token) in the block left, but at
    # step 30 A's token 129 takes that block first: B, the last running, preempts itself mid-prompt.
    D = 1
    B_ = 2
    result, steps, log = run_one_instance(monkeypatch, [(0.0, 100, 100), (0.0, 60, 27), (0.0, 128, 4)], chunk=64)
    assert log == [
        (0, "admitted", A, 100),  # in chunks of 64 and 36
        (1, "admitted", D, 60),  # 28 tokens of it, what A's chunk left
        (2, "joined", A, 1),
        (3, "joined", D, 1),
        (29, "admitted", B_, 128),  # D finished: A's 2 blocks and B's 2 fit
        (30, "preempted prefilling", B_, 63),
        (101, "admitted", B_, 128),  # A finished: B computed in 2 steps of 64 tokens
        (103, "joined", B_, 1),
    ]
    assert steps == 103 + 3 and result.retractions.tolist() == [0, 0, 1]


def test_vllm_admission_is_refused_where_it_is_not_modelled():
    with pytest.raises(OutletsError, match="kv_admission vllm models vLLM's Scheduler on colocated.*set mode colocated"):
        cluster_config_from_dict({"mode": "disaggregated", "kv_admission": "vllm"}, "test")
    with pytest.raises(OutletsError, match="max_num_seqs.*lower max_running_requests or raise chunked_prefill_size"):
        cluster_config_from_dict({"mode": "colocated", "kv_admission": "vllm", "max_running_requests": 512,
                                  "chunked_prefill_size": 256}, "test")
    cluster = cluster_config_from_dict({"mode": "colocated", "kv_admission": "vllm"}, "test")
    empty = Trace("empty", [], np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64))
    with pytest.raises(OutletsError, match="queue sjf is not vLLM's: run queue fcfs only"):
        Simulation(empty, [], cluster, Policy(routing_policy("round-robin"), queue_policy("sjf")), SchedulingConfig())


def test_a_study_under_vllm_admission_is_refused_before_it_runs_an_order_vllm_lacks(tmp_path):
    cluster = cluster_config_from_dict({"mode": "colocated", "kv_admission": "vllm"}, "test")
    trace = Trace("two", ["0", "1"], np.array([0.0, 1.0]), np.array([10, 10]), np.array([5, 5]))
    plan = StudyPlan(rate_scales=[1.0], policies=[Policy(routing_policy("round-robin"), queue_policy("fcfs"))],
                     predictor=PredictorKind.NONE, study_predictors=[PredictorKind.NONE],  # the study runs sjf
                     study_routing=routing_policy("round-robin"), noise_sigma=0.5, predictions_path=None,
                     short_threshold=800, seed=0)
    ran = []
    with pytest.raises(OutletsError, match="outlets simulate --queue fcfs --no-controlled-study"):
        run_study(trace, cluster, SchedulingConfig(), plan, progress=ran.append)
    assert not ran
    assert len(run_study(trace, cluster, SchedulingConfig(), dataclasses.replace(plan, study_predictors=[]))) == 1


@pytest.mark.parametrize("routing", ["round-robin", "least-requests", "least-predicted-work"])
def test_every_request_finishes_under_vllm_admission_in_a_cache_that_binds(routing):
    trace, cluster = binding_trace(), binding_cluster("vllm")
    result = Simulation(trace, [None] * len(trace.ids), cluster, Policy(routing_policy(routing), queue_policy("fcfs")),
                        SchedulingConfig()).run()
    assert np.isfinite(result.finish_times).all() and (result.finish_times >= result.first_token_times).all()
    assert result.retractions.sum() > 0  # nothing reserved ahead: the cache overflows and vLLM preempts
