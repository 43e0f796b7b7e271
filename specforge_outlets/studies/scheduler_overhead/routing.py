"""Routing, per dispatch: the ``outlets`` load-balance method against SGLang's, and what each load snapshot adds."""

from __future__ import annotations

import random
import statistics
from types import SimpleNamespace
from typing import Dict, List

from specforge_outlets.studies.scheduler_overhead.requests import RequestFactory, timed

RANKS = (2, 4, 8, 16)
RUNNING_PER_RANK = 256
SNAPSHOT_WAITING = (0, 1000, 4000)
DISPATCHES = 2000  # per repetition


def controller(num_ranks: int, method: str):
    """SGLang's DataParallelController for ``method`` without processes or sockets, loaded as at 256 running per rank."""
    from sglang.srt.managers import data_parallel_controller as dpc
    from sglang.srt.managers.load_snapshot import LoadSnapshot

    from sglang_patches import routing, state

    dpc.sock_send = lambda *args, **kwargs: None
    self = dpc.DataParallelController.__new__(dpc.DataParallelController)
    self.workers = [object() for _ in range(num_ranks)]
    self._active_workers = list(range(num_ranks))
    self.status = [True] * num_ranks
    self.round_robin_counter = 0
    self.dp_budget = dpc.DPBudget(num_ranks)
    rng = random.Random(num_ranks)
    snapshots = [
        routing.snapshot_class()(dp_rank=rank, timestamp=1.0, num_running_reqs=RUNNING_PER_RANK, num_waiting_reqs=0,
                                 num_total_tokens=RUNNING_PER_RANK * rng.randint(500, 900),
                                 outlets_predicted_work=RUNNING_PER_RANK * rng.uniform(150, 250),
                                 outlets_num_requests=RUNNING_PER_RANK, outlets_received_requests=0)
        for rank in range(num_ranks)]
    assert all(isinstance(snapshot, LoadSnapshot) for snapshot in snapshots)
    self.dp_budget.update_budget(snapshots)
    self.load_snapshot_reader = SimpleNamespace(read_all=lambda: snapshots)
    if method == "round_robin":
        return self.round_robin_scheduler
    if method == "total_tokens":
        return self.total_tokens_scheduler
    state.load_balance_is_outlets = lambda: True  # this process has no SGLang runtime context
    routing.controller_init_after(None, self)
    self.outlets_budget.update(snapshots)
    return self.dispatching


def dispatch_request(rng: random.Random):
    from sglang_patches.settings import CUSTOM_PARAM_KEY

    custom = {CUSTOM_PARAM_KEY: round(rng.lognormvariate(5.3, 1.0), 1)}
    return SimpleNamespace(rid="r", routed_dp_rank=None, input_ids=[0] * rng.randint(16, 1024),
                           sampling_params=SimpleNamespace(custom_params=custom))


def measure_routing(ranks, repetitions: int) -> List[dict]:
    rows = []
    methods = ("round_robin", "total_tokens", "outlets")
    for num_ranks in ranks:
        times: Dict[str, List[float]] = {method: [] for method in methods}
        for repetition in range(repetitions):
            for method in methods:
                dispatch = controller(num_ranks, method)
                rng = random.Random(repetition)
                requests = [dispatch_request(rng) for _ in range(DISPATCHES)]
                times[method].append(timed(lambda: list(map(dispatch, requests))) / DISPATCHES)
        row = {"ranks": num_ranks, **{f"{method} us": 1e6 * statistics.median(times[method]) for method in methods}}
        rows.append(row)
        print(f"routing {num_ranks:>2} ranks: " + ", ".join(f"{m} {row[f'{m} us']:.2f}" for m in methods)
              + " us per dispatch", flush=True)
    return rows


def measure_snapshot(waiting_sizes, repetitions: int) -> List[dict]:
    """What ``get_loads`` adds per published snapshot: the predicted work of the rank's requests.

    With ``--schedule-policy outlets`` too, as here, the waiting requests' work is read from the keys
    the last round cached; the running requests' is computed afresh (they advance every step).
    """
    from sglang.srt.managers.load_snapshot import LoadSnapshot

    from sglang_patches import ordering, routing, state

    state.load_balance_is_outlets = lambda: True  # this process has no SGLang runtime context
    rows = []
    for waiting in waiting_sizes:
        factory = RequestFactory(seed=3, backlog=RUNNING_PER_RANK + waiting)
        running = factory.queue(RUNNING_PER_RANK)
        for req in running:
            req.output_ids.extend([0] * factory.rng.randint(1, 300))
        queue = factory.queue(waiting)
        ordering.sort_waiting(queue, state.settings().scheduling)  # the round before, under --schedule-policy outlets
        inquirer = SimpleNamespace(get_running_batch=lambda: SimpleNamespace(reqs=running),
                                   get_waiting_queue=lambda: queue, get_chunked_req=lambda: None)
        stock = LoadSnapshot(dp_rank=0, timestamp=1.0, num_running_reqs=len(running), num_waiting_reqs=len(queue))
        times = [timed(routing.get_loads_around, lambda self: stock, inquirer) for _ in range(repetitions * 5)]
        assert routing.get_loads_around(lambda self: stock, inquirer).outlets_num_requests == RUNNING_PER_RANK + waiting
        rows.append({"running": RUNNING_PER_RANK, "waiting": waiting, "added ms": 1e3 * statistics.median(times)})
        print(f"snapshot {RUNNING_PER_RANK} running + {waiting} waiting: +{rows[-1]['added ms']:.3f} ms", flush=True)
    return rows
