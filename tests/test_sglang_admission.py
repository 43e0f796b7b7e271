"""``kv_admission: sglang`` decides as SGLang 0.5.23 does, and ``predicted`` on a colocated instance as
SGLang with the plugin's KV admission by prediction does (serve environment: ``.venv-serve``).

SGLang's own classes decide here, on a real KV allocator, request-to-token pool and (disabled) radix
cache: ``PrefillAdder.add_one_req`` admits, ``ScheduleBatch.retract_decode`` retracts and re-estimates
the ratio, ``NewTokenRatioTracker`` decays it; for ``predicted``, with the plugin's two hooks
(``sglang_patches.kv_admission``) around ``PrefillAdder``. The simulator runs a trace; at every
admission round and every retraction it made, the same requests and cache state are given to
SGLang's code, which must make the same decision.
"""

from __future__ import annotations

import copy
import inspect
import os
from array import array
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np
import pytest

pytest.importorskip("sglang", reason="SGLang tests run in the serve environment (make test)")

from specforge_outlets.scheduling import (  # noqa: E402
    KVRequest,
    LengthPrediction,
    OutputLengthHistory,
    PeakAdmission,
    SchedulingConfig,
    SGLangAdmission,
    admission_need,
    future_peak,
)
from specforge_outlets.serving.trace import Trace  # noqa: E402
from specforge_outlets.simulation import sglang_admission  # noqa: E402
from specforge_outlets.simulation.cluster import cluster_config_from_dict  # noqa: E402
from specforge_outlets.simulation.engine import Policy, Simulation  # noqa: E402
from specforge_outlets.simulation.schedulers import SGLangColocatedScheduler, Scheduler  # noqa: E402
from specforge_outlets.simulation.schedulers.base import predicted_output_len  # noqa: E402
from specforge_outlets.simulation.sglang_peers import queue_policy, routing_policy  # noqa: E402

CAPACITY = 6000  # KV tokens of the simulated instance and of SGLang's allocator
MAX_NEW_TOKENS = 600
KV_MARGIN = 0.2  # the plugin's --outlets-kv-margin (its default, read by the charge) and the simulator's kv_margin


@dataclass(frozen=True)
class Held:
    """A request as both sides see it: prompt tokens, output tokens so far, max_new_tokens, predicted output
    length, arrival time and retractions so far (the last three: what the plugin's orders read)."""

    rid: str
    prompt: int
    generated: int
    max_new: int
    predicted_output_len: Optional[float] = None
    arrival: float = 0.0
    retractions: int = 0


@pytest.fixture(scope="module")
def sglang_pools():
    """SGLang's KV allocator, request-to-token pool and radix cache (disabled), as a CPU server builds them."""
    import torch
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    publish(ServerArgs(model_path="dummy", device="cpu", attention_backend="torch_native", disable_radix_cache=True),
            role="test", ranks=SpawnRanks(world_rank=0))
    allocator = TokenToKVPoolAllocator(CAPACITY, torch.float16, "cpu", None, False)
    rows = ReqToTokenPool(size=64, max_context_len=16384, device="cpu", enable_memory_saver=False)
    cache = UnifiedRadixCache(CacheInitParams(disable=True, req_to_token_pool=rows, token_to_kv_pool_allocator=allocator,
                                              page_size=1, tree_components=(ComponentType.FULL,)))
    yield allocator, rows, cache
    reset_context()


def sglang_req(held: Held):
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    params = SamplingParams(max_new_tokens=held.max_new)
    params.normalize(None)
    req = Req(held.rid, "", array("q", [1] * held.prompt), params)
    req.output_ids.extend([2] * held.generated)
    req.retraction_count = held.retractions
    from sglang_patches import predictions

    predictions.record(req).arrival = held.arrival
    if held.predicted_output_len is not None:
        predictions.set_predicted_output_len(req, held.predicted_output_len, "external")
    return req


@pytest.fixture
def plugin_kv_admission(monkeypatch):
    """The plugin's KV charge by prediction around SGLang's ``PrefillAdder`` and its retraction order
    around ``ScheduleBatch``, as ``--schedule-policy outlets --outlets-kv-admission predicted --outlets-kv-margin
    KV_MARGIN`` installs them."""
    yield from plugin_hooks(monkeypatch, {"OUTLETS_KV_ADMISSION": "predicted", "OUTLETS_KV_MARGIN": str(KV_MARGIN)})


@pytest.fixture
def plugin_peak_admission(monkeypatch):
    """The plugin's KV admission by the predicted future peak (``--outlets-kv-admission peak``)."""
    yield from plugin_hooks(monkeypatch, {"OUTLETS_KV_ADMISSION": "peak"})


def plugin_hooks(monkeypatch, settings: dict):
    """Install the plugin's two PrefillAdder hooks and its retraction order with the ``OUTLETS_*`` ``settings``."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.schedule_policy import PrefillAdder
    from sglang_patches import kv_admission, ordering, state
    for name in [name for name in os.environ if name.startswith("OUTLETS_")]:  # left by another test's CLI parse
        monkeypatch.delenv(name)
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    state.reset_settings()
    monkeypatch.setattr(state.PLUGIN, "output_lengths", OutputLengthHistory())  # nor another test's lengths
    monkeypatch.setattr(state, "schedule_policy_is_outlets", lambda: True)
    # SGLang's own functions, unwrapped where another test applied the plugin's registry for good
    # (its hooks would then run twice, and the peak round's bookkeeping count each request twice)
    offset, add_one_req = (inspect.unwrap(PrefillAdder._get_running_request_total_token_offset),
                           inspect.unwrap(PrefillAdder.add_one_req))
    monkeypatch.setattr(PrefillAdder, "_get_running_request_total_token_offset",
                        lambda self, req: kv_admission.running_token_offset_around(offset, self, req))
    monkeypatch.setattr(PrefillAdder, "add_one_req",
                        lambda self, req, *a, **k: kv_admission.add_one_req_around(add_one_req, self, req, *a, **k))
    add_chunked_req = inspect.unwrap(PrefillAdder.add_chunked_req)
    monkeypatch.setattr(PrefillAdder, "add_chunked_req",
                        lambda self, req: kv_admission.add_chunked_req_before(self, req) or add_chunked_req(self, req))
    order = inspect.unwrap(ScheduleBatch._get_decode_retraction_order)
    monkeypatch.setattr(ScheduleBatch, "_get_decode_retraction_order",
                        staticmethod(lambda reqs: ordering.retraction_order_around(order, reqs)))
    yield
    monkeypatch.undo()
    state.reset_settings()


def running_batch(pools, running: List[Held]):
    """SGLang's running batch: each request holds the KV of its prompt and output but the last token."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    allocator, rows, cache = pools
    allocator.clear()
    rows.clear()
    reqs = [sglang_req(held) for held in running]
    for req, held in zip(reqs, running):
        tokens = held.prompt + held.generated - 1
        rows.alloc([req])
        rows.write((req.kv.req_pool_idx, slice(0, tokens)), allocator.alloc(tokens))
        req.kv.kv_committed_len = req.kv.kv_allocated_len = tokens
        req.init_next_round_input(cache)
        req.lock = cache.lock(req.last_node)
    batch = ScheduleBatch(reqs=reqs, req_to_token_pool=rows, token_to_kv_pool_allocator=allocator, tree_cache=cache,
                          spec_algorithm=SpeculativeAlgorithm.NONE, batch_is_full=False)
    return batch


def sglang_round(pools, running: List[Held], waiting: List[Held], ratio: float,
                 capacity: int = CAPACITY) -> Tuple[int, bool]:
    """How many waiting requests SGLang's ``PrefillAdder`` admits on a cache of ``capacity`` tokens, and whether
    the batch is then full.

    The loop is ``Scheduler._get_new_batch_prefill_raw``'s over the waiting queue (the decisions are
    ``add_one_req``'s); no chunk budget, as the simulator's own chunked prefill follows admission.
    """
    from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder

    allocator, _, cache = pools
    batch = running_batch(pools, running)
    allocator.alloc(CAPACITY - capacity)  # the rest of SGLang's pool held elsewhere
    adder = PrefillAdder(1, cache, allocator, batch, ratio, rem_input_tokens=10**9, rem_chunk_tokens=None)
    full = False
    for held in waiting:
        req = sglang_req(held)
        req.init_next_round_input(cache)
        result = adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
        if result != AddReqResult.CONTINUE:
            if result == AddReqResult.NO_TOKEN:
                full = len(adder.can_run_list) > 0 or not batch.is_empty()
            break
    return len(adder.can_run_list), full


def sglang_retraction(pools, running: List[Held], capacity: int = CAPACITY) -> Tuple[List[str], float]:
    """The requests SGLang's ``retract_decode`` retracts (in order) when the next step does not fit in
    ``capacity`` tokens, and the new ratio."""
    batch = running_batch(pools, running)
    pools[0].alloc(CAPACITY - capacity)  # the rest of SGLang's pool held elsewhere
    if batch.check_decode_mem():
        return [], float("nan")
    # filter_batch also slices the batch's device tensors, which a batch that never ran has none of;
    # the decisions are made before it, and only the kept requests matter after it
    batch.filter_batch = lambda keep_indices: setattr(batch, "reqs", [batch.reqs[i] for i in keep_indices])
    retracted, ratio, aborted = batch.retract_decode()
    assert not aborted
    return [req.rid for req in retracted], ratio


# --- the simulator, instrumented where it decides --------------------------------------------------


def held_of(engine: Scheduler, request) -> Held:
    generated = (1 + engine.steps_done - request.join_step) if request.index in engine.running else request.num_generated_tokens
    return Held(str(request.index), request.input_len, generated, engine._max_new_tokens(request),
                predicted_output_len(request.prediction_at(generated)), request.arrival_time, request.retractions)


def held_prediction(held: Held) -> Optional[LengthPrediction]:
    """A held request's prediction as the simulator's request carries it (None: not predicted)."""
    if held.predicted_output_len is None:
        return None
    return LengthPrediction.of_total(held.predicted_output_len, "external")


def pop_order(queue, now: float) -> list:
    """The waiting requests in the order the queue would admit them at ``now`` (a copy is emptied)."""
    queue = copy.deepcopy(queue)
    return [queue.pop_request(now) for _ in range(len(queue))]


class Recorder:
    """Every admission round and retraction the simulator's engines make, with the state they made it in."""

    def __init__(self, monkeypatch) -> None:
        self.rounds, self.retractions = [], []
        self.histories = []  # per round, the output lengths the engine's peak admission had seen (oldest first)
        round_, make_room = SGLangColocatedScheduler._admission_round, SGLangColocatedScheduler._make_room
        recorder = self

        def recorded_round(engine, now):
            # rounds with prompts still prefilling are left out: SGLang charges a prompt it prefills in
            # chunks by its own rule (add_chunked_req), the simulator as it charged the prompt at admission
            compared = bool(engine.queue) and not (engine.batch_is_full and engine.running) and not engine.prefilling
            waiting = len(engine.queue)
            state = ([held_of(engine, r) for r in engine.running.values()],
                     [held_of(engine, r) for r in pop_order(engine.queue, now)], engine.new_token_ratio.current)
            history = list(engine.history)
            round_(engine, now)
            if compared:
                recorder.rounds.append((*state, waiting - len(engine.queue), engine.batch_is_full))
                recorder.histories.append(history)

        def recorded_make_room(engine, now):
            running = [held_of(engine, r) for r in engine.running.values()]
            fits = engine._kv_in_use() + len(engine.running) <= engine.capacity
            kept_before = set(engine.running)
            retracted = make_room(engine, now)
            if not fits and not engine.prefilling:
                gone = [str(index) for index in kept_before - set(engine.running)]
                recorder.retractions.append((running, gone, engine.new_token_ratio.current))
            return retracted

        monkeypatch.setattr(SGLangColocatedScheduler, "_admission_round", recorded_round)
        monkeypatch.setattr(SGLangColocatedScheduler, "_make_room", recorded_make_room)


def margin_read_by(rule: str) -> dict:
    """The cluster's kv_margin where the rule reads it (the plugin's and the simulator's check refuses it elsewhere)."""
    return {"kv_margin": KV_MARGIN} if rule == "predicted" else {}


def run_sglang_admission(trace: Trace, queue: str = "fcfs", predictions: Optional[list] = None,
                         admission: str = "predicted"):
    """The simulator on ``trace``: SGLang's admission, or with ``predictions`` (known on arrival) the plugin's."""
    rule = "sglang" if predictions is None else admission
    cluster = cluster_config_from_dict({"mode": "colocated", "instances": 1, "kv_capacity_tokens": CAPACITY,
                                        "max_new_tokens": MAX_NEW_TOKENS, "chunked_prefill_size": 8192,
                                        "kv_admission": rule, **margin_read_by(rule), "predict_at": "arrival"}, "test")
    policy = Policy(routing_policy("round-robin"), queue_policy(queue))
    return Simulation(trace, predictions or [None] * len(trace), cluster, policy, SchedulingConfig()).run()


@pytest.fixture(scope="module")
def busy_trace():
    """Requests that overfill the cache: SGLang's ratio admits more than fit, so some are retracted."""
    rng = np.random.default_rng(5)
    count = 120
    arrivals = np.sort(rng.uniform(0.0, 2.0, size=count))
    inputs = rng.integers(50, 900, size=count)
    outputs = np.where(rng.random(count) < 0.3, rng.integers(400, 1200, size=count), rng.integers(5, 120, size=count))
    return Trace("busy", [str(i) for i in range(count)], arrivals, inputs, outputs)


@pytest.fixture(scope="module")
def rough_predictions(busy_trace):
    """Predictions from a twentieth to 1.5x each length, a tenth of them missing (charged as SGLang charges)."""
    rng = np.random.default_rng(6)
    factors = rng.uniform(0.05, 1.5, size=len(busy_trace))
    return [None if rng.random() < 0.1 else float(max(1.0, length * factor))
            for length, factor in zip(busy_trace.output_lens, factors)]


@pytest.mark.parametrize("conservativeness,min_factor,decay_steps", [(1.0, 0.14, 600), (0.5, 0.05, 150), (1.6, 0.3, 900)])
def test_the_ratio_is_sglangs_tracker(monkeypatch, conservativeness, min_factor, decay_steps):
    """SGLang's defaults, and the knobs tuned (--schedule-conservativeness and the two environment variables)."""
    from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import NewTokenRatioTracker
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    monkeypatch.setenv("SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR", str(min_factor))
    monkeypatch.setenv("SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS", str(decay_steps))
    publish(ServerArgs(model_path="dummy", device="cpu", schedule_conservativeness=conservativeness), role="test",
            ranks=SpawnRanks(world_rank=0))
    try:
        tracker = NewTokenRatioTracker.from_config()
    finally:
        reset_context()
    ours = sglang_admission.NewTokenRatio.tuned(conservativeness, min_factor, decay_steps)
    assert (ours.init, ours.minimum, ours.decay) == pytest.approx((tracker.init, tracker.min, tracker.decay), abs=0)
    for steps in (1, 7, 250, 400, 3):  # past the minimum too
        for _ in range(steps):
            tracker.decay_step()
        ours.decay_steps(steps)
        assert ours.current == tracker.current


def test_every_admission_round_of_the_simulator_is_sglangs(sglang_pools, busy_trace, monkeypatch):
    recorder = Recorder(monkeypatch)
    result = run_sglang_admission(busy_trace)
    assert np.isfinite(result.finish_times).all()
    assert len(recorder.rounds) > 20 and any(full for *_, full in recorder.rounds)
    assert any(admitted > 1 for *_, admitted, _ in recorder.rounds)  # rounds that admit several
    assert any(0 < admitted < len(waiting) for _, waiting, _, admitted, _ in recorder.rounds)  # and stop inside the queue
    assert any(held.generated for _, waiting, *_ in recorder.rounds for held in waiting)  # retracted ones come back
    for running, waiting, ratio, admitted, full in recorder.rounds:
        assert (admitted, full) == sglang_round(sglang_pools, running, waiting, ratio), (running, waiting, ratio)


def test_every_retraction_of_the_simulator_is_sglangs(sglang_pools, busy_trace, monkeypatch):
    recorder = Recorder(monkeypatch)
    result = run_sglang_admission(busy_trace)
    assert result.retractions.sum() > 0 and recorder.retractions
    for running, gone, ratio in recorder.retractions:
        expected, expected_ratio = sglang_retraction(sglang_pools, running)
        assert sorted(gone) == sorted(expected) and ratio == pytest.approx(expected_ratio, rel=1e-12), running


def test_kv_admission_by_prediction_decides_as_sglang_with_the_plugin(sglang_pools, busy_trace, rough_predictions,
                                                                     plugin_kv_admission, monkeypatch):
    recorder = Recorder(monkeypatch)
    result = run_sglang_admission(busy_trace, "tail-safe", rough_predictions)  # the plugin's order, as it runs
    assert np.isfinite(result.finish_times).all() and result.retractions.sum() > 0
    assert len(recorder.rounds) > 20 and any(0 < admitted < len(waiting) for _, waiting, _, admitted, _ in recorder.rounds)
    assert any(held.predicted_output_len is None for running, *_ in recorder.rounds for held in running)  # SGLang's charge too
    for running, waiting, ratio, admitted, full in recorder.rounds:
        assert (admitted, full) == sglang_round(sglang_pools, running, waiting, ratio), (running, waiting, ratio)
    for running, gone, ratio in recorder.retractions:
        expected, expected_ratio = sglang_retraction(sglang_pools, running)
        assert sorted(gone) == sorted(expected) and ratio == pytest.approx(expected_ratio, rel=1e-12), running


def test_peak_admission_decides_as_sglang_with_the_plugin(sglang_pools, busy_trace, rough_predictions,
                                                         plugin_peak_admission, monkeypatch):
    """The peak's gate in ``add_one_req`` (and its zero charges) on SGLang's rounds, with the output lengths the
    simulated instance had seen finish as the plugin's history; every retraction as SGLang's with the plugin's order."""
    from sglang_patches import state

    recorder = Recorder(monkeypatch)
    result = run_sglang_admission(busy_trace, "tail-safe", rough_predictions, "peak")
    assert np.isfinite(result.finish_times).all() and result.retractions.sum() > 0
    assert len(recorder.rounds) > 20 and any(0 < admitted < len(waiting) for _, waiting, _, admitted, _ in recorder.rounds)
    assert any(held.generated > held.predicted_output_len for running, *_ in recorder.rounds for held in running
               if held.predicted_output_len is not None)  # outlived their predictions: predicted again from the history
    assert len(recorder.histories[-1]) > 20
    for (running, waiting, ratio, admitted, full), lengths in zip(recorder.rounds, recorder.histories):
        history = OutputLengthHistory()
        for length in lengths:
            history.record(length)
        monkeypatch.setattr(state.PLUGIN, "output_lengths", history)
        assert (admitted, full) == sglang_round(sglang_pools, running, waiting, ratio), (running, waiting, lengths)
    for running, gone, ratio in recorder.retractions:
        expected, expected_ratio = sglang_retraction(sglang_pools, running)
        assert sorted(gone) == sorted(expected) and ratio == pytest.approx(expected_ratio, rel=1e-12), running


def test_the_plugin_records_the_output_lengths_of_requests_leaving_their_batch(plugin_peak_admission, monkeypatch):
    from sglang_patches import kv_admission, state

    monkeypatch.setattr(state.PLUGIN, "output_lengths", OutputLengthHistory())
    done, running = sglang_req(Held("a", 10, 7, 100)), sglang_req(Held("b", 10, 3, 100))
    done.finished = lambda: True
    running.finished = lambda: False
    kv_admission.filter_batch_before(type("Batch", (), {"reqs": [done, running]})())
    assert list(state.PLUGIN.output_lengths) == [7]


# --- states at the edges: a token either way of each decision ------------------------------------


def engine_in_state(capacity: int, running: List[Held], waiting: List[Held], ratio: float,
                    admission: str = "sglang", queue: str = "fcfs", mode: str = "colocated") -> Scheduler:
    """A simulated instance (``mode`` disaggregated: a decode instance) holding ``running`` (each ``max_new`` its
    asked max_new_tokens) with ``waiting`` queued."""
    from specforge_outlets.simulation.request import SimRequest

    cluster = cluster_config_from_dict({"mode": mode, "instances": 1, "decode_instances": 1,
                                        "kv_capacity_tokens": capacity, "max_new_tokens": 1, "kv_admission": admission,
                                        **margin_read_by(admission)}, "test")
    empty = Trace("empty", [], np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64))
    engine = Simulation(empty, [], cluster, Policy(routing_policy("round-robin"), queue_policy(queue)),
                        SchedulingConfig()).engines[0]
    engine.steps_done = 10_000
    for held in running:
        # asks max(1, output) = max_new
        request = SimRequest(int(held.rid), held.arrival, held.prompt, held.max_new, held_prediction(held), 0)
        request.reveal_prediction()
        request.retractions = held.retractions
        request.join_step = engine.steps_done - (held.generated - 1)
        request.finish_step = engine.steps_done + held.max_new - held.generated
        engine.running[request.index] = request
        engine.kv_tokens += held.prompt + held.generated
    for held in waiting:
        request = SimRequest(int(held.rid), 0.0, held.prompt, held.max_new, held_prediction(held), 0)
        request.reveal_prediction()
        request.num_generated_tokens = held.generated  # retracted after this many, if any
        request.retractions = int(held.generated > 0)
        request.prefill_left = held.prompt + held.generated
        engine.queue.add_request(request)
    engine.new_token_ratio.current = ratio
    return engine


def random_held(rng, rid: int, running: bool) -> Held:
    max_new = int(rng.choice([50, 300, 900, 5000]))  # 5000: above SGLang's clip of 4096
    generated = int(rng.integers(1, max_new)) if running else int(rng.choice([0, 0, rng.integers(1, 40)]))
    return Held(str(rid), int(rng.integers(20, 400)), generated, max_new)


def test_admission_at_a_token_either_side_of_the_threshold_is_sglangs(sglang_pools):
    allocator = sglang_pools[0]
    rng = np.random.default_rng(0)
    compared = flips = 0
    for case in range(40):
        running = [random_held(rng, i, True) for i in range(int(rng.integers(0, 4)))]
        waiting = [random_held(rng, 10 + i, False) for i in range(3)]
        ratio = float(rng.choice([0.7, 0.5, 0.098, 1.0]))
        held = sum(h.prompt + h.generated - 1 for h in running)
        charged = sum(SGLangAdmission().running_charge(KVRequest(0, h.generated, h.max_new), ratio) for h in running)
        first = admission_need(waiting[0].prompt + waiting[0].generated, waiting[0].max_new, waiting[0].generated)
        edge = held + int(charged) + first  # the capacity at which the first waiting request starts to fit
        if edge + 3 > CAPACITY:
            continue
        decisions = set()
        for capacity in range(edge - 2, edge + 3):
            engine = engine_in_state(capacity, running, waiting, ratio)
            engine._admission_round(0.0)
            ours = (len(waiting) - len(engine.queue), engine.batch_is_full)
            batch = running_batch(sglang_pools, running)  # SGLang's pool of CAPACITY, the rest held elsewhere
            allocator.alloc(CAPACITY - capacity)
            from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder

            adder = PrefillAdder(1, sglang_pools[2], allocator, batch, ratio, rem_input_tokens=10**9, rem_chunk_tokens=None)
            full = False
            for h in waiting:
                req = sglang_req(h)
                req.init_next_round_input(sglang_pools[2])
                result = adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
                if result != AddReqResult.CONTINUE:
                    full = result == AddReqResult.NO_TOKEN and (len(adder.can_run_list) > 0 or not batch.is_empty())
                    break
            assert ours == (len(adder.can_run_list), full), (capacity, running, waiting, ratio)
            decisions.add(ours[0])
            compared += 1
        flips += len(decisions) > 1
    assert compared >= 100 and flips >= 20  # the sweeps cross the threshold


def test_peak_admission_at_a_token_either_side_of_the_threshold_is_the_plugins(sglang_pools, plugin_peak_admission):
    """States whose first waiting request meets the future peak's edge, on caches a token apart: the simulator
    with ``kv_admission: peak`` and SGLang's PrefillAdder with the plugin's hooks admit the same."""
    rng = np.random.default_rng(4)
    peak = PeakAdmission(0.9, SchedulingConfig(), OutputLengthHistory())  # nothing finished yet, on both sides
    compared = flips = 0
    for case in range(40):
        running = [Held(str(i), int(rng.integers(20, 400)), int(rng.integers(1, 200)), 600,
                        float(rng.choice([None, rng.integers(1, 700)]) or 0) or None) for i in range(int(rng.integers(1, 5)))]
        waiting = [Held(str(10 + i), int(rng.integers(20, 400)), int(rng.choice([0, 0, 30])), 600,
                        float(rng.integers(1, 700))) for i in range(3)]
        occupants = [peak.occupant(KVRequest(0, h.generated, h.max_new, h.predicted_output_len, held=h.prompt + h.generated - 1),
                                   True) for h in running]
        first = waiting[0]
        occupants.append(peak.occupant(KVRequest(first.prompt + first.generated, first.generated, first.max_new,
                                                 first.predicted_output_len), False))
        edge = int(np.ceil(future_peak(occupants)))  # the cache from which the first waiting request fits
        if edge + 3 > CAPACITY:
            continue
        decisions = set()
        for capacity in range(edge - 2, edge + 3):
            engine = engine_in_state(capacity, running, waiting, 0.5, admission="peak", queue="fcfs")
            engine._admission_round(0.0)
            ours = (len(waiting) - len(engine.queue), engine.batch_is_full)
            assert ours == sglang_round(sglang_pools, running, waiting, 0.5, capacity), (capacity, running, waiting)
            decisions.add(ours[0])
            compared += 1
        flips += len(decisions) > 1
    assert compared >= 100 and flips >= 20  # the sweeps cross the threshold


def chunked_sglang_req(pools, held: Held, prefilled: int):
    """SGLang's chunked request (``Scheduler.chunked_req``) as a round finds it: the KV of its first ``prefilled``
    prompt tokens in its row (``checkpoint_kv_cache`` moved its ``prefix_len`` there), the rest to prefill."""
    allocator, rows, _ = pools
    req = sglang_req(held)
    rows.alloc([req])
    rows.write((req.kv.req_pool_idx, slice(0, prefilled)), allocator.alloc(prefilled))
    req.kv.kv_committed_len = req.kv.kv_allocated_len = req.prefix_len = prefilled
    req.init_next_round_input()  # as the scheduler does before add_chunked_req
    return req


@pytest.mark.parametrize("chunk_limit", [None, 120])  # its last chunk; a middle one (shortest-prefill-first's limit)
def test_the_peak_counts_the_prompt_sglang_prefills_in_chunks(sglang_pools, plugin_peak_admission, chunk_limit):
    """A prompt being prefilled in chunks holds its prefilled KV, will hold its whole prompt and grows to its
    predicted end (none yet, nothing finished: its max_new_tokens): with it handed to ``add_chunked_req``, the
    plugin's ``add_one_req`` refuses a waiting request exactly when the peak with the chunked one exceeds the
    cache, where without it the same request was admitted."""
    from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder

    allocator, _, cache = sglang_pools
    peak = PeakAdmission(0.9, SchedulingConfig(), OutputLengthHistory())
    running = [Held("0", 300, 10, 600, 110.0)]  # holds 309, 100 steps left
    chunked, prefilled = Held("c", 500, 0, 100), 200  # 200 of a 500-token prompt prefilled, 300 to go
    waiting = Held("w", 150, 0, 600, 90.0)
    running_occupant = peak.occupant(KVRequest(0, 10, 600, 110.0, held=309), True)
    chunked_occupant = peak.occupant(KVRequest(300, 0, 100, held=prefilled), False)
    waiting_occupant = peak.occupant(KVRequest(150, 0, 600, 90.0), False)
    assert (running_occupant, chunked_occupant, waiting_occupant) == ((309, 100), (500, 99), (150, 89))
    # the peak when the waiting request ends, all three then holding 89 tokens more: the cache it needs to fit
    edge = future_peak([running_occupant, chunked_occupant, waiting_occupant])
    assert edge == 309 + 500 + 150 + 3 * 89 == 1226
    # the chunked request left out (its prefilled KV neither free nor counted), the waiting request fitted easily
    assert future_peak([running_occupant, waiting_occupant]) == 309 + 150 + 2 * 89 <= edge - 1 - prefilled

    def round_(capacity: int, hand_chunked: bool):
        batch = running_batch(sglang_pools, running)
        req = chunked_sglang_req(sglang_pools, chunked, prefilled)
        allocator.alloc(CAPACITY - capacity)  # the rest of SGLang's pool held elsewhere
        adder = PrefillAdder(1, cache, allocator, batch, 0.5, rem_input_tokens=10**9, rem_chunk_tokens=4096)
        if hand_chunked:
            adder.chunked_req_limit = chunk_limit
            assert (adder.add_chunked_req(req) is req) == (chunk_limit is not None)  # still chunked after this one
            assert adder.can_run_list == [req]
        w = sglang_req(waiting)
        w.init_next_round_input(cache)
        return adder.add_one_req(w, has_chunked_req=hand_chunked and chunk_limit is not None, truncation_align_size=None)

    edge = int(edge)
    # SGLang's own arithmetic takes the waiting prompt at these caches (its last chunk charged 300 + 1 + 100)
    assert round_(edge, True) == AddReqResult.CONTINUE
    assert round_(edge - 1, True) == AddReqResult.NO_TOKEN  # a token short of the peak with the chunked request
    assert round_(edge - 1, False) == AddReqResult.CONTINUE  # the same cache, the chunked request not in the peak


def test_retraction_with_ties_in_output_tokens_is_sglangs(sglang_pools):
    rng = np.random.default_rng(1)
    for case in range(30):
        count = int(rng.integers(2, 6))
        generated = rng.choice([3, 3, 8], size=count)  # ties in output tokens, and in prompts too
        prompts = rng.choice([100, 100, 250], size=count)
        running = [Held(str(i), int(p), int(g), 2000) for i, (p, g) in enumerate(zip(prompts, generated))]
        held = sum(h.prompt + h.generated - 1 for h in running)
        for short in range(1, 4):  # the next step is short of this many tokens
            capacity = held + count - short
            engine = engine_in_state(capacity, running, [], 0.5)
            engine._make_room(0.0)
            gone = [str(i) for i in range(count) if i not in engine.running]
            allocator = sglang_pools[0]
            batch = running_batch(sglang_pools, running)
            allocator.alloc(CAPACITY - capacity)
            batch.filter_batch = lambda keep_indices, batch=batch: setattr(
                batch, "reqs", [batch.reqs[i] for i in keep_indices])
            retracted, ratio, _ = batch.retract_decode()
            assert sorted(gone) == sorted(r.rid for r in retracted), (running, capacity)
            assert engine.new_token_ratio.current == pytest.approx(ratio, rel=1e-12)


def test_retraction_with_ties_in_the_plugins_order_is_the_plugins(sglang_pools, plugin_kv_admission):
    """Equal keys (prediction, tokens, arrival, retractions): both retract the latest to join first."""
    rng = np.random.default_rng(2)
    retracted_some = 0
    for case in range(30):
        count = int(rng.integers(2, 6))
        generated = rng.choice([3, 3, 8], size=count)
        predicted = rng.choice([None, 40.0, 40.0], size=count)
        running = [Held(str(i), 100, int(g), 2000, p, arrival=0.0) for i, (g, p) in enumerate(zip(generated, predicted))]
        held = sum(h.prompt + h.generated - 1 for h in running)
        for short in range(1, min(count, 3) + 1):  # the next step is short of this many tokens
            capacity = held + count - short
            engine = engine_in_state(capacity, running, [], 0.5, admission="predicted", queue="tail-safe")
            engine._make_room(0.0)
            gone = sorted(str(i) for i in range(count) if i not in engine.running)
            expected, _ = sglang_retraction(sglang_pools, running, capacity)
            assert gone == sorted(expected), (running, capacity)
            retracted_some += bool(gone)
    assert retracted_some > 30
