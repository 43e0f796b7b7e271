"""SGLang's colocated instance: its admission rounds (``PrefillAdder``), prefill batches run alone, its retraction.

Admission rounds charge the running requests a share of what they may still write (the rule's
strategy: SGLang's decaying share of their remaining ``max_new_tokens``, or with the plugin's
``predicted`` and ``quantile`` their predicted budget, whether they run or are being admitted, after a
retraction too, so the charge falls as they decode and stays at the floor once they outlive their
prediction; ``peak`` and ``past-future`` gate the round on the predicted future peak, from the
output lengths of the requests that finished here). A refused round marks the batch full: SGLang
tries again only after a running request leaves. Without ``--enable-mixed-chunk`` (its default) a
prefill batch runs alone and the decode batch waits; SGLang checks the decode batch's room only
before a decode step.
"""

from __future__ import annotations


from specforge_outlets.scheduling import CacheState, OutputLengthHistory, create_admission
from specforge_outlets.simulation.cluster_run import ClusterRun
from specforge_outlets.simulation.request import SimRequest
from specforge_outlets.simulation.schedulers.sglang_base import SGLangScheduler


class SGLangColocatedScheduler(SGLangScheduler):
    """SGLang's scheduler on a colocated instance, under its own admission or the plugin's."""

    def __init__(self, sim: ClusterRun, engine_id: int) -> None:
        super().__init__(sim, engine_id)
        cluster = sim.cluster
        self.history = OutputLengthHistory()  # the output lengths of the requests that finished here (peak's)
        self.admission = create_admission(cluster.kv_admission, sim.scheduling, cluster.kv_margin, cluster.kv_quantile,
                                          history=self.history)
        self.batch_is_full = False  # SGLang's running_batch.batch_is_full: no admission until a request leaves

    def _admits_between_steps(self, now: float) -> bool:
        return not self.batch_is_full  # SGLang tries an admission round at the next step

    def _schedule(self, now: float) -> bool:
        self._admission_round(now)
        return not self.prefilling and self._make_room(now)

    def _admission_round(self, now: float) -> None:
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

    def _start_prefill_step(self, now: float, prefill_tokens: int) -> None:
        """A prefill batch: the prompts take the chunk budget, nothing decodes."""
        self.segment_batch = self.segment_steps = 0
        self._schedule_end_at(now + self.model.step_time(0, prefill_tokens, 0))

    def _after_retraction(self) -> None:
        super()._after_retraction()
        self.batch_is_full = False  # a request left the batch

    def _finished(self, now: float, request: SimRequest) -> None:
        self.batch_is_full = False  # a request left the batch
        self.history.record(request.output_len)
        super()._finished(now, request)
