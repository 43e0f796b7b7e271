"""What every simulated engine shares: its batch, its waiting queue, placement, retraction and the load it reports.

Steps are counted per instance; a running request's generated tokens are ``1 + steps_done - join_step``
(the first token comes from prefill), so advancing a segment (:mod:`.segments`) touches no request. At
each step boundary the engine's own scheduler (:meth:`Scheduler._schedule`, one subclass per engine
model) admits and retracts; the admission strategies it asks are the scheduling core's
(``scheduling.kv_admission``), as the plugin's hooks ask them on SGLang.
"""

from __future__ import annotations

import heapq
import math
from abc import abstractmethod
from collections import deque
from typing import Deque, Dict, List, Optional, Tuple

from specforge_outlets.scheduling import (
    KVRequest,
    LengthPrediction,
    RankLoad,
    rank_load,
    remaining_or_prior,
    retraction_order_key,
)
from specforge_outlets.simulation.cluster_run import ClusterRun
from specforge_outlets.simulation.request import SimRequest
from specforge_outlets.simulation.schedulers.segments import SegmentLoop
from specforge_outlets.simulation.sglang_peers import AnyQueuePolicy, create_queue


def predicted_output_len(prediction: Optional[LengthPrediction]) -> Optional[float]:
    """What the core's load and retraction keys read of a prediction: its total (None: the prior)."""
    return None if prediction is None else prediction.predicted_output_len


class Scheduler(SegmentLoop):
    """One instance of an engine: a colocated one (every admitted request prefills, in chunks, before it decodes)
    unless a subclass places requests otherwise (:class:`~.decode_instance.DecodeInstance`)."""

    def __init__(self, sim: ClusterRun, engine_id: int) -> None:
        super().__init__(sim.cluster.chunked_prefill_size)
        self.sim = sim
        self.engine_id = engine_id
        self.model = sim.model
        self.capacity = sim.cluster.kv_capacity()
        self.max_running = sim.cluster.max_running_requests
        self.queue = create_queue(self._queue_policy(sim.policy.queue), sim.scheduling, sim.cluster.max_new_tokens)
        self.running: Dict[int, SimRequest] = {}
        self.finish_heap: List[Tuple[int, int, SimRequest]] = []  # (finish step, index, request)
        self.prefilling: Deque[SimRequest] = deque()
        self.incoming = 0  # routed here, not yet in the queue (KV in transfer)
        self.incoming_tokens = 0  # their prompt tokens
        self.pending_work = 0.0  # predicted work of requests not yet decoding
        self.steps_done = 0
        self.kv_tokens = 0  # context tokens of running requests after steps_done steps
        self.kv_prefilling = 0  # tokens held by requests being prefilled or recomputed
        self.kv_reserved = 0  # tokens reserved ahead (ReservationScheduler's; the others reserve none)

    def _queue_policy(self, policy: AnyQueuePolicy) -> AnyQueuePolicy:
        """The order of this instance's waiting queue."""
        return policy

    @abstractmethod
    def _admits_between_steps(self, now: float) -> bool:
        """Whether a request just queued at a busy instance joins the batch at the end of the step in progress."""

    # --- load, as a router sees it -------------------------------------------------------------
    def load(self, now: float, with_work: bool, with_tokens: bool = False) -> RankLoad:
        waiting = len(self.prefilling) + len(self.queue) + self.incoming
        if with_tokens:  # SGLang's snapshot: KV in use plus the prompts still to prefill (routed ones too)
            queued = sum(r.input_len + r.num_generated_tokens for r in self.queue) + self.incoming_tokens
            return RankLoad(waiting + len(self.running), 0.0, self.kv_tokens + self.kv_prefilling + queued)
        if not with_work:
            return RankLoad(waiting + len(self.running), 0.0)
        steps = self.steps_done + self._segment_steps_done(now)
        running = ((predicted_output_len(r.prediction_at(1 + steps - r.join_step)), 1 + steps - r.join_step)
                   for r in self.running.values())
        return rank_load(running, self.sim.scheduling.prior_output_len, RankLoad(waiting, self.pending_work))

    # --- requests coming in ---------------------------------------------------------------------
    def add_incoming(self, request: SimRequest) -> None:
        """Count a request routed here; its work is static until it starts decoding."""
        self.incoming += 1
        self.incoming_tokens += request.input_len
        request.pending_work = remaining_or_prior(
            request.prediction_at(request.num_generated_tokens), request.num_generated_tokens, self.sim.scheduling)
        self.pending_work += request.pending_work

    def enqueue(self, now: float, request: SimRequest) -> None:
        self.incoming -= 1
        self.incoming_tokens -= request.input_len
        request.enqueue_time = now
        self.queue.add_request(request)
        if not self.busy:
            self._next_step(now)
        elif self.segment_chunk:
            return  # a step with prompts: admission follows at its end
        elif self._admits_between_steps(now):
            self._cut_segment(now)

    def _kv_request(self, request: SimRequest, generated: int, held: int = 0, extend: Optional[int] = None
                    ) -> KVRequest:
        """What the admission reads from a request with ``generated`` tokens (its latest predictions), holding
        ``held`` KV tokens, whose prefill adds ``extend`` (by default what it has left to prefill)."""
        return KVRequest.from_prediction(request.prediction_at(generated),
                                         request.prefill_left if extend is None else extend, generated,
                                         self._max_new_tokens(request), held=held)

    def _max_new_tokens(self, request: SimRequest) -> int:
        """What the simulated client asks for: the cluster's max_new_tokens, or the output if longer."""
        return max(self.sim.cluster.max_new_tokens, request.output_len)

    def _kv_in_use(self) -> int:
        return self.kv_tokens + self.kv_prefilling

    # --- admission and placement ----------------------------------------------------------------
    def _take_head(self, now: float, reservation: int) -> SimRequest:
        """Admit the queue's head, reserving ``reservation`` KV tokens for it."""
        request = self.queue.pop_request(now)
        request.queue_delay += now - request.enqueue_time
        request.reservation = reservation
        self.kv_reserved += request.reservation
        self._place(now, request)
        return request

    def _place(self, now: float, request: SimRequest) -> None:
        """An admitted request prefills its prompt, or a retracted one recomputes its tokens."""
        if request.num_generated_tokens:
            request.decode_queue_delay += now - request.enqueue_time
        else:
            request.prefill_queue_delay += now - request.enqueue_time
        self._start_prefill(request)

    def _start_prefill(self, request: SimRequest) -> None:
        request.prefill_claim = request.prefill_left
        self.kv_prefilling += request.prefill_claim
        self.prefilling.append(request)

    def _start_decoding(self, now: float, request: SimRequest) -> None:
        """Join the decode batch with the tokens generated so far (1, the prefill's, unless retracted)."""
        self.sim.token_gaps.joined(self.engine_id, request, now)
        if math.isnan(request.first_batch_time):  # its first join
            request.first_batch_time = now
        self.pending_work -= request.pending_work
        generated = max(request.num_generated_tokens, 1)
        request.num_generated_tokens = generated
        request.join_step = self.steps_done - (generated - 1)
        request.finish_step = self.steps_done + request.output_len - generated
        self.running[request.index] = request
        self.kv_tokens += request.input_len + generated
        heapq.heappush(self.finish_heap, (request.finish_step, request.index, request))

    def _decode_room(self) -> int:
        return (self.capacity - self._kv_in_use()) // len(self.running)

    def _next_finish_step(self) -> int:
        """Step at which the next running request finishes (drops entries of retracted runs)."""
        while self.finish_heap[0][2].finish_step != self.finish_heap[0][0]:
            heapq.heappop(self.finish_heap)
        return self.finish_heap[0][0]

    # --- retraction ------------------------------------------------------------------------------
    def _make_room(self, now: float) -> bool:
        """Retract running requests until every one of them can decode one more token; whether any was.

        Prompts being prefilled hold their whole claim, so a lone running request can be retracted
        too (alone it always fits: ``check_fits``).
        """
        retracted = False
        while self.running and self._kv_in_use() + len(self.running) > self.capacity:
            self._retract(now, self._retraction_victim())
            retracted = True
        if retracted:
            self._after_retraction()
        return retracted

    def _after_retraction(self) -> None:
        """What the engine re-estimates once a retraction made room."""

    def _retraction_victim(self) -> SimRequest:
        """The plugin's order (``retraction_order_key``: longest predicted remaining first, ``max_retractions``)."""
        config = self.sim.scheduling
        # max takes the first of equal keys: reversed, the latest to join (the plugin's stable sort, popped from the end)
        return max(reversed(self.running.values()), key=lambda r: retraction_order_key(
            predicted_output_len(r.prediction_at(1 + self.steps_done - r.join_step)), 1 + self.steps_done - r.join_step,
            r.arrival_time, r.retractions, config))

    def _retract(self, now: float, request: SimRequest) -> None:
        """A running request leaves the batch with its tokens, to be recomputed (or resumed) when readmitted."""
        generated = 1 + self.steps_done - request.join_step
        del self.running[request.index]
        self.sim.token_gaps.left(self.engine_id, request, now)
        request.finish_step = -1
        self.kv_tokens -= request.input_len + generated
        self.kv_reserved -= request.reservation
        request.num_generated_tokens = generated
        # the waiting queue orders by the latest
        request.prediction = request.prediction_at(generated)
        request.retractions += 1
        request.prefill_left = request.input_len + generated  # recomputed when readmitted
        request.pending_work = remaining_or_prior(request.prediction_at(generated), generated, self.sim.scheduling)
        self.pending_work += request.pending_work
        self._requeue(now, request)

    def _requeue(self, now: float, request: SimRequest) -> None:
        """A retracted request waits again."""
        request.enqueue_time = now
        self._wait_again(request)

    def _wait_again(self, request: SimRequest) -> None:
        """Where a retracted request waits: the waiting queue, by its order."""
        self.queue.add_request(request)

    def _finish_due(self, now: float) -> None:
        while self.finish_heap and self.finish_heap[0][0] <= self.steps_done:
            step, index, request = heapq.heappop(self.finish_heap)
            # an entry of a run that was retracted (a rerun can end at the same step: its entry is the one left)
            if request.finish_step != step or index not in self.running:
                continue
            del self.running[index]
            self.sim.token_gaps.left(self.engine_id, request, now)
            self.kv_tokens -= request.input_len + request.output_len
            self.kv_reserved -= request.reservation
            self._finished(now, request)

    def _prefilled(self, now: float, request: SimRequest) -> None:
        """A prompt, or a retracted request's recomputation, is prefilled: it decodes, or leaves with its last token."""
        self.prefilling.popleft()
        self.kv_prefilling -= request.prefill_claim
        if request.num_generated_tokens:
            self._recomputed(now, request)
        else:
            self.sim.first_token(now, request)
            self._first_token(request)
        if request.num_generated_tokens == request.output_len:
            self._finish_unbatched(now, request)
        else:
            self._start_decoding(now, request)

    def _recomputed(self, now: float, request: SimRequest) -> None:
        """A retracted request resumes where it was: the recomputation's last position samples the next token."""
        self.sim.token_gaps.lone_token(request, now)
        request.num_generated_tokens += 1

    def _first_token(self, request: SimRequest) -> None:
        """The prompt's prefill gave the first token (and with it, at prefill, the prediction)."""

    def _finish_unbatched(self, now: float, request: SimRequest) -> None:
        """A request whose prefill (or recomputation) yields its last token leaves with it."""
        self.pending_work -= request.pending_work
        self.kv_reserved -= request.reservation
        self._finished(now, request)

    def _finished(self, now: float, request: SimRequest) -> None:
        self.sim.finish(now, request)
