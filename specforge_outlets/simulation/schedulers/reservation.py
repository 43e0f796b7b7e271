"""The simulator's reference engine: a KV reservation per request, admitted while the reservations fit.

Admission reserves tokens per request (``ClusterConfig.kv_admission``) and admits while the reservations
and the cache in use both leave room. ``max-new-tokens`` reserves each request's full length (prompt +
max(max_new_tokens, its output)): the cache never overflows, nothing is retracted; no engine admits
this way. On a disaggregated decode instance, whose admission the plugin does not hook, ``predicted``
and ``quantile`` reserve prompt + generated + the plugin's charge (:class:`PredictedReservation`).
With reservations below a request's real length the cache in use can outgrow them; a decode segment
then ends where the next step would overflow, and the instance retracts running requests by the
plugin's order. A retracted request keeps its tokens, waits again and is recomputed when readmitted,
without sampling a token.
"""

from __future__ import annotations

from typing import Optional

from specforge_outlets.scheduling import KVAdmission, KVRequest, create_admission
from specforge_outlets.simulation.cluster_run import ClusterRun
from specforge_outlets.simulation.request import SimRequest
from specforge_outlets.simulation.schedulers.base import Scheduler
from specforge_outlets.simulation.schedulers.decode_instance import DecodeInstance


class FullReservation:
    """``max-new-tokens``: every request reserves its full length, once."""

    follows_estimates = False

    def size(self, request: SimRequest, generated: int) -> int:
        return request.full_reservation


class PredictedReservation:
    """The plugin's charge as a reservation, capped by the cluster's max_new_tokens (not the request's); the full
    one for a request not predicted, or retracted."""

    def __init__(self, sim: ClusterRun) -> None:
        cluster = sim.cluster
        self.admission = create_admission(cluster.kv_admission, sim.scheduling, cluster.kv_margin, cluster.kv_quantile)
        self.max_new_tokens = cluster.max_new_tokens
        # With dynamic predictions, or a quantile charge, a running request's reservation follows its latest
        # estimate (SGLang recomputes the running requests' total at every admission, and so does the plugin: a
        # quantile of the remaining length given survival grows for the heavy-tailed survivors)
        self.follows_estimates = sim.dynamic or cluster.kv_admission is KVAdmission.QUANTILE

    def size(self, request: SimRequest, generated: int) -> int:
        if request.prediction is None or request.retractions:
            return request.full_reservation
        return request.input_len + generated + self.admission.output_budget(KVRequest.from_prediction(
            request.prediction_at(generated), 0, generated, self.max_new_tokens))


class ReservationScheduler(Scheduler):
    """A colocated instance with chunked prefill (mixed steps) under a per-request reservation."""

    def __init__(self, sim: ClusterRun, engine_id: int) -> None:
        super().__init__(sim, engine_id)
        self.sizing = FullReservation() if sim.cluster.kv_admission is KVAdmission.MAX_NEW_TOKENS else (
            PredictedReservation(sim))

    def _reservation(self, request: SimRequest, generated: Optional[int] = None) -> int:
        """KV tokens to reserve for a request with ``generated`` tokens (default: as it is admitted)."""
        return self.sizing.size(request, request.num_generated_tokens if generated is None else generated)

    def _reserved(self, now: float) -> int:
        """KV tokens the admission sees reserved: the ones made at admission, or the latest estimates'."""
        if not self.sizing.follows_estimates:
            return self.kv_reserved
        steps = self.steps_done + self._segment_steps_done(now)
        running = sum(self._reservation(r, 1 + steps - r.join_step) for r in self.running.values())
        return running + sum(r.reservation for r in self.prefilling)

    def _can_admit_head(self, now: float) -> bool:
        if not self.queue or len(self.running) + len(self.prefilling) >= self.max_running:
            return False
        needed = self._reservation(self.queue.peek_request(now))
        # in use: the cache after one more step of the running requests (never above the
        # reservations when every request reserves its full length)
        in_use = self._kv_in_use() + len(self.running)
        return max(self._reserved(now), in_use) + needed <= self.capacity

    _admits_between_steps = _can_admit_head

    def _schedule(self, now: float) -> bool:
        while self._can_admit_head(now):
            self._take_head(now, self._reservation(self.queue.peek_request(now)))
        return self._make_room(now)

    def _first_token(self, request: SimRequest) -> None:
        """Re-size the reservation once the prediction is known (colocated: it comes with the first token)."""
        reservation = self._reservation(request)
        self.kv_reserved += reservation - request.reservation
        request.reservation = reservation

    def _recomputed(self, now: float, request: SimRequest) -> None:
        """The recomputation samples no token here: the request decodes its next one with the batch."""


class ReservationDecodeScheduler(DecodeInstance, ReservationScheduler):
    """A disaggregated decode instance under a per-request reservation."""
