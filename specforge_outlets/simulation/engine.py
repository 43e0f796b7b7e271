"""Discrete-event simulation of a serving cluster, driven by a trace.

Events are kept in one heap: arrivals, prefill batches ending, KV transfers ending, and decode
segments ending. Each instance that decodes runs the scheduler of its engine model
(:mod:`specforge_outlets.simulation.schedulers`: SGLang colocated, SGLang's disaggregated decode, vLLM,
or the reference reservation), chosen from the cluster config; they share one event loop of decode
segments (:mod:`~specforge_outlets.simulation.schedulers.segments`), so the cost is per event, never
per token. Disaggregated prefill instances are :mod:`~specforge_outlets.simulation.prefill`'s. Each
request causes a bounded number of events (arrival, prefill, transfer, admission cut, finish), so a run costs
O(events * log(events)) plus, for least-predicted-work and power-of-two routing only, one pass over
the running requests of every candidate instance per routing decision, or per load poll for a
router that polls (power-of-two with ``load_poll_interval_s`` > 0: one event per interval while the
cluster has work, as sglang-router's ``LoadMonitor``; its routing decisions read the last poll's).

Queues and routing come from :mod:`specforge_outlets.scheduling`, the code the SGLang plugin uses.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from specforge_outlets.errors import OutletsError
from specforge_outlets.scheduling import (
    VLLM_ADMISSIONS,
    LengthPrediction,
    PredictionSource,
    QueuePolicy,
    RankLoad,
    SchedulingConfig,
    least_requests_rank,
)
from specforge_outlets.simulation import vllm_admission
from specforge_outlets.simulation.cluster import (
    ClusterConfig,
    ClusterMode,
    PredictionPoint,
    check_kv_admission,
)
from specforge_outlets.simulation.prefill import PrefillInstance
from specforge_outlets.simulation.request import SimRequest
from specforge_outlets.simulation.schedulers import Scheduler, create_scheduler
from specforge_outlets.simulation.token_gaps import TokenGapLog
from specforge_outlets.simulation.sglang_peers import AnyQueuePolicy, AnyRoutingPolicy, create_peer_or_router
from specforge_outlets.serving.trace import Trace


@dataclass(frozen=True)
class Policy:
    """One policy combination under study."""

    routing: AnyRoutingPolicy  # the plugin's routing, or one of SGLang's (sglang_peers.py)
    queue: AnyQueuePolicy  # the plugin's order, or one of SGLang's (sglang_peers.py)

    @property
    def label(self) -> str:
        return f"{self.routing.value}+{self.queue.value}"


@dataclass(frozen=True)
class SimulationResult:
    """Per-request times (s) of one run, in trace order."""

    arrival_times: np.ndarray
    first_token_times: np.ndarray
    finish_times: np.ndarray
    queue_delays: np.ndarray
    output_lens: np.ndarray
    retractions: np.ndarray  # times each request was retracted (KV cache full)
    # where the waiting happened (s): before the prompt's first prefill (the prefill instance's queue,
    # or a colocated instance's before first admission), the KV transfer of PD, and waiting to decode
    # (a decode instance's queue, and every wait after a retraction); they sum to queue_delays + transfer
    prefill_queue_delays: np.ndarray
    transfer_times: np.ndarray
    decode_queue_delays: np.ndarray
    token_gaps: TokenGapLog  # every inter-token gap, for ITL percentiles
    # when each request first joined a decode batch (NaN: it never did, its first token was its last); SGLang's PD
    # decode streams the first token then, so its client's TTFT is this, not first_token_times (the KV landing)
    first_batch_times: np.ndarray

    @property
    def reported_first_token_times(self) -> np.ndarray:
        """The first token as SGLang's client sees it: at the first decode batch (PD), at prefill's end (colocated,
        where the two coincide), and for a request that never joined a batch, when its one token came."""
        return np.where(np.isnan(self.first_batch_times), self.first_token_times, self.first_batch_times)


class Simulation:
    """One run: a trace, its predictions, a cluster and a policy combination."""

    def __init__(
        self,
        trace: Trace,
        predicted_output_lens: Sequence[Optional[float]],
        cluster: ClusterConfig,
        policy: Policy,
        scheduling: SchedulingConfig,
        trajectories: Optional[Sequence[Optional[np.ndarray]]] = None,
        seed: int = 0,
        quantiles: Optional[Sequence[Optional[Tuple[float, ...]]]] = None,
        quantile_trajectories: Optional[Sequence[Optional[Sequence[Tuple[float, ...]]]]] = None,
    ) -> None:
        """``predicted_output_lens``: per request its r̂_0 (None: not predicted, the prior).
        ``trajectories``: per request its predicted remaining tokens at each output token
        (``SimRequest.trajectory``), or None: static.
        ``seed``: the router's random draws (power-of-two). ``quantiles``: per request its total-length
        quantiles at ``scheduling.quantile_levels`` (None: point masses at the predictions);
        ``quantile_trajectories``: its remaining-length quantiles at each output token (as ``trajectories``)."""
        check_kv_admission(cluster, "cluster")
        check_policy(cluster, policy)
        check_fits(trace, cluster)
        self.cluster, self.policy, self.scheduling = cluster, policy, scheduling
        self.dynamic = trajectories is not None
        self.model = cluster.step_time_model()
        self.router = create_peer_or_router(policy.routing, seed)
        # a polling router reads the loads of the last poll (_poll_loads), the others the ranks' at dispatch
        self.polls_loads = self.router.polls_loads and cluster.load_poll_interval_s > 0
        self.polled_loads: List[RankLoad] = []
        self.arrived = 0
        trajectories = trajectories if trajectories is not None else [None] * len(trace)
        quantiles = quantiles if quantiles is not None else [None] * len(trace)
        quantile_trajectories = quantile_trajectories if quantile_trajectories is not None else [None] * len(trace)
        self.dynamic = self.dynamic or any(q is not None for q in quantile_trajectories)
        self.requests = [
            SimRequest(index, float(arrival), int(input_len), int(output_len),
                       self._prediction(predicted_output_len, quantile),
                       int(cluster.kv_reservation(input_len, output_len)), trajectory, quantile_trajectory)
            for index, (arrival, input_len, output_len, predicted_output_len, trajectory, quantile, quantile_trajectory)
            in enumerate(zip(trace.arrival_times, trace.input_lens, trace.output_lens, predicted_output_lens,
                             trajectories, quantiles, quantile_trajectories, strict=True))
        ]
        self._events: List[Tuple[float, int, Callable, object]] = []
        self._sequence = itertools.count()
        if cluster.mode is ClusterMode.DISAGGREGATED:
            self.prefill = [PrefillInstance(self) for _ in range(cluster.prefill_instances)]
            engines = cluster.decode_instances
        else:
            self.prefill = []
            engines = cluster.instances
        self.engines = [create_scheduler(self, rank) for rank in range(engines)]
        self.token_gaps = TokenGapLog(len(self.engines))
        if self.polls_loads and self.requests:  # the first poll just before the first arrival
            self.schedule(self.requests[0].arrival_time, self._poll_loads, None)

    def schedule(self, time: float, callback: Callable[[float, object], None], argument: object) -> None:
        heapq.heappush(self._events, (time, next(self._sequence), callback, argument))

    def run(self) -> SimulationResult:
        events, requests = self._events, self.requests
        next_arrival = 0
        while True:
            arrival_time = requests[next_arrival].arrival_time if next_arrival < len(requests) else np.inf
            if events and events[0][0] <= arrival_time:
                time, _, callback, argument = heapq.heappop(events)
                callback(time, argument)
            elif next_arrival < len(requests):
                self._arrive(arrival_time, requests[next_arrival])
                next_arrival += 1
            else:
                break
        return SimulationResult(
            np.array([r.arrival_time for r in requests]),
            np.array([r.first_token_time for r in requests]),
            np.array([r.finish_time for r in requests]),
            np.array([r.queue_delay for r in requests]),
            np.array([r.output_len for r in requests]),
            np.array([r.retractions for r in requests]),
            np.array([r.prefill_queue_delay for r in requests]),
            np.array([r.transfer_time for r in requests]),
            np.array([r.decode_queue_delay for r in requests]),
            self.token_gaps,
            np.array([r.first_batch_time for r in requests]),
        )

    def _prediction(self, predicted_output_len: Optional[float], quantiles: Optional[Sequence[float]]
                    ) -> Optional[LengthPrediction]:
        """A request's r̂_0 (and quantiles) as the scheduler will learn it: with the request at arrival, from the
        draft at prefill. Built as given (no ``of_total`` clean-up): the predictors' values are checked as they
        are read (``predicted_lengths``), and the results stay those of the values given."""
        if predicted_output_len is None:
            return None
        if self.cluster.predict_at is PredictionPoint.ARRIVAL:
            source, at_generated = PredictionSource.EXTERNAL, 0
        else:
            source, at_generated = PredictionSource.DRAFT, 1
        return LengthPrediction(predicted_output_len, source, None if quantiles is None else tuple(quantiles),
                                at_generated)

    # --- request life cycle ---------------------------------------------------------------------
    def _arrive(self, now: float, request: SimRequest) -> None:
        self.arrived += 1
        if self.cluster.predict_at is PredictionPoint.ARRIVAL:
            request.reveal_prediction()
        if self.prefill:
            rank = least_requests_rank([RankLoad(instance.num_requests(), 0.0) for instance in self.prefill])
            self.prefill[rank].enqueue(now, request)
        else:
            self._route(now, request).enqueue(now, request)

    def _route(self, now: float, request: SimRequest) -> Scheduler:
        engine = self.engines[self.router.select(self.polled_loads if self.polls_loads else self._loads(now))]
        engine.add_incoming(request)
        return engine

    def _loads(self, now: float) -> List[RankLoad]:
        """Every engine's load now, with what the router reads."""
        return [engine.load(now, self.router.needs_predicted_work, self.router.needs_tokens) for engine in self.engines]

    def _poll_loads(self, now: float, _: None) -> None:
        """sglang-router's LoadMonitor: read every engine's load, then again one interval later while
        anything is left to happen (an event pending or a request yet to arrive)."""
        self.polled_loads = self._loads(now)
        if self._events or self.arrived < len(self.requests):
            self.schedule(now + self.cluster.load_poll_interval_s, self._poll_loads, None)

    def first_token(self, now: float, request: SimRequest) -> None:
        request.first_token_time = request.last_token_time = now
        request.num_generated_tokens = 1
        if self.cluster.predict_at is PredictionPoint.PREFILL:
            request.reveal_prediction()

    def prefill_done(self, now: float, request: SimRequest) -> None:
        """Disaggregated: the prompt's KV goes to the decode instance chosen by the router."""
        transfer_s = self.cluster.kv_transfer_latency_s + (
            request.input_len * self.model.kv_bytes_per_token / self.cluster.kv_transfer_bandwidth
        )
        request.transfer_time = transfer_s
        self.first_token(now + transfer_s, request)
        if request.output_len == 1:
            self.finish(now + transfer_s, request)
            return
        self.schedule(now + transfer_s, self._route(now, request).enqueue, request)

    def finish(self, now: float, request: SimRequest) -> None:
        request.finish_time = now


def check_policy(cluster: ClusterConfig, policy: Policy) -> None:
    """Refuse a queue order the cluster's admission does not model."""
    if cluster.kv_admission in VLLM_ADMISSIONS and policy.queue is not QueuePolicy.FCFS:
        raise OutletsError(
            f"kv_admission {cluster.kv_admission.value} models vLLM's FCFS scheduler (--scheduling-policy fcfs, its "
            f"default), whose preempted requests go back to the front of the queue; queue {policy.queue.value} is not "
            "vLLM's: run queue fcfs only (outlets simulate --queue fcfs --no-controlled-study), or kv_admission sglang, "
            "predicted or max-new-tokens")


def check_fits(trace: Trace, cluster: ClusterConfig) -> None:
    """Every request must fit one instance's KV cache on its own, or it would wait forever."""
    capacity = cluster.kv_capacity()
    needs = cluster.kv_reservation(trace.input_lens, trace.output_lens)
    vllm = vllm_admission.RULES.get(cluster.kv_admission)
    if vllm:  # vLLM's pool holds whole blocks
        capacity = vllm.usable_blocks(capacity) * vllm.block_size
        needs = vllm.blocks_for(needs) * vllm.block_size
    too_big = np.flatnonzero(needs > capacity)
    if too_big.size:
        row = int(too_big[0])
        raise OutletsError(
            f"trace {trace.name} row {row} (id {trace.ids[row]}): needs {int(needs[row])} KV tokens "
            f"(input_length {int(trace.input_lens[row])} + max(max_new_tokens, output_length)) but an instance "
            f"holds kv_capacity_tokens={capacity}; raise kv_capacity_tokens (or memory_fraction), lower "
            f"max_new_tokens, or drop the {too_big.size} request(s) that do not fit"
        )
