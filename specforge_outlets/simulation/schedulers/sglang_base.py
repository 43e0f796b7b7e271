"""What SGLang's two simulated engines share: the KV a running request holds, ``new_token_ratio`` and retraction.

SGLang (:mod:`~specforge_outlets.simulation.sglang_admission`) holds the KV of a running request's
prompt and output but the last token (which the next step writes); its ratio starts over when the
server falls idle, decays by one step per decode step run without a retraction and is re-estimated
from the requests left running after one; a full cache retracts the fewest-generated first, unless
the plugin's order runs (it hooks the retraction order too: ``retraction_order_key``).
"""

from __future__ import annotations


from specforge_outlets.scheduling import KVRequest, QueuePolicy
from specforge_outlets.simulation import sglang_admission
from specforge_outlets.simulation.cluster_run import ClusterRun
from specforge_outlets.simulation.request import SimRequest
from specforge_outlets.simulation.schedulers.base import Scheduler


class SGLangScheduler(Scheduler):
    """An SGLang instance, colocated (:class:`~.sglang_colocated.SGLangColocatedScheduler`) or disaggregated decode
    (:class:`~.sglang_decode.SGLangDecodeScheduler`)."""

    def __init__(self, sim: ClusterRun, engine_id: int) -> None:
        super().__init__(sim, engine_id)
        cluster = sim.cluster
        self.new_token_ratio = sglang_admission.NewTokenRatio.tuned(
            cluster.schedule_conservativeness, cluster.min_new_token_ratio_factor, cluster.new_token_ratio_decay_steps)
        # SGLang's own retraction order, unless the plugin's order runs (it hooks the retraction order too)
        queue = sim.policy.queue
        self.plugin_retraction = isinstance(queue, QueuePolicy) and queue is not QueuePolicy.FCFS

    def _running_kv_request(self, request: SimRequest) -> KVRequest:
        """A decoding request: SGLang's holds its prompt and output but the last token."""
        generated = 1 + self.steps_done - request.join_step
        return self._kv_request(request, generated, request.input_len + generated - 1, 0)

    def _kv_in_use(self) -> int:
        """SGLang holds no KV yet for the last token of each running request."""
        return self.kv_tokens - len(self.running) + self.kv_prefilling

    def _idle(self) -> None:
        """``Scheduler.on_idle``: a fully idle server starts its ratio over."""
        self.new_token_ratio.current = self.new_token_ratio.init

    def _segment_ran(self) -> None:
        if not self.segment_chunk:  # a decode step that retracted re-estimated the ratio instead
            self.new_token_ratio.decay_steps(self.segment_steps - int(self.segment_retracted))

    def _after_retraction(self) -> None:
        self.new_token_ratio.after_retraction(
            (1 + self.steps_done - r.join_step, self._max_new_tokens(r)) for r in self.running.values())

    def _retraction_victim(self) -> SimRequest:
        if self.plugin_retraction:
            return super()._retraction_victim()
        # min takes the first of equal keys: reversed, the latest to join (SGLang's stable sort, popped from the end)
        return min(reversed(self.running.values()), key=lambda r: sglang_admission.retraction_victim_key(
            1 + self.steps_done - r.join_step, r.input_len))
