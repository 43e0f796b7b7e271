"""SGLang's disaggregated decode instance: its ``DecodePreallocQueue`` admits transferred prompts.

A transferred prompt's KV is pre-allocated while the cache keeps ``num_reserved_decode_tokens`` free per
active request and room for the running request that needs most (``DecodePreallocAdmission``). A
retracted request is kept aside with a backup of its KV and resumed from it (no recomputation), in
the order retracted, before any transferred prompt is admitted.
"""

from __future__ import annotations

from collections import deque
from typing import Deque, List

from specforge_outlets.scheduling import CacheState, KVAdmission, KVRequest, create_admission
from specforge_outlets.simulation.cluster_run import ClusterRun
from specforge_outlets.simulation.request import SimRequest
from specforge_outlets.simulation.schedulers.decode_instance import DecodeInstance
from specforge_outlets.simulation.schedulers.sglang_base import SGLangScheduler


class SGLangDecodeScheduler(DecodeInstance, SGLangScheduler):
    """SGLang's scheduler on a disaggregated decode instance, under its own admission (``kv_admission: sglang``)."""

    def __init__(self, sim: ClusterRun, engine_id: int) -> None:
        super().__init__(sim, engine_id)
        self.admission = create_admission(KVAdmission.SGLANG, sim.scheduling, decode_only=True)
        self.retracted: Deque[SimRequest] = deque()  # SGLang's retracted_queue, in the order retracted

    def _admits_between_steps(self, now: float) -> bool:
        """On the cache as the segment started: a step later it has less room, never more."""
        if not self.queue or len(self.running) + len(self.prefilling) >= self.max_running:
            return False
        head = self.queue.peek_request(now)
        return not self.retracted and self.admission.open_round(self._prealloc_state()).admit(
            self._kv_request(head, head.num_generated_tokens, extend=head.input_len))

    def _schedule(self, now: float) -> bool:
        self._prealloc_round(now)
        return self._make_room(now)

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

    def _wait_again(self, request: SimRequest) -> None:
        self.retracted.append(request)
