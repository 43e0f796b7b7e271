"""``--schedule-policy outlets``: the waiting-queue order, arrival stamps and external predictions, the retraction order, the PD decode queue.

The order itself is the shared scheduling core's (``specforge_outlets.scheduling.admission_order``);
this module puts SGLang's lists in that order. Each waiting request's keys are computed once per stay
in the queue and kept beside it, in tables keyed by the request (``order_keys.CachedOrderKeys``), so
that a round is one sort with ``dict.__getitem__`` as the key; ``reset_for_retract_after`` drops them
when a request goes back to a waiting queue.
"""

from __future__ import annotations

import time

from sglang_patches import predictions as P
from sglang_patches import state
from sglang_patches.client_predictions import assign_external_prediction
from sglang_patches.key_tables import drop_order_keys
from sglang_patches.order_keys import CachedOrderKeys
from sglang_patches.settings import POLICY_NAME
from specforge_outlets.scheduling import admission_order, retraction_order_key

_POLICY = "sglang.srt.managers.schedule_policy.SchedulePolicy"
_SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
_BATCH = "sglang.srt.managers.schedule_batch.ScheduleBatch"
_REQ = "sglang.srt.managers.schedule_batch.Req"
_DECODE_MIXIN = "sglang.srt.disaggregation.decode.SchedulerDisaggregationDecodeMixin"


def policy_init_around(original, self, policy, *args, **kwargs):
    outlets = policy == POLICY_NAME
    original(self, "fcfs" if outlets else policy, *args, **kwargs)
    self.outlets_config = state.settings().scheduling if outlets else None
    if outlets:  # also here: sglang.Engine users have no command line
        state.check_hooks(state.features_asked(POLICY_NAME, None, state.settings().draft_path))
        state.log_startup("schedule-policy")
    return None


def calc_priority_around(original, self, waiting_queue, *args, **kwargs):
    result = original(self, waiting_queue, *args, **kwargs)
    config = getattr(self, "outlets_config", None)
    if config is not None and len(waiting_queue) > 1:
        sort_waiting(waiting_queue, config)
    return result


def sort_waiting(waiting_queue, config) -> None:
    """Put SGLang's waiting list in the order the core's queue for ``--outlets-order`` admits it now."""
    ordered = admission_order(waiting_queue, state.settings().order, config, now=time.monotonic(),
                              keys=_order_keys(config))
    if ordered != waiting_queue:  # list comparison: identity first, at C speed
        waiting_queue[:] = ordered
        state.metrics().order_changes()


def _order_keys(config) -> CachedOrderKeys:
    """One key provider per scheduling config, so that the keys cached on requests stay valid across rounds."""
    if state.PLUGIN.order_keys is None or state.PLUGIN.order_keys.config is not config:
        state.PLUGIN.order_keys = CachedOrderKeys(config)
    return state.PLUGIN.order_keys


def add_request_to_queue_before(self, req, *args, **kwargs):
    if state.plugin_active():
        first_time_queued = P.record(req).arrival is None  # not a retracted request coming back
        P.stamp_arrival(req)
        # Without an external prediction, predictor-only mode predicts at prefill; until then (and
        # without a predictor) the key uses the prior.
        assigned = assign_external_prediction(req, state.settings().scheduling)
        if first_time_queued and not assigned and not _predicted_later(self):
            state.metrics().served_on_prior()
    return None


def _predicted_later(scheduler) -> bool:
    """Whether a request that came without a prediction gets one after it is queued: from this process's predictor
    at prefill, or on a PD decode instance from the prefill (``pd_transfer`` counts a transfer without one)."""
    return (state.disaggregation_mode(scheduler) == "decode" or state.settings().draft_path is not None
            or state.PLUGIN.speculative_predictions)


def retraction_order_around(original, reqs):
    if not state.schedule_policy_is_outlets():
        return original(reqs)
    config = state.settings().scheduling
    # Most preferred to keep first; SGLang's loop retracts from the end.
    keys = [retraction_order_key(P.predicted_output_len(req), P.num_generated(req), P.arrival_time(req),
                                 getattr(req, "retraction_count", 0), config) for req in reqs]
    return sorted(range(len(reqs)), key=keys.__getitem__)


def reset_for_retract_after(result, self, *args, **kwargs):
    # Every request that ran and goes back to a waiting queue (retraction, PD re-bootstrap, a
    # yielded optimistic prefill) passes here; it comes back with more tokens, so new keys.
    drop_order_keys(self)
    return None


def prebuilt_batch_around(original, self, running_batch, *args, **kwargs):
    if state.schedule_policy_is_outlets() and len(self.waiting_queue) > 1:
        sort_waiting(self.waiting_queue, state.settings().scheduling)
    return original(self, running_batch, *args, **kwargs)


HOOK_TARGETS = [
    (f"{_POLICY}.__init__", policy_init_around, "AROUND", {state.ORDERING}),
    (f"{_POLICY}.calc_priority", calc_priority_around, "AROUND", {state.ORDERING}),
    (f"{_SCHEDULER}._add_request_to_queue", add_request_to_queue_before, "BEFORE",
     {state.ORDERING, state.ROUTING, state.PREDICTOR}),
    (f"{_BATCH}._get_decode_retraction_order", retraction_order_around, "AROUND", {state.ORDERING}),
    (f"{_DECODE_MIXIN}._get_new_prebuilt_batch", prebuilt_batch_around, "AROUND", {state.ORDERING}),
    (f"{_REQ}.reset_for_retract", reset_for_retract_after, "AFTER", {state.ORDERING}),
]
