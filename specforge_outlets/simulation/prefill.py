"""A disaggregated prefill instance of the simulated cluster."""

from __future__ import annotations

from typing import List

from specforge_outlets.simulation.cluster_run import ClusterRun
from specforge_outlets.simulation.request import SimRequest
from specforge_outlets.simulation.sglang_peers import create_queue


class PrefillInstance:
    """Disaggregated prefill: batches prompts in queue order up to ``max_prefill_tokens``."""

    def __init__(self, sim: ClusterRun) -> None:
        self.sim = sim
        self.queue = create_queue(sim.policy.queue, sim.scheduling, sim.cluster.max_new_tokens)
        self.batch: List[SimRequest] = []

    def num_requests(self) -> int:
        return len(self.queue) + len(self.batch)

    def enqueue(self, now: float, request: SimRequest) -> None:
        request.enqueue_time = now
        self.queue.add_request(request)
        if not self.batch:
            self._start_batch(now)

    def _start_batch(self, now: float) -> None:
        budget, tokens = self.sim.cluster.max_prefill_tokens, 0
        # Like SGLang: admit in queue order until the first prompt that does not fit (one always does).
        while self.queue and (not self.batch or tokens + self.queue.peek_request(now).input_len <= budget):
            request = self.queue.pop_request(now)
            request.queue_delay += now - request.enqueue_time
            request.prefill_queue_delay += now - request.enqueue_time
            tokens += request.input_len
            self.batch.append(request)
        self.sim.schedule(now + self.sim.model.step_time(0, tokens), self._finish_batch, None)

    def _finish_batch(self, now: float, _: None) -> None:
        batch, self.batch = self.batch, []
        for request in batch:
            self.sim.prefill_done(now, request)
        if self.queue:
            self._start_batch(now)
