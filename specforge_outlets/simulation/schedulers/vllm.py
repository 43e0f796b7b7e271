"""vLLM v1's scheduler on a colocated instance (``kv_admission: vllm``, ``vllm-0.13``; :mod:`vllm_admission`).

One ``schedule`` pass at each step boundary: the running requests allocate whole blocks for the step in
running order (the decoding ones, then those prefilling), the last is preempted while an allocation
fails (one still prefilling included) and goes to the front of the queue, and a step that preempted
none admits while the whole sequence's blocks (v0.13: its first chunk's) are free. A decode segment then
runs while every step's blocks fit (``decode_steps_that_fit``), one step after a preemption, as vLLM
admits again at the next. The decoding requests take one token each of the step's budget
(``max_num_batched_tokens``, the cluster's ``chunked_prefill_size``); a preempted request is recomputed
and its recomputation's last position samples its next token.
"""

from __future__ import annotations


from specforge_outlets.scheduling import CacheState, create_admission
from specforge_outlets.simulation import vllm_admission
from specforge_outlets.simulation.cluster_run import ClusterRun
from specforge_outlets.simulation.request import SimRequest
from specforge_outlets.simulation.schedulers.base import Scheduler


class VLLMScheduler(Scheduler):
    """vLLM's ``Scheduler`` with the block rules of the version the cluster names."""

    def __init__(self, sim: ClusterRun, engine_id: int) -> None:
        super().__init__(sim, engine_id)
        cluster = sim.cluster
        self.rules = vllm_admission.RULES[cluster.kv_admission]
        self.usable_blocks = self.rules.usable_blocks(self.capacity)  # vLLM's pool
        self.admission = create_admission(cluster.kv_admission, sim.scheduling, block_rules=self.rules,
                                          watermark_blocks=self.rules.watermark_blocks(self.capacity))

    def _admits_between_steps(self, now: float) -> bool:
        """The blocks left at the next boundary once the running requests allocated theirs."""
        if not self.queue or len(self.running) + len(self.prefilling) >= self.max_running:
            return False
        steps = self.steps_done + min(self._steps_to_next_boundary(now), self.segment_steps)
        free = self.usable_blocks - sum(self.rules.blocks_for(r.input_len + 1 + steps - r.join_step)
                                        for r in self.running.values())
        budget = self.chunk_size - len(self.running)  # a decode segment: no prompt takes a chunk
        round_ = self.admission.open_round(CacheState(free, step_tokens=budget, any_running=bool(self.running)))
        return round_.admit(self._kv_request(self.queue.peek_request(now), 0))

    def _schedule(self, now: float) -> bool:
        """vLLM's ``Scheduler.schedule`` at a step boundary; whether it preempted a request."""
        blocks_for = self.rules.blocks_for
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
            free, step_tokens=self.chunk_size - len(decoding) - sum(chunks.values()),
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

    def _wait_again(self, request: SimRequest) -> None:
        """vLLM puts a preempted request at the front of the queue."""
        self.queue.prepend_request(request)

    def _prefill_budget(self) -> int:
        """What the decoding requests, one token each, leave of max_num_batched_tokens."""
        return self.chunk_size - len(self.running)

    def _decode_room(self) -> int:
        """Steps while every step's blocks fit; one after a preemption, as vLLM admits again at the next."""
        if self.segment_retracted:
            return 1
        return vllm_admission.decode_steps_that_fit(
            [r.input_len + 1 + self.steps_done - r.join_step for r in self.running.values()], self.usable_blocks,
            self.rules.block_size)
