"""The simulator's KV admission modes beside the plugin's charge: SGLang's own (kv_admission: sglang), the
predicted future peak (peak) and the past-future peak (past-future).

That SGLang decides the same is tested in the serve environment (tests/test_sglang_admission.py);
here: where the mode applies, and that every request of a cache-bound run finishes under every order.
"""

import dataclasses

import numpy as np
import pytest

from specforge_outlets.errors import OutletsError
from specforge_outlets.scheduling import CacheState, DecodePreallocAdmission, KVRequest, SchedulingConfig
from specforge_outlets.simulation import sglang_admission
from specforge_outlets.simulation.cluster import PredictionPoint, cluster_config_from_dict
from specforge_outlets.simulation.engine import Policy, Simulation
from specforge_outlets.simulation.schedulers import SGLangColocatedScheduler, SGLangDecodeScheduler
from specforge_outlets.simulation.predicted_lengths import PredictorKind, predict_lengths
from specforge_outlets.simulation.sglang_peers import queue_policy, routing_policy
from specforge_outlets.serving.trace import Trace
from tests.binding_cache import binding_cluster, binding_trace


def test_a_decode_instance_pre_allocates_a_prompt_while_r_per_active_request_stays_free():
    """SGLang's decode pre-allocation, by hand (R = 512): one running request (prompt 100, 50 output tokens of
    max_new_tokens 1,000: it holds 149, could retract 150 and still needs 1,100 - 150 = 950 of its own)."""
    running = [KVRequest(0, 50, 1000, held=149)]
    admission = DecodePreallocAdmission()
    # a 200-token prompt asks max(200 + 512, 200 + 1000 - 150) = 1050 of free - max(512 x 1, 950)
    assert not admission.open_round(CacheState(1999, running)).admit(KVRequest(200, 0, 1000))
    round_ = admission.open_round(CacheState(2000, running))
    assert round_.admit(KVRequest(200, 0, 1000))
    # then 1800 free, two active: a 10-token prompt asks max(522, 860) of 1800 - max(1024, 950)
    assert not round_.admit(KVRequest(10, 0, 1000))
    assert admission.open_round(CacheState(1800, running, [KVRequest(200, 0, 1000)])).admit(KVRequest(10, 0, 700))
    # a retracted request resumes its 300 tokens of KV when 300 + 512 fit free - 512 x active (no own need)
    assert admission.open_resume_round(CacheState(1324, running)).admit(KVRequest(300, 20, 1000))
    assert not admission.open_resume_round(CacheState(1323, running)).admit(KVRequest(300, 20, 1000))


def test_a_retracted_request_on_a_decode_instance_resumes_before_any_new_prompt_and_computes_nothing_again(monkeypatch):
    """SGLang's decode instance keeps retracted requests aside (their KV in a host backup) and pre-allocates no
    prompt while one waits; the simulated one resumes them without a prefill."""
    cluster = cluster_config_from_dict({"mode": "disaggregated", "decode_instances": 1, "kv_capacity_tokens": 6000,
                                        "max_new_tokens": 2000, "kv_admission": "sglang"}, "test")
    rng = np.random.default_rng(7)  # half the outputs outgrow the 512 tokens reserved for each
    outputs = np.where(rng.random(60) < 0.5, rng.integers(600, 1500, size=60), rng.integers(5, 120, size=60))
    trace = Trace("resume", [str(i) for i in range(60)], np.sort(rng.uniform(0.0, 1.0, size=60)),
                  rng.integers(50, 900, size=60), outputs)
    simulation = Simulation(trace, [None] * 60, cluster, Policy(routing_policy("round-robin"), queue_policy("fcfs")),
                            SchedulingConfig())
    admitted_while_retracted, prefilled = [], []
    take_head, start_segment = SGLangDecodeScheduler._take_head, SGLangDecodeScheduler._start_segment

    def recorded_take_head(self, now, reservation):
        admitted_while_retracted.append(bool(self.retracted))
        return take_head(self, now, reservation)

    def recorded_start_segment(self, now):
        prefilled.append(bool(self.prefilling))
        start_segment(self, now)

    monkeypatch.setattr(SGLangDecodeScheduler, "_take_head", recorded_take_head)
    monkeypatch.setattr(SGLangDecodeScheduler, "_start_segment", recorded_start_segment)
    result = simulation.run()
    assert np.isfinite(result.finish_times).all() and result.retractions.sum() > 0
    assert admitted_while_retracted and not any(admitted_while_retracted) and not any(prefilled)


@pytest.mark.parametrize("queue", ["fcfs", "sjf", "tail-safe", "lof", "shortest-prefill-first", "hrrn"])
def test_every_request_finishes_under_sglang_admission_in_a_cache_that_binds(queue):
    trace, cluster = binding_trace(), binding_cluster("sglang")
    result = Simulation(trace, predict_lengths(PredictorKind.NOISY, trace, 0), cluster,
                        Policy(routing_policy("round-robin"), queue_policy(queue)), SchedulingConfig()).run()
    assert np.isfinite(result.finish_times).all() and (result.finish_times >= result.first_token_times).all()
    assert result.retractions.sum() > 0  # SGLang's ratio admits more than can finish together


def test_sglang_tuned_by_its_ratio_knobs_runs_with_its_ratio():
    """The cluster's knobs reach every instance's ratio; a lower, faster-decaying one admits more, so the run
    retracts at least as often (SGLang's defaults are the cluster's)."""
    trace, policy = binding_trace(), Policy(routing_policy("round-robin"), queue_policy("fcfs"))
    eager = dataclasses.replace(binding_cluster("sglang"), schedule_conservativeness=0.5,
                                min_new_token_ratio_factor=0.05, new_token_ratio_decay_steps=150)
    simulation = Simulation(trace, [None] * len(trace), eager, policy, SchedulingConfig())
    assert all(engine.new_token_ratio == sglang_admission.NewTokenRatio.tuned(0.5, 0.05, 150)
               for engine in simulation.engines)
    default = Simulation(trace, [None] * len(trace), binding_cluster("sglang"), policy, SchedulingConfig()).run()
    assert simulation.run().retractions.sum() >= default.retractions.sum()


def test_the_ratio_knobs_are_sglangs_defaults_unless_tuned():
    assert sglang_admission.NewTokenRatio.tuned(1.0, 0.14, 600) == sglang_admission.NewTokenRatio()
    ratio = sglang_admission.NewTokenRatio.tuned(2.0, 0.05, 150)
    assert (ratio.init, ratio.current, ratio.minimum) == pytest.approx((1.0, 1.0, 0.05))
    with pytest.raises(OutletsError, match="new_token_ratio_decay_steps must be a positive integer"):
        cluster_config_from_dict({"new_token_ratio_decay_steps": 0}, "test")


# --- the predicted future peak (kv_admission: peak) --------------------------------------------------


def run_with_true_lengths(admission: str, queue: str):
    """The binding workload with every request's true length known on arrival (the oracle)."""
    trace = binding_trace()
    cluster = dataclasses.replace(binding_cluster(admission), predict_at=PredictionPoint.ARRIVAL)
    return Simulation(trace, [float(n) for n in trace.output_lens], cluster,
                      Policy(routing_policy("round-robin"), queue_policy(queue)), SchedulingConfig()).run()


@pytest.mark.parametrize("queue", ["fcfs", "sjf", "tail-safe"])
def test_the_peak_with_true_lengths_never_retracts(queue):
    result = run_with_true_lengths("peak", queue)
    assert np.isfinite(result.finish_times).all() and result.retractions.sum() == 0
    assert run_with_true_lengths("sglang", queue).retractions.sum() > 0  # the cache binds: SGLang's ratio retracts


def most_held(occupants) -> int:
    """The most KV held at once over the coming decode steps, step by step: each (h, r) holds h + t at step t <= r."""
    held, steps = np.array(occupants, dtype=np.int64).reshape(-1, 2).T
    t = np.arange(int(steps.max(initial=0)) + 1)
    alive = steps[:, None] >= t[None, :]
    return int(((held[:, None] + t[None, :]) * alive).sum(axis=0).max(initial=0))


def record_peak_rounds(monkeypatch) -> list:
    """Every admission round of the simulator's engines: the cache, what the running, prefilling and waiting
    requests (queue order) hold once prefilled and the decode steps each has left by its true length, the
    free running slots, and how many the round admitted."""
    rounds = []
    admission_round = SGLangColocatedScheduler._admission_round

    def recorded(engine, now):
        steps = engine.steps_done
        running = [(r.input_len + (1 + steps - r.join_step) - 1, r.output_len - (1 + steps - r.join_step))
                   for r in engine.running.values()]
        running += [(r.prefill_claim, r.output_len - r.num_generated_tokens - 1) for r in engine.prefilling]
        waiting = [(r.prefill_left, r.output_len - r.num_generated_tokens - 1) for r in engine.queue]
        slots = engine.max_running - len(engine.running) - len(engine.prefilling)
        asked = bool(engine.queue) and not (engine.batch_is_full and engine.running)
        before = len(engine.queue)
        admission_round(engine, now)
        if asked:
            rounds.append((engine.capacity, running, waiting, slots, before - len(engine.queue)))

    monkeypatch.setattr(SGLangColocatedScheduler, "_admission_round", recorded)
    return rounds


def refusals_that_would_overflow(rounds) -> int:
    """Asserts that every round's admissions never overflow as the true lengths play out, and that one more
    request in queue order would have; how many rounds refused one."""
    refused = 0
    for capacity, running, waiting, slots, admitted in rounds:
        assert most_held(running + waiting[:admitted]) <= capacity
        if admitted < min(len(waiting), slots):
            assert most_held(running + waiting[:admitted + 1]) > capacity, (capacity, running, waiting, admitted)
            refused += 1
    return refused


def test_the_peak_with_true_lengths_admits_the_longest_queue_prefix_that_never_overflows(monkeypatch):
    """At every admission round, what the peak admits never overflows the cache as the true lengths play out,
    and one more request in queue order would: no rule that never retracts admits more at any round."""
    rounds = record_peak_rounds(monkeypatch)
    assert run_with_true_lengths("peak", "fcfs").retractions.sum() == 0
    assert refusals_that_would_overflow(rounds) > 50 and any(admitted > 1 for *_, admitted in rounds)


def test_the_peak_with_true_lengths_is_exact_to_the_token(monkeypatch):
    """A burst on caches a token apart around where its rounds' decisions flip: each admits exactly what fits."""
    rng = np.random.default_rng(3)
    trace = Trace("burst", [str(i) for i in range(6)], np.zeros(6), rng.integers(50, 300, 6), rng.integers(2, 80, 6))
    decisions = set()
    for capacity in range(600, 900):
        rounds = record_peak_rounds(monkeypatch)
        cluster = cluster_config_from_dict({"mode": "colocated", "instances": 1, "kv_capacity_tokens": capacity,
                                            "max_new_tokens": 100, "kv_admission": "peak", "predict_at": "arrival"},
                                           "test")
        result = Simulation(trace, [float(n) for n in trace.output_lens], cluster,
                            Policy(routing_policy("round-robin"), queue_policy("fcfs")), SchedulingConfig()).run()
        assert result.retractions.sum() == 0
        refusals_that_would_overflow(rounds)
        decisions.add(tuple(admitted for *_, admitted in rounds))
        monkeypatch.undo()
    assert len(decisions) >= 5  # the sweep crosses the rounds' thresholds


def test_peak_admission_needs_colocated_instances():
    with pytest.raises(OutletsError, match="kv_admission peak gates SGLang's PrefillAdder.*set mode colocated"):
        cluster_config_from_dict({"mode": "disaggregated", "kv_admission": "peak"}, "test")


@pytest.mark.parametrize("admission", ["peak", "past-future"])
def test_every_request_finishes_under_the_peak_with_rough_predictions_or_none(admission):
    trace = binding_trace()
    result = Simulation(trace, predict_lengths(PredictorKind.NOISY, trace, 0), binding_cluster(admission),
                        Policy(routing_policy("round-robin"), queue_policy("tail-safe")), SchedulingConfig()).run()
    assert np.isfinite(result.finish_times).all() and (result.finish_times >= result.first_token_times).all()
