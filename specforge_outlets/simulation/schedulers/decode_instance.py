"""Placement on a disaggregated decode instance, shared by the engine models that run one."""

from __future__ import annotations

from specforge_outlets.scheduling import QueuePolicy
from specforge_outlets.simulation.request import SimRequest
from specforge_outlets.simulation.sglang_peers import AnyQueuePolicy, PeerQueuePolicy


class DecodeInstance:
    """Mixed in before a :class:`~.base.Scheduler`: a transferred prompt arrives with its KV and decodes as soon as
    it is admitted; only a request retracted here recomputes (its prompt and tokens, in chunks of
    ``chunked_prefill_size``)."""

    def _queue_policy(self, policy: AnyQueuePolicy) -> AnyQueuePolicy:
        """SGLang's decode instances sort their waiting queue only for the plugin's order (its prebuilt-batch
        hook); SGLang's own orders leave it FCFS there."""
        return QueuePolicy.FCFS if isinstance(policy, PeerQueuePolicy) else policy

    def _place(self, now: float, request: SimRequest) -> None:
        request.decode_queue_delay += now - request.enqueue_time
        if request.retractions:
            self._start_prefill(request)
        else:
            self._start_decoding(now, request)
