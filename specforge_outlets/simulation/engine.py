"""Discrete-event simulation of a serving cluster, driven by a trace.

Events are kept in one heap: arrivals, prefill batches ending, KV transfers ending, and decode
segments ending. A decode segment is a run of steps of an unchanged batch, up to the next request
that finishes; its length comes in closed form from the step-time model
(:meth:`StepTimeModel.decode_steps_time`), so the cost is per event, never per token. A request
arriving at a busy instance with room for it cuts the segment at the end of the step in progress,
as continuous batching admits new requests between steps. Each request causes a bounded number of
events (arrival, prefill, transfer, admission cut, finish), so a run costs
O(events * log(events)) plus, for least-predicted-work and power-of-two routing only, one pass over
the running requests of every candidate instance per routing decision, or per load poll for a
router that polls (power-of-two with ``load_poll_interval_s`` > 0: one event per interval while the
cluster has work, as sglang-router's ``LoadMonitor``; its routing decisions read the last poll's).

Queues and routing come from :mod:`specforge_outlets.scheduling`, the code the SGLang plugin uses.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass
from typing import Callable, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

from specforge_outlets.errors import OutletsError
from specforge_outlets.scheduling import (
    CHARGE_ADMISSIONS,
    PREDICTION_ADMISSIONS,
    VLLM_ADMISSIONS,
    Admission,
    CacheState,
    PEAK_ADMISSIONS,
    KVAdmission,
    KVRequest,
    OutputLengthHistory,
    QueuePolicy,
    RankLoad,
    SchedulingConfig,
    create_admission,
    least_requests_rank,
    predicted_remaining,
    rank_load,
    retraction_order_key,
)
from specforge_outlets.simulation import sglang_admission, vllm_admission
from specforge_outlets.simulation.cluster import (
    ClusterConfig,
    ClusterMode,
    PredictionPoint,
    check_kv_admission,
)
from specforge_outlets.simulation.prefill import PrefillInstance
from specforge_outlets.simulation.request import SimRequest
from specforge_outlets.simulation.token_gaps import TokenGapLog
from specforge_outlets.simulation.sglang_peers import (
    AnyQueuePolicy,
    AnyRoutingPolicy,
    PeerQueuePolicy,
    create_peer_or_router,
    create_queue,
)
from specforge_outlets.serving.trace import Trace

# Float slack when deciding whether an arrival falls exactly on a step boundary.
BOUNDARY_TOLERANCE_S = 1e-9


@dataclass(frozen=True)
class Policy:
    """One policy combination under study."""

    routing: AnyRoutingPolicy  # the plugin's routing, or one of SGLang's (sglang_peers.py)
    queue: AnyQueuePolicy  # the plugin's order, or one of SGLang's (sglang_peers.py)

    @property
    def label(self) -> str:
        return f"{self.routing.value}+{self.queue.value}"


@dataclass(frozen=True)
class SimulationResult:
    """Per-request times (s) of one run, in trace order."""

    arrival_times: np.ndarray
    first_token_times: np.ndarray
    finish_times: np.ndarray
    queue_delays: np.ndarray
    output_lens: np.ndarray
    retractions: np.ndarray  # times each request was retracted (KV cache full)
    # where the waiting happened (s): before the prompt's first prefill (the prefill instance's queue,
    # or a colocated instance's before first admission), the KV transfer of PD, and waiting to decode
    # (a decode instance's queue, and every wait after a retraction); they sum to queue_delays + transfer
    prefill_queue_delays: np.ndarray
    transfer_times: np.ndarray
    decode_queue_delays: np.ndarray
    token_gaps: TokenGapLog  # every inter-token gap, for ITL percentiles


class EngineInstance:
    """Continuous batching with a KV budget: a decode instance, or with chunked prefill, a colocated one.

    Steps are counted per instance; a running request's generated tokens are
    ``1 + steps_done - join_step`` (the first token comes from prefill), so advancing a segment
    touches no request.

    KV cache: admission reserves tokens per request (``ClusterConfig.kv_admission``) and admits while
    the reservations and the cache in use both leave room. With reservations below a request's real
    length the cache in use can outgrow them; a decode segment then also ends where the next step
    would overflow, and the instance retracts running requests (``retraction_order_key``: longest
    predicted remaining first, at most ``max_retractions`` times each unless no other is running).
    A retracted request keeps its tokens, goes back to the waiting queue with its original arrival
    time and is recomputed (its prompt and tokens prefilled again) when readmitted.

    The instance acts (it holds the cache, runs the steps and retracts); at each admission round the
    rule's strategy (``scheduling.kv_admission``, ``create_admission``) decides which waiting requests
    fit, from a ``CacheState`` the instance builds, as the plugin's hooks ask the same strategy on SGLang.

    ``kv_admission: sglang`` runs SGLang's own rules instead (:mod:`sglang_admission`): admission
    rounds charge the running requests a decaying share of their remaining ``max_new_tokens``, a
    refused round waits for a running request to leave, a running request holds the KV of its prompt
    and its output but the last token (which the next step writes), and a full cache retracts the
    fewest-generated first (``retraction_order_key`` under the plugin's sjf and tail-safe). On a colocated
    instance, ``predicted`` and ``quantile`` run these rounds too, as the plugin does on SGLang: a
    predicted request is charged its predicted budget (``PredictedChargeAdmission``) where SGLang would
    charge its share of ``max_new_tokens``, whether it runs or is being admitted (after a retraction
    too), so the charge falls as it decodes and stays at the floor once it outlives its prediction.

    ``kv_admission: vllm`` (and ``vllm-0.13``) runs vLLM v1's instead (:mod:`vllm_admission`), one
    ``schedule`` pass at each step boundary (``_vllm_schedule``): the running requests allocate whole
    blocks for the step in running order (the decoding ones, then those prefilling), the last is
    preempted while an allocation fails (one still prefilling included) and goes to the front of the
    queue, and a step that preempted none admits while the whole sequence's blocks (v0.13: its first
    chunk's) are free. A decode segment then runs while every step's blocks fit
    (``decode_steps_that_fit``), one step after a preemption, as vLLM admits again at the next.
    """

    def __init__(self, sim: "Simulation", chunked_prefill_size: int, engine_id: int) -> None:
        self.sim = sim
        self.engine_id = engine_id
        self.model = sim.model
        self.chunked_prefill_size = chunked_prefill_size  # 0: decode only
        self.recompute_chunk = chunked_prefill_size or sim.cluster.chunked_prefill_size  # retracted requests
        self.capacity = sim.cluster.kv_capacity()
        self.max_running = sim.cluster.max_running_requests
        cluster = sim.cluster
        # SGLang's admission rounds (PrefillAdder), its ratio and its retraction check run here: its own
        # charge, or on a colocated instance the plugin's (sglang_patches/kv_admission.py hooks the same rounds)
        self.sglang = cluster.kv_admission in CHARGE_ADMISSIONS and (
            cluster.kv_admission is KVAdmission.SGLANG or cluster.mode is ClusterMode.COLOCATED)
        # a disaggregated decode instance under SGLang's admission: its DecodePreallocQueue admits transferred
        # prompts (DecodePreallocAdmission) and keeps retracted requests aside, resumed from their KV backup
        self.prealloc = self.sglang and not chunked_prefill_size
        self.retracted: Deque[SimRequest] = deque()  # SGLang's retracted_queue, in the order retracted
        # the vLLM version's rules under vLLM's admission, else None
        self.vllm: Optional[vllm_admission.VLLMRules] = vllm_admission.RULES.get(cluster.kv_admission)
        watermark = 0
        if self.vllm:  # read under vLLM's admission only
            self.usable_blocks = self.vllm.usable_blocks(self.capacity)  # vLLM's pool
            watermark = self.vllm.watermark_blocks(self.capacity)
        # the output lengths of the requests that finished here, which the peak admissions read
        self.history = OutputLengthHistory() if cluster.kv_admission in PEAK_ADMISSIONS else None
        # the rule that decides (max-new-tokens has none: every request reserves its full length); on a
        # disaggregated decode instance the plugin's charge sizes a per-request reservation (_reservation)
        self.admission: Optional[Admission] = None if cluster.kv_admission is KVAdmission.MAX_NEW_TOKENS else (
            create_admission(cluster.kv_admission, sim.scheduling, cluster.kv_margin, cluster.kv_quantile,
                             self.vllm, watermark, self.history, decode_only=not chunked_prefill_size))
        # SGLang without --enable-mixed-chunk (its default) runs a prefill batch alone: the decode batch waits
        self.prefill_alone = self.sglang and bool(chunked_prefill_size)
        self.new_token_ratio = sglang_admission.NewTokenRatio.tuned(
            cluster.schedule_conservativeness, cluster.min_new_token_ratio_factor, cluster.new_token_ratio_decay_steps)
        self.batch_is_full = False  # SGLang's running_batch.batch_is_full: no admission until a request leaves
        # SGLang's own retraction order, unless the plugin's order runs (it hooks the retraction order too)
        self.sglang_retraction = not isinstance(sim.policy.queue, QueuePolicy) or sim.policy.queue is QueuePolicy.FCFS
        # SGLang's disaggregated decode instances sort their waiting queue only for the plugin's order
        # (its prebuilt-batch hook); SGLang's own orders leave it FCFS there
        queue = sim.policy.queue
        if not chunked_prefill_size and isinstance(queue, PeerQueuePolicy):
            queue = QueuePolicy.FCFS
        self.queue = create_queue(queue, sim.scheduling, sim.cluster.max_new_tokens)
        self.running: Dict[int, SimRequest] = {}
        self.finish_heap: List[Tuple[int, int, SimRequest]] = []  # (finish step, index, request)
        self.prefilling: Deque[SimRequest] = deque()
        self.incoming = 0  # routed here, not yet in the queue (KV in transfer)
        self.incoming_tokens = 0  # their prompt tokens
        self.pending_work = 0.0  # predicted work of requests not yet decoding
        self.steps_done = 0
        self.kv_tokens = 0  # context tokens of running requests after steps_done steps
        self.kv_prefilling = 0  # tokens held by requests being prefilled or recomputed
        self.kv_reserved = 0
        # The segment in progress.
        self.busy = False
        self.segment_start = 0.0
        self.segment_steps = 0
        self.segment_batch = 0
        self.segment_kv = 0
        self.segment_chunk: List[Tuple[SimRequest, int]] = []  # prefill tokens of a mixed step
        self.segment_version = 0
        self.segment_retracted = False  # whether the segment's first step came after a retraction

    # --- load, as a router sees it -------------------------------------------------------------
    def num_requests(self) -> int:
        return len(self.running) + len(self.prefilling) + len(self.queue) + len(self.retracted) + self.incoming

    def load(self, now: float, with_work: bool, with_tokens: bool = False) -> RankLoad:
        waiting = len(self.prefilling) + len(self.queue) + self.incoming
        if with_tokens:  # SGLang's snapshot: KV in use plus the prompts still to prefill (routed ones too)
            queued = sum(r.input_len + r.num_generated_tokens for r in self.queue) + self.incoming_tokens
            return RankLoad(waiting + len(self.running), 0.0, self.kv_tokens + self.kv_prefilling + queued)
        if not with_work:
            return RankLoad(waiting + len(self.running), 0.0)
        steps = self.steps_done + self._segment_steps_done(now)
        running = ((r.predicted_output_len_at(1 + steps - r.join_step), 1 + steps - r.join_step)
                   for r in self.running.values())
        return rank_load(running, self.sim.scheduling.prior_output_len, RankLoad(waiting, self.pending_work))

    def _segment_steps_done(self, now: float) -> int:
        if not self.busy or self.segment_chunk:
            return 0
        done = self.model.decode_steps_done(now - self.segment_start, self.segment_batch, self.segment_kv)
        return min(done, self.segment_steps)

    # --- requests coming in ---------------------------------------------------------------------
    def add_incoming(self, request: SimRequest) -> None:
        """Count a request routed here; its work is static until it starts decoding."""
        self.incoming += 1
        self.incoming_tokens += request.input_len
        request.pending_work = predicted_remaining(
            request.predicted_output_len_at(request.num_generated_tokens), request.num_generated_tokens,
            self.sim.scheduling.prior_output_len,
        )
        self.pending_work += request.pending_work

    def enqueue(self, now: float, request: SimRequest) -> None:
        self.incoming -= 1
        self.incoming_tokens -= request.input_len
        request.enqueue_time = now
        self.queue.add_request(request)
        if not self.busy:
            self._next_step(now)
        elif self.segment_chunk:
            return  # a mixed step: admission follows at its end
        elif self.sglang and not self.prealloc:
            if not self.batch_is_full:  # SGLang tries an admission round at the next step
                self._cut_segment(now)
        elif self._can_admit_head(now):
            self._cut_segment(now)

    def _reservation(self, request: SimRequest, generated: Optional[int] = None) -> int:
        """KV tokens to reserve for a request with ``generated`` tokens (default: as it is admitted), never
        above its full reservation."""
        generated = request.num_generated_tokens if generated is None else generated
        if (self.sim.cluster.kv_admission is KVAdmission.MAX_NEW_TOKENS or request.predicted_output_len is None
                or request.retractions):
            return request.full_reservation
        # the plugin's charge as a reservation, capped by the cluster's max_new_tokens (not the request's)
        return request.input_len + generated + self.admission.output_budget(KVRequest(
            0, generated, self.sim.cluster.max_new_tokens, request.predicted_output_len_at(generated),
            request.predicted_output_quantiles_at(generated)))

    def _kv_request(self, request: SimRequest, generated: int, held: int = 0, extend: Optional[int] = None
                    ) -> KVRequest:
        """What the admission reads from a request with ``generated`` tokens (its latest predictions), holding
        ``held`` KV tokens, whose prefill adds ``extend`` (by default what it has left to prefill)."""
        return KVRequest(request.prefill_left if extend is None else extend, generated, self._max_new_tokens(request),
                         request.predicted_output_len_at(generated), request.predicted_output_quantiles_at(generated),
                         held=held)

    def _running_kv_request(self, request: SimRequest) -> KVRequest:
        """A decoding request: SGLang's holds its prompt and output but the last token."""
        generated = 1 + self.steps_done - request.join_step
        return self._kv_request(request, generated, request.input_len + generated - 1, 0)

    def _reserved(self, now: float) -> int:
        """KV tokens the admission sees reserved. With dynamic predictions, or a quantile charge, a
        running request's reservation follows its latest estimate (SGLang recomputes the running
        requests' total at every admission, and so does the plugin: a quantile of the remaining
        length given survival grows for the heavy-tailed survivors); otherwise it is the one made
        at admission."""
        admission = self.sim.cluster.kv_admission
        if admission is KVAdmission.MAX_NEW_TOKENS or not (self.sim.dynamic or admission is KVAdmission.QUANTILE):
            return self.kv_reserved
        steps = self.steps_done + self._segment_steps_done(now)
        running = sum(self._reservation(r, 1 + steps - r.join_step) for r in self.running.values())
        return running + sum(r.reservation for r in self.prefilling)

    def _kv_in_use(self) -> int:
        if self.sglang:  # SGLang holds no KV yet for the last token of each running request
            return self.kv_tokens - len(self.running) + self.kv_prefilling
        return self.kv_tokens + self.kv_prefilling

    def _can_admit_head(self, now: float) -> bool:
        if not self.queue or len(self.running) + len(self.prefilling) >= self.max_running:
            return False
        if self.prealloc:  # on the cache as the segment started: a step later it has less room, never more
            head = self.queue.peek_request(now)
            return not self.retracted and self.admission.open_round(self._prealloc_state()).admit(
                self._kv_request(head, head.num_generated_tokens, extend=head.input_len))
        if self.vllm:  # the blocks left at the next boundary once the running requests allocated theirs
            steps = self.steps_done + min(self._steps_to_next_boundary(now), self.segment_steps)
            free = self.usable_blocks - sum(self.vllm.blocks_for(r.input_len + 1 + steps - r.join_step)
                                           for r in self.running.values())
            budget = self.recompute_chunk - len(self.running)  # a decode segment: no prompt takes a chunk
            round_ = self.admission.open_round(CacheState(free, step_tokens=budget, any_running=bool(self.running)))
            return round_.admit(self._kv_request(self.queue.peek_request(now), 0))
        needed = self._reservation(self.queue.peek_request(now))
        # in use: the cache after one more step of the running requests (never above the
        # reservations when every request reserves its full length)
        in_use = self._kv_in_use() + len(self.running)
        return max(self._reserved(now), in_use) + needed <= self.capacity

    def _cut_segment(self, now: float) -> None:
        """End the decode segment after the step in progress, so the new request joins the batch."""
        steps = self._steps_to_next_boundary(now)
        if steps < self.segment_steps:
            self._schedule_segment_end(steps)

    def _steps_to_next_boundary(self, now: float) -> int:
        """Steps of the decode segment in progress done at the end of the step running at ``now``."""
        elapsed = now - self.segment_start - BOUNDARY_TOLERANCE_S  # arriving at a step boundary joins it
        return self.model.decode_steps_done(elapsed, self.segment_batch, self.segment_kv) + 1

    def _next_step(self, now: float) -> None:
        """At a step boundary: admit, retract where the next step does not fit, and start the next segment."""
        if self.vllm:
            self.segment_retracted = self._vllm_schedule(now)
        else:
            self._admit(now)
            # SGLang checks the decode batch's room only before a decode step, none before a prefill batch
            self.segment_retracted = not (self.prefill_alone and self.prefilling) and self._make_room(now)
        self._start_segment(now)

    def _admit(self, now: float) -> None:
        if self.prealloc:
            self._prealloc_round(now)
            return
        if self.sglang:
            self._sglang_round(now)
            return
        while self._can_admit_head(now):
            self._take_head(now, self._reservation(self.queue.peek_request(now)))

    def _take_head(self, now: float, reservation: int) -> SimRequest:
        """Admit the queue's head, reserving ``reservation`` KV tokens for it."""
        request = self.queue.pop_request(now)
        request.queue_delay += now - request.enqueue_time
        if self.chunked_prefill_size and not request.num_generated_tokens:  # colocated, before its first token
            request.prefill_queue_delay += now - request.enqueue_time
        else:
            request.decode_queue_delay += now - request.enqueue_time
        request.reservation = reservation
        self.kv_reserved += request.reservation
        if self.chunked_prefill_size or request.retractions:
            request.prefill_claim = request.prefill_left
            self.kv_prefilling += request.prefill_claim
            self.prefilling.append(request)
        else:
            self._start_decoding(now, request)
        return request

    def _max_new_tokens(self, request: SimRequest) -> int:
        """What the simulated client asks for: the cluster's max_new_tokens, or the output if longer."""
        return max(self.sim.cluster.max_new_tokens, request.output_len)

    def _sglang_round(self, now: float) -> None:
        """One of SGLang's admission rounds (``PrefillAdder``) at a step boundary."""
        if not self.running:
            self.batch_is_full = False  # an empty batch has no request left to leave
        if self.batch_is_full or not self.queue:
            return
        round_ = self.admission.open_round(CacheState(
            self.capacity - self._kv_in_use(),
            [self._running_kv_request(r) for r in self.running.values()],
            [self._kv_request(r, r.num_generated_tokens, r.prefill_claim, 0) for r in self.prefilling],
            self.new_token_ratio.current))
        admitted = 0
        while self.queue:
            if len(self.running) + len(self.prefilling) >= self.max_running:
                self.batch_is_full = True
                return
            head = self.queue.peek_request(now)
            if not round_.admit(self._kv_request(head, head.num_generated_tokens)):
                self.batch_is_full = admitted > 0 or bool(self.running)
                return
            self._take_head(now, 0)
            admitted += 1
            if round_.exhausted:  # nothing left: the round ends, the batch is full
                self.batch_is_full = True
                return

    def _prealloc_state(self) -> CacheState:
        """The cache as SGLang's decode instance sees it."""
        return CacheState(self.capacity - self._kv_in_use(), [self._running_kv_request(r) for r in self.running.values()])

    def _prealloc_round(self, now: float) -> None:
        """A disaggregated decode instance's iteration (SGLang's ``process_decode_queue``): the retracted requests
        resume first, in the order retracted, and while one waits no transferred prompt is admitted; then the
        transferred prompts in queue order, until the first that does not fit (``pop_preallocated``)."""
        resumed: List[KVRequest] = []
        if self.retracted:
            state = self._prealloc_state()
            round_ = self.admission.open_resume_round(state)
            while self.retracted and len(self.running) < self.max_running:
                request = self.retracted[0]
                # it restores its prompt and output but the last token
                kv = self._kv_request(request, request.num_generated_tokens,
                                      extend=request.input_len + request.num_generated_tokens - 1)
                if not round_.admit(kv):
                    break
                self.retracted.popleft()
                resumed.append(kv)
                self._resume(now, request)
            if self.retracted:
                return
            # the resumed requests join the batch at the next step: active here, not running
            state = CacheState(self.capacity - self._kv_in_use(), state.running, resumed)
        else:
            state = self._prealloc_state()
        round_ = self.admission.open_round(state)
        while self.queue and len(self.running) < self.max_running:
            head = self.queue.peek_request(now)
            if not round_.admit(self._kv_request(head, head.num_generated_tokens, extend=head.input_len)):
                return
            self._take_head(now, 0)

    def _resume(self, now: float, request: SimRequest) -> None:
        """A retracted request's KV comes back from its backup (no recomputation) and it decodes again."""
        request.queue_delay += now - request.enqueue_time
        request.decode_queue_delay += now - request.enqueue_time
        request.reservation = 0
        self._start_decoding(now, request)

    def _start_decoding(self, now: float, request: SimRequest) -> None:
        """Join the decode batch with the tokens generated so far (1, the prefill's, unless retracted)."""
        self.sim.token_gaps.joined(self.engine_id, request, now)
        self.pending_work -= request.pending_work
        generated = max(request.num_generated_tokens, 1)
        request.num_generated_tokens = generated
        request.join_step = self.steps_done - (generated - 1)
        request.finish_step = self.steps_done + request.output_len - generated
        self.running[request.index] = request
        self.kv_tokens += request.input_len + generated
        heapq.heappush(self.finish_heap, (request.finish_step, request.index, request))

    def _next_finish_step(self) -> int:
        """Step at which the next running request finishes (drops entries of retracted runs)."""
        while self.finish_heap[0][2].finish_step != self.finish_heap[0][0]:
            heapq.heappop(self.finish_heap)
        return self.finish_heap[0][0]

    def _make_room(self, now: float) -> bool:
        """Retract running requests until every one of them can decode one more token; whether any was.

        Prompts being prefilled hold their whole claim, so a lone running request can be retracted
        too (alone it always fits: ``check_fits``). With SGLang's admission the ratio is then
        re-estimated from the requests left running, and admission opens again.
        """
        retracted = False
        while self.running and self._kv_in_use() + len(self.running) > self.capacity:
            self._retract(now, self._retraction_victim())
            retracted = True
        if retracted and self.sglang:
            self.new_token_ratio.after_retraction(
                (1 + self.steps_done - r.join_step, self._max_new_tokens(r)) for r in self.running.values())
            self.batch_is_full = False
        return retracted

    def _reserve_again(self, request: SimRequest) -> None:
        """Re-size a reservation once the prediction is known (colocated: it comes with the first token)."""
        if self.sglang or self.vllm:
            return  # the engines' own admissions read no prediction
        reservation = self._reservation(request)
        self.kv_reserved += reservation - request.reservation
        request.reservation = reservation

    def _retraction_victim(self) -> SimRequest:
        if self.sglang and self.sglang_retraction:
            # min takes the first of equal keys: reversed, the latest to join (SGLang's stable sort, popped from the end)
            return min(reversed(self.running.values()), key=lambda r: sglang_admission.retraction_victim_key(
                1 + self.steps_done - r.join_step, r.input_len))
        config = self.sim.scheduling
        # max takes the first of equal keys: reversed, the latest to join (the plugin's stable sort, popped from the end)
        return max(reversed(self.running.values()), key=lambda r: retraction_order_key(
            r.predicted_output_len_at(1 + self.steps_done - r.join_step), 1 + self.steps_done - r.join_step,
            r.arrival_time, r.retractions, config))

    def _retract(self, now: float, request: SimRequest) -> None:
        generated = 1 + self.steps_done - request.join_step
        del self.running[request.index]
        self.sim.token_gaps.left(self.engine_id, request, now)
        request.finish_step = -1
        self.kv_tokens -= request.input_len + generated
        self.kv_reserved -= request.reservation
        request.num_generated_tokens = generated
        # the waiting queue orders by the latest
        request.predicted_output_len = request.predicted_output_len_at(generated)
        request.predicted_output_quantiles = request.predicted_output_quantiles_at(generated)
        request.retractions += 1
        request.prefill_left = request.input_len + generated  # recomputed when readmitted
        request.pending_work = predicted_remaining(
            request.predicted_output_len_at(generated), generated, self.sim.scheduling.prior_output_len
        )
        self.pending_work += request.pending_work
        self._requeue(now, request)

    def _requeue(self, now: float, request: SimRequest) -> None:
        """A retracted request waits again: vLLM puts it at the front of the queue, the others by the queue's rule."""
        request.enqueue_time = now
        if self.prealloc:
            self.retracted.append(request)
        elif self.vllm:
            self.queue.prepend_request(request)
        else:
            self.queue.add_request(request)

    def _vllm_schedule(self, now: float) -> bool:
        """vLLM's ``Scheduler.schedule`` at a step boundary (:mod:`vllm_admission`); whether it preempted a request."""
        blocks_for = self.vllm.blocks_for
        decoding = list(self.running.values())
        # (blocks held, blocks once this step's tokens are allocated), in vLLM's running order
        blocks = [(blocks_for(r.input_len + self.steps_done - r.join_step),
                   blocks_for(r.input_len + 1 + self.steps_done - r.join_step)) for r in decoding]
        chunks = {r.index: tokens for r, tokens in self._prefill_chunks()}
        for request in self.prefilling:
            done = request.prefill_claim - request.prefill_left
            blocks.append((blocks_for(done), blocks_for(done + chunks.get(request.index, 0))))
        free = self.usable_blocks - sum(held for held, _ in blocks)
        order = decoding + list(self.prefilling)
        kept = vllm_admission.running_kept(blocks, free)
        for request in reversed(order[kept:]):  # the last first, each to the front of the queue
            if request.index in self.running:
                self._retract(now, request)
            else:
                self._preempt_prefill(now, request)
        if kept < len(order):
            return True  # no admission in a step that preempted
        free -= sum(needed - held for held, needed in blocks)
        round_ = self.admission.open_round(CacheState(
            free, step_tokens=self.recompute_chunk - len(decoding) - sum(chunks.values()),
            any_running=bool(self.running or self.prefilling)))
        while (self.queue and not round_.exhausted and len(self.running) + len(self.prefilling) < self.max_running
               and round_.admit(self._kv_request(self.queue.peek_request(now), 0))):
            self._take_head(now, 0)
        return False

    def _preempt_prefill(self, now: float, request: SimRequest) -> None:
        """vLLM preempts a request still prefilling as it does a decoding one: its blocks freed, all computed again."""
        self.prefilling.remove(request)
        self.kv_prefilling -= request.prefill_claim
        request.prefill_left = request.prefill_claim
        request.retractions += 1
        self._requeue(now, request)

    def _prefill_chunks(self) -> List[Tuple[SimRequest, int]]:
        """The tokens each request prefilling computes in the next step, in order, within the step's
        budget (vLLM's: what the decoding requests, one token each, leave of max_num_batched_tokens)."""
        budget = self.recompute_chunk - (len(self.running) if self.vllm else 0)
        chunks = []
        for request in self.prefilling:
            if budget <= 0:
                break
            tokens = min(request.prefill_left, budget)
            chunks.append((request, tokens))
            budget -= tokens
        return chunks

    def _decode_room(self) -> int:
        """Decode steps before the cache would overflow; vLLM's: one after a preemption, as it admits again at the next."""
        if not self.vllm:
            return (self.capacity - self._kv_in_use()) // len(self.running)
        if self.segment_retracted:
            return 1
        return vllm_admission.decode_steps_that_fit(
            [r.input_len + 1 + self.steps_done - r.join_step for r in self.running.values()], self.usable_blocks,
            self.vllm.block_size)

    # --- segments -------------------------------------------------------------------------------
    def _start_segment(self, now: float) -> None:
        self.segment_start, self.segment_batch, self.segment_kv = now, len(self.running), self.kv_tokens
        self.segment_chunk = []
        if self.prefilling:
            self.segment_chunk = self._prefill_chunks()
            prefill_tokens = sum(tokens for _, tokens in self.segment_chunk)
            self.busy = True
            if self.prefill_alone:  # a prefill batch: the prompts take the chunk budget, nothing decodes
                self.segment_batch = self.segment_steps = 0
                self._schedule_end_at(now + self.model.step_time(0, prefill_tokens, 0))
            else:  # a mixed step: every running request decodes one token, prompts take the chunk budget
                self.segment_steps = 1
                self._schedule_end_at(now + self.model.step_time(self.kv_tokens, prefill_tokens, len(self.running)))
        elif self.running:
            self.busy = True
            # up to the next finish, or to the last step before the cache would overflow
            self._schedule_segment_end(max(min(self._next_finish_step() - self.steps_done, self._decode_room()), 1))
        else:
            self.busy = False
            if self.sglang:  # Scheduler.on_idle: a fully idle server starts its ratio over
                self.new_token_ratio.current = self.new_token_ratio.init

    def _schedule_segment_end(self, steps: int) -> None:
        self.segment_steps = steps
        duration = self.model.decode_steps_time(steps, self.segment_batch, self.segment_kv)
        self._schedule_end_at(self.segment_start + duration)

    def _schedule_end_at(self, time: float) -> None:
        self.segment_version += 1  # an earlier end event of a cut segment becomes stale
        self.sim.schedule(time, self._end_segment, self.segment_version)

    def _end_segment(self, now: float, version: int) -> None:
        if version != self.segment_version:
            return
        if self.segment_steps:
            self.sim.token_gaps.segment(self.engine_id, now - self.segment_start, self.segment_steps)
        else:  # a prefill batch run alone: the running requests' next token waits for it
            self.sim.token_gaps.stall(self.engine_id, now - self.segment_start)
        if self.sglang and not self.segment_chunk:  # a decode step that retracted re-estimated the ratio instead
            self.new_token_ratio.decay_steps(self.segment_steps - int(self.segment_retracted))
        self.steps_done += self.segment_steps
        self.kv_tokens += self.segment_batch * self.segment_steps
        while self.finish_heap and self.finish_heap[0][0] <= self.steps_done:
            step, index, request = heapq.heappop(self.finish_heap)
            # an entry of a run that was retracted (a rerun can end at the same step: its entry is the one left)
            if request.finish_step != step or index not in self.running:
                continue
            del self.running[index]
            self.batch_is_full = False  # a request left the batch
            self.sim.token_gaps.left(self.engine_id, request, now)
            self.kv_tokens -= request.input_len + request.output_len
            self.kv_reserved -= request.reservation
            self._finished(now, request)
        for request, tokens in self.segment_chunk:
            request.prefill_left -= tokens
            if request.prefill_left == 0:
                self.prefilling.popleft()
                self.kv_prefilling -= request.prefill_claim
                if request.num_generated_tokens:  # recomputed: it resumes where it was retracted
                    if self.vllm or self.sglang:  # the recomputation's last position samples the next token
                        self.sim.token_gaps.lone_token(request, now)
                        request.num_generated_tokens += 1
                else:
                    self.sim.first_token(now, request)
                    self._reserve_again(request)
                if request.num_generated_tokens == request.output_len:
                    self._finish_unbatched(now, request)
                else:
                    self._start_decoding(now, request)
        self._next_step(now)

    def _finish_unbatched(self, now: float, request: SimRequest) -> None:
        """A request whose prefill (or vLLM's recomputation) yields its last token leaves with it."""
        self.batch_is_full = False  # it leaves with its prefill batch
        self.pending_work -= request.pending_work
        self.kv_reserved -= request.reservation
        self._finished(now, request)

    def _finished(self, now: float, request: SimRequest) -> None:
        if self.history is not None:
            self.history.record(request.output_len)
        self.sim.finish(now, request)


class Simulation:
    """One run: a trace, its predictions, a cluster and a policy combination."""

    def __init__(
        self,
        trace: Trace,
        predicted_output_lens: Sequence[Optional[float]],
        cluster: ClusterConfig,
        policy: Policy,
        scheduling: SchedulingConfig,
        trajectories: Optional[Sequence[Optional[np.ndarray]]] = None,
        seed: int = 0,
        quantiles: Optional[Sequence[Optional[Tuple[float, ...]]]] = None,
        quantile_trajectories: Optional[Sequence[Optional[Sequence[Tuple[float, ...]]]]] = None,
    ) -> None:
        """``predicted_output_lens``: per request its r̂_0 (None: not predicted, the prior).
        ``trajectories``: per request its predicted remaining tokens at each output token
        (``SimRequest.trajectory``), or None: static.
        ``seed``: the router's random draws (power-of-two). ``quantiles``: per request its total-length
        quantiles at ``scheduling.quantile_levels`` (None: point masses at the predictions);
        ``quantile_trajectories``: its remaining-length quantiles at each output token (as ``trajectories``)."""
        check_kv_admission(cluster, "cluster")
        check_policy(cluster, policy)
        check_fits(trace, cluster)
        self.cluster, self.policy, self.scheduling = cluster, policy, scheduling
        self.dynamic = trajectories is not None
        self.model = cluster.step_time_model()
        self.router = create_peer_or_router(policy.routing, seed)
        # a polling router reads the loads of the last poll (_poll_loads), the others the ranks' at dispatch
        self.polls_loads = self.router.polls_loads and cluster.load_poll_interval_s > 0
        self.polled_loads: List[RankLoad] = []
        self.arrived = 0
        trajectories = trajectories if trajectories is not None else [None] * len(trace)
        quantiles = quantiles if quantiles is not None else [None] * len(trace)
        quantile_trajectories = quantile_trajectories if quantile_trajectories is not None else [None] * len(trace)
        self.dynamic = self.dynamic or any(q is not None for q in quantile_trajectories)
        self.requests = [
            SimRequest(index, float(arrival), int(input_len), int(output_len), predicted_output_len,
                       int(cluster.kv_reservation(input_len, output_len)), trajectory,
                       None if quantile is None else tuple(quantile), quantile_trajectory)
            for index, (arrival, input_len, output_len, predicted_output_len, trajectory, quantile, quantile_trajectory)
            in enumerate(zip(trace.arrival_times, trace.input_lens, trace.output_lens, predicted_output_lens,
                             trajectories, quantiles, quantile_trajectories, strict=True))
        ]
        self._events: List[Tuple[float, int, Callable, object]] = []
        self._sequence = itertools.count()
        if cluster.mode is ClusterMode.DISAGGREGATED:
            self.prefill = [PrefillInstance(self) for _ in range(cluster.prefill_instances)]
            self.engines = [EngineInstance(self, 0, rank) for rank in range(cluster.decode_instances)]
        else:
            self.prefill = []
            self.engines = [EngineInstance(self, cluster.chunked_prefill_size, rank) for rank in range(cluster.instances)]
        self.token_gaps = TokenGapLog(len(self.engines))
        if self.polls_loads and self.requests:  # the first poll just before the first arrival
            self.schedule(self.requests[0].arrival_time, self._poll_loads, None)

    def schedule(self, time: float, callback: Callable[[float, object], None], argument: object) -> None:
        heapq.heappush(self._events, (time, next(self._sequence), callback, argument))

    def run(self) -> SimulationResult:
        events, requests = self._events, self.requests
        next_arrival = 0
        while True:
            arrival_time = requests[next_arrival].arrival_time if next_arrival < len(requests) else np.inf
            if events and events[0][0] <= arrival_time:
                time, _, callback, argument = heapq.heappop(events)
                callback(time, argument)
            elif next_arrival < len(requests):
                self._arrive(arrival_time, requests[next_arrival])
                next_arrival += 1
            else:
                break
        return SimulationResult(
            np.array([r.arrival_time for r in requests]),
            np.array([r.first_token_time for r in requests]),
            np.array([r.finish_time for r in requests]),
            np.array([r.queue_delay for r in requests]),
            np.array([r.output_len for r in requests]),
            np.array([r.retractions for r in requests]),
            np.array([r.prefill_queue_delay for r in requests]),
            np.array([r.transfer_time for r in requests]),
            np.array([r.decode_queue_delay for r in requests]),
            self.token_gaps,
        )

    # --- request life cycle ---------------------------------------------------------------------
    def _arrive(self, now: float, request: SimRequest) -> None:
        self.arrived += 1
        if self.cluster.predict_at is PredictionPoint.ARRIVAL:
            request.reveal_prediction()
        if self.prefill:
            rank = least_requests_rank([RankLoad(instance.num_requests(), 0.0) for instance in self.prefill])
            self.prefill[rank].enqueue(now, request)
        else:
            self._route(now, request).enqueue(now, request)

    def _route(self, now: float, request: SimRequest) -> EngineInstance:
        engine = self.engines[self.router.select(self.polled_loads if self.polls_loads else self._loads(now))]
        engine.add_incoming(request)
        return engine

    def _loads(self, now: float) -> List[RankLoad]:
        """Every engine's load now, with what the router reads."""
        return [engine.load(now, self.router.needs_predicted_work, self.router.needs_tokens) for engine in self.engines]

    def _poll_loads(self, now: float, _: None) -> None:
        """sglang-router's LoadMonitor: read every engine's load, then again one interval later while
        anything is left to happen (an event pending or a request yet to arrive)."""
        self.polled_loads = self._loads(now)
        if self._events or self.arrived < len(self.requests):
            self.schedule(now + self.cluster.load_poll_interval_s, self._poll_loads, None)

    def first_token(self, now: float, request: SimRequest) -> None:
        request.first_token_time = request.last_token_time = now
        request.num_generated_tokens = 1
        if self.cluster.predict_at is PredictionPoint.PREFILL:
            request.reveal_prediction()

    def prefill_done(self, now: float, request: SimRequest) -> None:
        """Disaggregated: the prompt's KV goes to the decode instance chosen by the router."""
        transfer_s = self.cluster.kv_transfer_latency_s + (
            request.input_len * self.model.kv_bytes_per_token / self.cluster.kv_transfer_bandwidth
        )
        request.transfer_time = transfer_s
        self.first_token(now + transfer_s, request)
        if request.output_len == 1:
            self.finish(now + transfer_s, request)
            return
        self.schedule(now + transfer_s, self._route(now, request).enqueue, request)

    def finish(self, now: float, request: SimRequest) -> None:
        request.finish_time = now


def check_policy(cluster: ClusterConfig, policy: Policy) -> None:
    """Refuse a queue order the cluster's admission does not model."""
    if cluster.kv_admission in VLLM_ADMISSIONS and policy.queue is not QueuePolicy.FCFS:
        raise OutletsError(
            f"kv_admission {cluster.kv_admission.value} models vLLM's FCFS scheduler (--scheduling-policy fcfs, its "
            f"default), whose preempted requests go back to the front of the queue; queue {policy.queue.value} is not "
            "vLLM's: run queue fcfs only (outlets simulate --queue fcfs --no-controlled-study), or kv_admission sglang, "
            "predicted or max-new-tokens")


def check_fits(trace: Trace, cluster: ClusterConfig) -> None:
    """Every request must fit one instance's KV cache on its own, or it would wait forever."""
    capacity = cluster.kv_capacity()
    needs = cluster.kv_reservation(trace.input_lens, trace.output_lens)
    vllm = vllm_admission.RULES.get(cluster.kv_admission)
    if vllm:  # vLLM's pool holds whole blocks
        capacity = vllm.usable_blocks(capacity) * vllm.block_size
        needs = vllm.blocks_for(needs) * vllm.block_size
    too_big = np.flatnonzero(needs > capacity)
    if too_big.size:
        row = int(too_big[0])
        raise OutletsError(
            f"trace {trace.name} row {row} (id {trace.ids[row]}): needs {int(needs[row])} KV tokens "
            f"(input_length {int(trace.input_lens[row])} + max(max_new_tokens, output_length)) but an instance "
            f"holds kv_capacity_tokens={capacity}; raise kv_capacity_tokens (or memory_fraction), lower "
            f"max_new_tokens, or drop the {too_big.size} request(s) that do not fit"
        )
