"""``--load-balance-method outlets``: route each new request to the data-parallel rank with the fewest
requests, ties broken by the least predicted outstanding work, through SGLang's own load-snapshot path.

The rule is the core's ``PLUGIN_ROUTING`` (``least-requests-then-work``). Why: when the running-request
slots bind, a request's TTFT waits on the count of requests ahead of it, not on their predicted work.
Simulated on colocated x4 at 0.7-1.2 of capacity with OUTLETS r̂₀ (``benchmarks/data/routing-rule``,
10 seeds in ``seeds-0-9/table.md``), this rule is within 1.00-1.01x of SGLang's ``total_requests`` on
mean/P99 TTFT, short/long P99 and goodput, where least predicted work alone has 2.80x its P99 TTFT at
1.2 of capacity; the predicted work only picks among ranks that ``total_requests`` cannot tell apart.
Least predicted work remains a rule of the core and the simulator (``least-predicted-work``), for
studies; the plugin no longer serves it.

- Scheduler side: ``SchedulerLoadInquirer.get_loads`` returns an ``OutletsLoadSnapshot`` (SGLang's
  ``LoadSnapshot`` plus the rank's predicted work and request count as the plugin sees them;
  ``snapshots.py``), under either OUTLETS policy (``GET /get_load`` reads it too: ``load_endpoint.py``).
- Controller side: ``load_snapshot.snapshot_decoder`` decodes the subclass; the controller keeps a
  ``RankLoad`` per rank, refreshed from snapshots (at most every 20 ms, as SGLang does) and
  incremented for each request it dispatches until the next snapshot, and picks the rank with the
  shared scheduling core's router for ``PLUGIN_ROUTING``.
"""

from __future__ import annotations

import logging
import time
from collections import deque

from specforge_outlets.scheduling import PLUGIN_ROUTING, RankLoad, create_router, predicted_remaining
from sglang_patches import predictions as P
from sglang_patches import state
from sglang_patches.client_predictions import external_prediction
from sglang_patches.snapshots import install_snapshot_decoder, snapshot_class
from sglang_patches.settings import POLICY_NAME

logger = logging.getLogger("sglang_patches")


def rank_requests(inquirer):
    """The scheduler's running and waiting requests (PD queues included)."""
    queues = [list(inquirer.get_running_batch().reqs), list(inquirer.get_waiting_queue())]
    for getter in ("get_disagg_prefill_bootstrap_queue", "get_disagg_decode_prealloc_queue",
                   "get_disagg_decode_transfer_queue"):
        try:
            queue = getattr(inquirer, getter)()
            items = getattr(queue, "queue", None)
            if items:
                queues.append([getattr(item, "req", item) for item in items])
            retracted = getattr(queue, "retracted_queue", None)  # PD decode: retracted, waiting to resume
            if retracted:
                queues.append(list(retracted))
        except Exception:
            continue
    chunked = inquirer.get_chunked_req()
    if chunked is not None:
        queues.append([chunked])
    # a request can be in two of these at once (the chunked one also in the batch): count it once
    return list({id(req): req for queue in queues for req in queue if req is not None}.values())


def get_loads_around(original, self):
    """SGLang's snapshot plus the rank's predicted work, under either OUTLETS policy: the DP
    controller balances by it (``--load-balance-method outlets``) and ``GET /get_load`` reports it
    (``load_endpoint``, every instance with ``--schedule-policy outlets``)."""
    snapshot = original(self)
    if not (state.load_balance_is_outlets() or state.schedule_policy_is_outlets()):
        return snapshot
    try:
        config = state.settings().scheduling
        requests = rank_requests(self)
        work = sum(P.predicted_remaining(req, config) for req in requests)
        import msgspec.structs

        fields = msgspec.structs.asdict(snapshot)
        return snapshot_class()(**fields, outlets_predicted_work=float(work), outlets_num_requests=len(requests),
                                outlets_received_requests=state.PLUGIN.received_requests)
    except Exception as error:  # never break SGLang's own load reporting
        logger.warning("OUTLETS load snapshot failed: %s", error)
        return snapshot


def handle_generate_request_before(self, recv_req, *args, **kwargs):
    """Count the generate requests this rank received, health checks excepted (load snapshots)."""
    rid = str(getattr(recv_req, "rid", "") or "")
    if not rid.startswith("HEALTH_CHECK"):
        state.PLUGIN.received_requests += 1
    return None


def from_str_around(original, cls, method):
    if isinstance(method, str) and method.lower() == POLICY_NAME:
        # Load-aware plumbing of TOTAL_REQUESTS (snapshot refresh on dispatch); the controller's
        # dispatch function is replaced in controller_init_after.
        return cls.TOTAL_REQUESTS
    return original(cls, method)


class OutletsBudget:
    """Per-rank predicted work: the rank's latest snapshot plus what was dispatched that it has not seen.

    Each snapshot says how many generate requests its scheduler has received; requests the
    controller dispatched beyond that count are still in flight and are added on top, so a fresh
    snapshot taken before a burst reached the rank does not make the burst's requests vanish
    (SGLang's own budget resets to the snapshot). An in-flight entry older than ``pending_ttl_s``
    is dropped (a request the scheduler never counted, e.g. rejected on arrival).

    Each rank's load is kept current as requests are dispatched and snapshots arrive, so a
    dispatch costs one comparison per rank, as SGLang's ``total_tokens`` does, however many
    requests are in flight.
    """

    def __init__(self, num_ranks: int, prior_output_len: float, pending_ttl_s: float = 5.0) -> None:
        self.router = create_router(PLUGIN_ROUTING)  # the core's rule: what is simulated is what is served
        self.prior = prior_output_len
        self.pending_ttl_s = pending_ttl_s
        self.base = [RankLoad(0, 0.0) for _ in range(num_ranks)]
        self.last_timestamp = [0.0] * num_ranks
        self.sent = [0] * num_ranks
        self.seen = [0] * num_ranks
        self.pending = [deque() for _ in range(num_ranks)]  # (sequence number, work, time)
        self._loads = list(self.base)  # base + pending, per rank

    @property
    def loads(self):
        self._expire(time.monotonic())
        return list(self._loads)

    def _expire(self, now: float) -> None:
        for rank, queue in enumerate(self.pending):
            if queue and (queue[0][0] <= self.seen[rank] or now - queue[0][2] > self.pending_ttl_s):
                while queue and (queue[0][0] <= self.seen[rank] or now - queue[0][2] > self.pending_ttl_s):
                    queue.popleft()
                self._recount(rank)

    def _recount(self, rank: int) -> None:
        base, queue = self.base[rank], self.pending[rank]
        self._loads[rank] = RankLoad(base.num_requests + len(queue), base.predicted_work + sum(e[1] for e in queue))

    def update(self, snapshots) -> None:
        for snapshot in snapshots:
            rank = snapshot.dp_rank
            if rank >= len(self.base) or snapshot.timestamp == self.last_timestamp[rank]:
                continue
            self.last_timestamp[rank] = snapshot.timestamp
            work = getattr(snapshot, "outlets_predicted_work", None)
            count = getattr(snapshot, "outlets_num_requests", None)
            if work is None:  # a stock snapshot: count its requests with the prior
                count = snapshot.num_running_reqs + snapshot.num_waiting_reqs
                work = count * self.prior
            self.base[rank] = RankLoad(int(count), float(work))
            received = getattr(snapshot, "outlets_received_requests", None)
            # without the counter, everything dispatched so far counts as seen (SGLang's behaviour)
            self.seen[rank] = self.sent[rank] if received is None else int(received)
            self._recount(rank)
        self._expire(time.monotonic())

    def choose(self, predicted_output_len, active=None) -> int:
        loads = self._loads
        if active is None or len(active) == len(loads):  # SGLang lists every rank while all are up
            best = self.router.select(loads)
        else:
            ranks = list(active)
            best = ranks[self.router.select([loads[rank] for rank in ranks])]
        work = predicted_remaining(predicted_output_len, 0, self.prior)
        self.sent[best] += 1
        self.pending[best].append((self.sent[best], work, time.monotonic()))
        load = loads[best]
        loads[best] = RankLoad(load.num_requests + 1, load.predicted_work + work)
        return best


def controller_init_after(result, self, *args, **kwargs):
    if not state.load_balance_is_outlets():
        return result
    state.check_hooks({state.ROUTING})
    install_snapshot_decoder()
    config = state.settings().scheduling
    self.outlets_budget = OutletsBudget(len(self.workers) if getattr(self, "workers", None) else
                                        self.dp_budget.num_dp_ranks, config.prior_output_len)
    self._last_refresh_time = getattr(self, "_last_refresh_time", 0.0)

    def refresh_load_budget():
        now = time.perf_counter()
        if now - self._last_refresh_time < 0.02:
            return
        self._last_refresh_time = now
        snapshots = self.load_snapshot_reader.read_all()
        self.dp_budget.update_budget(snapshots)
        self.outlets_budget.update(snapshots)

    from sglang.srt.managers import data_parallel_controller  # once, not per dispatch

    def outlets_scheduler(req):
        if self.maybe_external_dp_rank_routing(req):
            return
        try:
            predicted_output_len = external_prediction(getattr(req, "sampling_params", None))
        except (TypeError, ValueError):
            predicted_output_len = None  # the scheduler records the fallback
        rank = self.outlets_budget.choose(predicted_output_len, active=getattr(self, "_active_workers", None) or None)
        data_parallel_controller.sock_send(self.workers[rank], req)

    self.refresh_load_budget = refresh_load_budget
    self.dispatching = outlets_scheduler
    self.refresh_load_budget_on_dispatch = True
    state.log_startup("load-balance-method")
    return result


_INQUIRER = "sglang.srt.managers.scheduler_components.load_inquirer.SchedulerLoadInquirer"
_SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
_DPC = "sglang.srt.managers.data_parallel_controller"

HOOK_TARGETS = [
    (f"{_INQUIRER}.get_loads", get_loads_around, "AROUND", {state.ROUTING}),
    (f"{_SCHEDULER}.handle_generate_request", handle_generate_request_before, "BEFORE", {state.ROUTING}),
    (f"{_DPC}.LoadBalanceMethod.from_str", from_str_around, "AROUND", {state.ROUTING}),
    (f"{_DPC}.DataParallelController.__init__", controller_init_after, "AFTER", {state.ROUTING}),
]
