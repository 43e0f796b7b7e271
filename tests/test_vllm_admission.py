"""``kv_admission: vllm`` and ``vllm-0.13``: vLLM v1's admission and preemption, on cases computed by hand.

That vLLM's own ``Scheduler`` decides the same at every step is tested where vLLM is importable
(tests/test_vllm_admission_against_vllm.py). Here, with vLLM 0.34.0's blocks of 64 tokens and a pool
of 5 blocks (4 usable: ``BlockPool`` keeps one as its null block): a preemption when the blocks run
out, the preempted request re-admitted first and recomputing its prompt and tokens, block rounding at
admission, and no admission in a step that preempted. The same 320 tokens hold 20 of v0.13's blocks
of 16 (19 usable), where a prompt is admitted once its first chunk fits: earlier than under 0.34.0,
and preempted again and again while its whole sequence does not fit.
"""

import dataclasses
import json
from typing import List, Tuple

import numpy as np
import pytest

from specforge_outlets.cli import main
from specforge_outlets.errors import OutletsError
from specforge_outlets.scheduling import SchedulingConfig
from specforge_outlets.scheduling.request_queue import FCFSRequestQueue
from specforge_outlets.serving.trace import Trace
from specforge_outlets.simulation import vllm_admission
from specforge_outlets.simulation.cluster import VLLM_ADMISSIONS, cluster_config_from_dict
from specforge_outlets.simulation.engine import Policy, Simulation
from specforge_outlets.simulation.schedulers import VLLMScheduler
from specforge_outlets.simulation.predicted_lengths import PredictorKind
from specforge_outlets.simulation.sglang_peers import queue_policy, routing_policy
from tests.binding_cache import binding_cluster, binding_trace
from specforge_outlets.simulation.study import StudyPlan, run_study

VLLM_0_34, VLLM_0_13 = vllm_admission.VLLM_0_34, vllm_admission.VLLM_0_13
BLOCK = VLLM_0_34.block_size
USABLE_BLOCKS = 4  # of 64 tokens
CAPACITY = (USABLE_BLOCKS + 1) * BLOCK  # KV tokens of the instance below, the null block's included


def test_blocks_round_up_and_the_pool_keeps_its_null_block():
    assert BLOCK == 64  # vLLM 0.34.0's default; the cases below are computed with it
    assert [VLLM_0_34.blocks_for(t) for t in (0, 1, 64, 65, 128, 129)] == [0, 1, 1, 2, 2, 3]
    assert VLLM_0_34.pool_blocks(6000) == 93 and VLLM_0_34.usable_blocks(6000) == 92
    assert VLLM_0_34.watermark_blocks(6000) == 0  # off by default


def test_v0_13_blocks_hold_16_tokens():
    assert VLLM_0_13.block_size == 16  # CudaPlatform's default for dense models
    assert [VLLM_0_13.blocks_for(t) for t in (0, 1, 16, 17, 250, 256, 257)] == [0, 1, 1, 2, 16, 16, 17]
    assert VLLM_0_13.pool_blocks(6000) == 375 and VLLM_0_13.usable_blocks(6000) == 374
    assert VLLM_0_13.usable_blocks(CAPACITY) == 19 and VLLM_0_13.watermark_blocks(6000) == 0  # v0.13 has none
    assert (VLLM_0_13.blocks_for(np.array([0, 15, 16, 17])) == [0, 1, 1, 2]).all()  # check_fits passes arrays


def test_every_vllm_admission_has_its_versions_rules():
    assert set(vllm_admission.RULES) == set(VLLM_ADMISSIONS)


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
    # 0.34.0: the budget (here 64 tokens, less than the sequence) changes nothing
    assert VLLM_0_34.admits(128, 64, 2, 0, True) and not VLLM_0_34.admits(129, 64, 2, 0, True)
    assert not VLLM_0_34.admits(128, 64, 2, 1, True) and VLLM_0_34.admits(128, 64, 2, 1, False)


def test_v0_13_admission_needs_only_the_first_chunks_blocks():
    # 250 tokens fill 16 blocks of 16; with 63 tokens of budget left the first chunk fills 4
    assert VLLM_0_13.admits(250, 63, 4, 0, True) and not VLLM_0_13.admits(250, 63, 3, 0, True)
    assert VLLM_0_13.admits(250, 64, 4, 0, True) and not VLLM_0_13.admits(250, 65, 4, 0, True)
    assert VLLM_0_13.admits(20, 8192, 2, 0, True) and not VLLM_0_13.admits(20, 8192, 1, 0, True)  # all of it
    # the same request at 0.34.0's 64 tokens a block: its whole sequence's 4 blocks
    assert not VLLM_0_34.admits(250, 63, 3, 0, True) and VLLM_0_34.admits(250, 63, 4, 0, True)


@pytest.mark.parametrize("rules", [VLLM_0_34, VLLM_0_13], ids=lambda rules: rules.version)
def test_decode_steps_that_fit_are_the_step_by_step_count(rules):
    rng = np.random.default_rng(0)
    for _ in range(2000):
        tokens = [int(t) for t in rng.integers(1, 400, int(rng.integers(1, 8)))]
        total = sum(rules.blocks_for(t) for t in tokens) + int(rng.integers(0, 20))
        steps = 0
        while sum(rules.blocks_for(t + steps) for t in tokens) <= total:
            steps += 1
        assert vllm_admission.decode_steps_that_fit(tokens, total, rules.block_size) == steps, (tokens, total)


# --- one instance of 4 usable blocks, step by step -----------------------------------------------


def run_one_instance(monkeypatch, requests: List[Tuple[float, int, int]], chunk: int = 8192, admission: str = "vllm"):
    """Run (arrival s, prompt, output) requests on one vLLM instance of CAPACITY tokens (0.34.0: 4 usable
    blocks) and a step budget of ``chunk`` tokens; the result, the steps it ran and a log of (step,
    event, request, tokens): admitted with the tokens it computes, preempted with the tokens it had
    generated (or, still prefilling, computed), joined the decode batch with the tokens it has."""
    log = []
    take_head, retract, preempt_prefill, start_decoding = (
        VLLMScheduler._take_head, VLLMScheduler._retract, VLLMScheduler._preempt_prefill, VLLMScheduler._start_decoding)

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
        monkeypatch.setattr(VLLMScheduler, name, logged)
    arrivals, inputs, outputs = (np.array(column) for column in zip(*requests))
    trace = Trace("hand", [str(i) for i in range(len(requests))], arrivals, inputs, outputs)
    cluster = cluster_config_from_dict({"mode": "colocated", "instances": 1, "max_new_tokens": 1, "max_running_requests": 8,
                                        "chunked_prefill_size": chunk, "kv_capacity_tokens": CAPACITY,
                                        "kv_admission": admission}, "test")
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


# --- v0.13 on the same 320 tokens: 19 usable blocks of 16 -----------------------------------------


def events(log):
    """A log's (step, event, request), without the tokens."""
    return [(step, event, index) for step, event, index, _ in log]


def test_v0_13_admits_a_prompt_once_its_first_chunk_fits(monkeypatch):
    # 64 tokens a step. A: 128 tokens of prompt, 3 out; B: 200 tokens of prompt, 2 out
    requests = [(0.0, 128, 3), (0.0, 200, 2)]
    _, steps, log = run_one_instance(monkeypatch, requests, chunk=64)
    # 0.34.0: B's whole sequence takes all 4 blocks; A holds 3 from step 2 until it finishes at step 3.
    # B then computes its prompt in 4 steps
    assert events(log) == [(0, "admitted", A), (2, "joined", A), (4, "admitted", B), (8, "joined", B)]
    assert steps == 9
    _, steps, log = run_one_instance(monkeypatch, requests, chunk=64, admission="vllm-0.13")
    assert log == [
        (0, "admitted", A, 128),  # 4 blocks for its first 64 tokens, then 8 in all
        (2, "joined", A, 1),
        # A's token 129 takes a 9th block, 10 are left: B's first chunk, 63 tokens, fits 4 (its 200 need 13)
        (2, "admitted", B, 200),
        # B's chunks of 63 and 64 fit beside A (9 blocks) until A finishes at step 3, then its last 10
        (6, "joined", B, 1),
    ]
    assert steps == 7


def test_v0_13_preempts_a_prompt_again_and_again_while_its_whole_sequence_does_not_fit(monkeypatch):
    # 128 tokens a step. A: 64 tokens of prompt, 10 out; B: 250 tokens of prompt (16 blocks), 2 out
    requests = [(0.0, 64, 10), (0.0, 250, 2)]
    result, steps, log = run_one_instance(monkeypatch, requests, chunk=128)
    # 0.34.0: B's 4 blocks are free only once A finishes, at step 9 (A holds 2 blocks until then)
    assert events(log) == [(0, "admitted", A), (1, "joined", A), (10, "admitted", B), (12, "joined", B)]
    assert result.retractions.tolist() == [0, 0] and steps == 13
    result, steps, log = run_one_instance(monkeypatch, requests, chunk=128, admission="vllm-0.13")
    # v0.13: B, first seen at step 1, computes 127 tokens (8 blocks) beside A's 5 blocks; at step 2 its
    # other 123 need 16 blocks in all: B, the last, preempts itself. Its first 127 would fit the 14
    # blocks left, but a step that preempted admits none: re-admitted at step 3, preempted at step 4
    # as at step 2, and so on until A finishes at step 9
    thrash = [event for step in (1, 3, 5, 7) for event in [(step, "admitted", B, 250),
                                                            (step + 1, "preempted prefilling", B, 127)]]
    assert log == [(0, "admitted", A, 64), (1, "joined", A, 1), *thrash, (9, "admitted", B, 250), (11, "joined", B, 1)]
    assert result.retractions.tolist() == [0, 4] and steps == 12


@pytest.mark.parametrize("admission", ["vllm", "vllm-0.13"])
def test_vllm_admission_is_refused_where_it_is_not_modelled(admission):
    with pytest.raises(OutletsError, match=f"kv_admission {admission} models vLLM's Scheduler on colocated.*set mode"):
        cluster_config_from_dict({"mode": "disaggregated", "kv_admission": admission}, "test")
    with pytest.raises(OutletsError, match="max_num_seqs.*lower max_running_requests or raise chunked_prefill_size"):
        cluster_config_from_dict({"mode": "colocated", "kv_admission": admission, "max_running_requests": 512,
                                  "chunked_prefill_size": 256}, "test")
    cluster = cluster_config_from_dict({"mode": "colocated", "kv_admission": admission}, "test")
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


def run_fcfs(trace: Trace, cluster, routing: str = "round-robin"):
    return Simulation(trace, [None] * len(trace.ids), cluster, Policy(routing_policy(routing), queue_policy("fcfs")),
                      SchedulingConfig()).run()


@pytest.mark.parametrize("admission", ["vllm", "vllm-0.13"])
@pytest.mark.parametrize("routing", ["round-robin", "least-requests", "least-predicted-work"])
def test_every_request_finishes_under_vllm_admission_in_a_cache_that_binds(routing, admission):
    result = run_fcfs(binding_trace(), binding_cluster(admission), routing)
    assert np.isfinite(result.finish_times).all() and (result.finish_times >= result.first_token_times).all()
    assert result.retractions.sum() > 0  # nothing reserved ahead: the cache overflows and vLLM preempts


def test_v0_13_preempts_far_more_than_0_34_where_prompts_span_several_chunks():
    # 60 requests in 2 s on one instance of 8,000 tokens, prompts of 500-3,000 tokens in chunks of 512:
    # v0.13 admits a prompt on its first chunk and preempts it when its later chunks do not fit (2,097
    # times when written, to 0.34.0's 12). Where prompts are short, v0.13's finer blocks waste less and
    # it can preempt less (the binding trace above under round robin: 90 times to 0.34.0's 106).
    rng = np.random.default_rng(0)
    trace = Trace("long prompts", [str(i) for i in range(60)], np.sort(rng.uniform(0.0, 2.0, 60)),
                  rng.integers(500, 3000, 60), rng.integers(50, 800, 60))
    preemptions = {}
    for admission in ("vllm", "vllm-0.13"):
        cluster = cluster_config_from_dict({"mode": "colocated", "instances": 1, "kv_capacity_tokens": 8000,
                                            "max_new_tokens": 1, "chunked_prefill_size": 512,
                                            "max_running_requests": 32, "kv_admission": admission}, "test")
        result = run_fcfs(trace, cluster)
        assert np.isfinite(result.finish_times).all()
        preemptions[admission] = int(result.retractions.sum())
    assert preemptions["vllm-0.13"] > 10 * max(preemptions["vllm"], 1)


def test_outlets_simulate_reads_vllm_0_13_from_the_cluster_config(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": i * 0.05, "input_length": 200 + i * 97 % 900,
                                         "output_length": 5 + i * 37 % 300, "id": f"r{i}"}) + "\n" for i in range(40)))
    config = tmp_path / "cluster.yaml"
    config.write_text("mode: colocated\ninstances: 1\nkv_admission: vllm-0.13\nkv_capacity_tokens: 4000\n")
    out = tmp_path / "out"
    assert main(["simulate", "--trace", str(trace), "--config", str(config), "--output", str(out), "--routing",
                 "round-robin", "--queue", "fcfs", "--no-controlled-study"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["cluster"]["kv_admission"] == "vllm-0.13"
    assert [run["metrics"]["all"]["requests"] for run in summary["runs"]] == [40]
