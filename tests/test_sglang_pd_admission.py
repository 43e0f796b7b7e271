"""``kv_admission: sglang`` on a disaggregated decode instance decides as SGLang 0.5.23's decode instance does
(serve environment: ``.venv-serve``).

SGLang's own ``DecodePreallocQueue`` decides here, on a real KV allocator, request-to-token pool, (disabled)
radix cache and running batch: ``pop_preallocated`` pre-allocates transferred prompts, ``resume_retracted_reqs``
resumes retracted requests. Stand-ins only where a network or a device copy would be: the KV receiver (the
handshake is done, ``send_metadata`` records nothing), the handshake and pending-request polls, and the copy of
a retracted request's KV back from its host backup (``restore_kv_cache``). The simulator runs a trace on one
decode instance; every admission round it made is given, in the same state, to SGLang's queue, which must
resume and pre-allocate the same requests.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import List

import numpy as np
import pytest

pytest.importorskip("sglang", reason="SGLang tests run in the serve environment (make test)")

from specforge_outlets.scheduling import NUM_RESERVED_DECODE_TOKENS, SchedulingConfig  # noqa: E402
from specforge_outlets.serving.trace import Trace  # noqa: E402
from specforge_outlets.simulation.cluster import cluster_config_from_dict  # noqa: E402
from specforge_outlets.simulation.engine import Policy, Simulation  # noqa: E402
from specforge_outlets.simulation.request import SimRequest  # noqa: E402
from specforge_outlets.simulation.schedulers import SGLangDecodeScheduler  # noqa: E402
from specforge_outlets.simulation.sglang_peers import queue_policy, routing_policy  # noqa: E402
from tests.test_sglang_admission import (  # noqa: E402,F401
    CAPACITY,
    Held,
    engine_in_state,
    running_batch,
    sglang_pools,
    sglang_req,
)

MAX_NEW_TOKENS = 2000


class Receiver:
    """The KV receiver once the handshake is done: SGLang sends it the pre-allocated indices."""

    def send_metadata(self, *args, **kwargs) -> None:
        pass


def prealloc_queue(pools, running: List[Held], monkeypatch, capacity: int = CAPACITY):
    """SGLang's ``DecodePreallocQueue`` over the pools (``capacity`` tokens of them), with ``running`` in the decode
    batch and nothing in transfer."""
    from sglang.srt.disaggregation import decode
    from sglang.srt.disaggregation.utils import ReqToMetadataIdxAllocator

    allocator, rows, cache = pools
    batch = running_batch(pools, running)
    allocator.alloc(CAPACITY - capacity)  # the rest of SGLang's pool held elsewhere
    queue = object.__new__(decode.DecodePreallocQueue)  # its __init__ connects a KV transfer engine
    queue.req_to_token_pool, queue.token_to_kv_pool_allocator, queue.tree_cache = rows, allocator, cache
    queue.token_to_kv_pool = allocator.get_kvcache()
    queue.req_to_metadata_buffer_idx_allocator = ReqToMetadataIdxAllocator(64)
    queue.num_reserved_decode_tokens = NUM_RESERVED_DECODE_TOKENS
    queue.scheduler = SimpleNamespace(
        running_batch=batch, waiting_queue=[], last_batch=None, enable_priority_scheduling=False,
        enable_hisparse=False, enable_lora=False, enable_decode_hicache=False, enable_overlap=False,
        tp_worker=SimpleNamespace(is_hybrid_swa=False))
    queue.transfer_queue = SimpleNamespace(queue=[], enable_staging=False)
    queue.kv_manager = SimpleNamespace(kv_args=SimpleNamespace(state_types=[]))
    queue.queue, queue.retracted_queue, queue.pending_reqs = [], [], []
    queue.pp_size, queue._num_published_destinations = 1, 0
    queue._resolve_pending_reqs = lambda: None  # the bootstrap-address and handshake polls (network)
    queue._update_handshake_waiters = lambda *args: None
    monkeypatch.setattr(decode, "restore_kv_cache", lambda *args: None)  # the host backup's copy to the device
    return queue


def sglang_decode_round(pools, running: List[Held], retracted: List[Held], waiting: List[Held], monkeypatch,
                        capacity: int = CAPACITY):
    """How many retracted requests SGLang's decode instance resumes and how many transferred prompts it
    pre-allocates in one iteration (``process_decode_queue``: no pre-allocation while a retracted request waits)."""
    from sglang.srt.disaggregation.decode import DecodeRequest

    queue = prealloc_queue(pools, running, monkeypatch, capacity)
    queue.retracted_queue = [sglang_req(held) for held in retracted]
    resumed = queue.resume_retracted_reqs()
    if queue.retracted_queue:
        return len(resumed), 0
    queue.scheduler.waiting_queue.extend(resumed)  # active, not yet in the running batch
    queue.queue = [DecodeRequest(sglang_req(held), Receiver(), waiting_for_input=True) for held in waiting]
    preallocated, failed = queue.pop_preallocated()
    assert not failed
    return len(resumed), len(preallocated)


def held_of(engine: SGLangDecodeScheduler, request, running: bool) -> Held:
    """A request as SGLang's decode instance holds it: running, retracted, or a prompt not yet prefilled."""
    generated = (1 + engine.steps_done - request.join_step) if running else request.num_generated_tokens
    return Held(str(request.index), request.input_len, generated, engine._max_new_tokens(request))


class Recorder:
    """Every admission round of the simulator's decode instances, with the state it was made in."""

    def __init__(self, monkeypatch) -> None:
        self.rounds = []
        original = SGLangDecodeScheduler._prealloc_round
        recorder = self

        def recorded(engine, now):
            running = [held_of(engine, r, True) for r in engine.running.values()]
            retracted = [held_of(engine, r, False) for r in engine.retracted]
            # transferred prompts as SGLang pre-allocates them: before their prefill, no output yet
            waiting = [Held(h.rid, h.prompt, 0, h.max_new) for h in
                       (held_of(engine, r, False) for r in sorted(engine.queue, key=lambda r: r.enqueue_time))]
            sizes = len(engine.retracted), len(engine.queue)
            original(engine, now)
            if retracted or waiting:
                recorder.rounds.append((running, retracted, waiting, sizes[0] - len(engine.retracted),
                                        sizes[1] - len(engine.queue)))

        monkeypatch.setattr(SGLangDecodeScheduler, "_prealloc_round", recorded)


@pytest.fixture(scope="module")
def pd_trace():
    """Requests that overfill a decode instance: long outputs outgrow the 512 tokens reserved for each."""
    rng = np.random.default_rng(7)
    count = 150
    arrivals = np.sort(rng.uniform(0.0, 3.0, size=count))
    inputs = rng.integers(50, 900, size=count)
    outputs = np.where(rng.random(count) < 0.5, rng.integers(600, 1500, size=count),
                       rng.integers(5, 120, size=count))
    return Trace("pd", [str(i) for i in range(count)], arrivals, inputs, outputs)


def test_every_admission_round_of_a_decode_instance_is_sglangs(sglang_pools, pd_trace, monkeypatch):
    recorder = Recorder(monkeypatch)
    cluster = cluster_config_from_dict({"mode": "disaggregated", "prefill_instances": 1, "decode_instances": 1,
                                        "kv_capacity_tokens": CAPACITY, "max_new_tokens": MAX_NEW_TOKENS,
                                        "kv_admission": "sglang"}, "test")
    result = Simulation(pd_trace, [None] * len(pd_trace), cluster, Policy(routing_policy("round-robin"),
                        queue_policy("fcfs")), SchedulingConfig()).run()
    assert np.isfinite(result.finish_times).all() and result.retractions.sum() > 0
    rounds = recorder.rounds
    assert len(rounds) > 50
    assert any(0 < admitted < len(waiting) for _, _, waiting, _, admitted in rounds)  # stopped inside the queue
    assert any(admitted > 1 for *_, admitted in rounds)
    assert any(resumed for *_, resumed, _ in rounds) and any(  # a retracted request waits, and holds back the rest
        retracted and waiting and not admitted for _, retracted, waiting, _, admitted in rounds)
    for running, retracted, waiting, resumed, admitted in rounds:
        assert (resumed, admitted) == sglang_decode_round(sglang_pools, running, retracted, waiting, monkeypatch), (
            running, retracted, waiting)


def test_decode_admission_at_a_token_either_side_of_the_threshold_is_sglangs(sglang_pools, monkeypatch):
    """Random states on caches a token apart around the first decision's edge: a retracted request's resumption
    (its KV + R against R per active request), or a prompt's pre-allocation (the larger of prompt + R and its
    prompt + max_new_tokens beyond the retractable KV, against the larger of R per active request and the
    running requests' largest own need)."""
    rng = np.random.default_rng(3)
    reserved, compared, flips = NUM_RESERVED_DECODE_TOKENS, 0, 0
    for case in range(40):
        limits = rng.choice([600, 2000, 5000], size=int(rng.integers(0, 5)))  # 5000: above SGLang's clip of 4096
        running = [Held(str(i), int(rng.integers(20, 900)), int(rng.integers(1, min(limit, 1500))), int(limit))
                   for i, limit in enumerate(limits)]
        retracted = [Held("9", int(rng.integers(20, 400)), int(rng.integers(1, 300)), 2000)] if case % 4 == 0 else []
        waiting = [Held(str(10 + i), int(rng.integers(20, 900)), 0, int(rng.choice([600, 2000, 5000])))
                   for i in range(3)]
        held = sum(h.prompt + h.generated - 1 for h in running)
        retractable = held + len(running)
        if retracted:
            first = retracted[0].prompt + retracted[0].generated - 1 + reserved
            edge = held + reserved * len(running) + first
        else:
            need_single = max((h.prompt + min(h.max_new, 4096) for h in running), default=retractable) - retractable
            first = max(waiting[0].prompt + reserved, waiting[0].prompt + min(waiting[0].max_new, 4096) - retractable)
            edge = held + max(reserved * len(running), need_single) + first
        if edge + 3 > CAPACITY:
            continue
        decisions = set()
        for capacity in range(edge - 2, edge + 3):
            engine = engine_in_state(capacity, running, [], 0.5, mode="disaggregated")
            for h in retracted:
                request = SimRequest(int(h.rid), 0.0, h.prompt, h.max_new, None, 0)
                request.num_generated_tokens, request.retractions = h.generated, 1
                engine.retracted.append(request)
            for h in waiting:
                engine.queue.add_request(SimRequest(int(h.rid), 0.0, h.prompt, h.max_new, None, 0))
            engine._prealloc_round(0.0)
            ours = (len(retracted) - len(engine.retracted), len(waiting) - len(engine.queue))
            expected = sglang_decode_round(sglang_pools, running, retracted, waiting, monkeypatch, capacity)
            assert ours == expected, (capacity, running, retracted, waiting)
            decisions.add(ours)
            compared += 1
        flips += len(decisions) > 1
    assert compared >= 100 and flips >= 20  # the sweeps cross the threshold
