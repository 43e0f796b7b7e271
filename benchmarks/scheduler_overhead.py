"""What the plugin costs on SGLang's scheduler hot path, side by side with SGLang's own policies.

SGLang re-sorts its waiting list every scheduling round and its data-parallel controller picks a
rank for every request, so whatever the plugin adds there is paid at the server's round and
request rate. Measured in one process, interleaved, medians over repetitions (serve environment):

- **ordering**, per scheduling round at 100-16,000 waiting requests: ``--schedule-policy outlets``
  (``sjf`` and ``tail-safe``: the plugin's ``sort_waiting``, keys cached on the requests) against
  SGLang's own sort helpers for ``lof``, ``hrrn`` and ``shortest-prefill-first`` (``fcfs`` sorts
  nothing). A *steady* round is the list as the last round left it, 1% admitted from the front and
  1% new arrivals appended, as in a saturated server; the *first* sort is a list in arrival order
  whose keys nothing has cached yet.
- **routing**, per dispatch at 2-16 ranks: the ``outlets`` load-balance method's dispatch against
  SGLang's ``round_robin`` and ``total_tokens`` dispatch functions on the same controller object
  (sockets replaced by a no-op), and the predicted work the scheduler adds to each load snapshot it
  publishes (256 running requests, 0-4,000 waiting).
- **prediction** (predictor-only mode), per request and per prefill token: the OUTLETS draft over a
  prompt's captured features, on this CPU, one thread, if an ``outlets export`` directory is given
  (``--draft``; default: the ShareGPT benchmark's trained draft).

The requests are SGLang's own ``Req`` objects (about 160 attributes each, as the scheduler holds
them: an order that reads attributes pays for their size), and SGLang's functions and the plugin's
hooks are the real ones.

    .venv-serve/bin/python benchmarks/scheduler_overhead.py measure --output benchmarks/data/scheduler-overhead
    .venv/bin/python benchmarks/scheduler_overhead.py plot benchmarks/data/scheduler-overhead/result.json

``--parts ordering`` measures one part again and keeps the others' rows in the output's result.json
(each part records the command that measured it): the predictor's cost needs a trained draft that
not every checkout has.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import random
import statistics
import sys
import time
from types import SimpleNamespace
from typing import Callable, Dict, List

from specforge_outlets.atomic import write_text_atomic

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUEUE_SIZES = (100, 1000, 4000, 16000)
RANKS = (2, 4, 8, 16)
RUNNING_PER_RANK = 256
SNAPSHOT_WAITING = (0, 1000, 4000)
PROMPT_LENS = (64, 256, 1024)
CHURN = 0.01  # share of the queue admitted and arriving between two rounds
ARRIVAL_RATE = 50.0  # requests per second into the stand-in queue
ROUNDS = 20  # steady rounds per repetition
REPETITIONS = 7
DISPATCHES = 2000  # per repetition
DEFAULT_DRAFT = os.path.join(REPO, "runs", "bench-sharegpt", "draft-outlets")


# --------------------------------------------------------------------------------------------------
# Stand-in requests
# --------------------------------------------------------------------------------------------------


class RequestFactory:
    """Requests as they reach SGLang's waiting list: arrival order, ShareGPT-like lengths, 10% predicted long.

    Arrivals come at ``ARRIVAL_RATE`` per second, as in a saturated server whose queue grew to
    ``backlog``, and each round's batch after the last one. They are stamped on the monotonic clock
    that the plugin orders by, and all of them in its past, as SGLang stamps them: the stream starts
    twice its expected length before the factory is made. The tail-safe order's work depends on
    these ages: the long class's hold-back is a share of the time waited.
    """

    def __init__(self, seed: int, backlog: int) -> None:
        self.rng = random.Random(seed)
        self.count = 0
        expected_s = (backlog + ROUNDS * churn(backlog)) / ARRIVAL_RATE
        self.clock = time.monotonic() - 2 * expected_s

    def make(self):
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        from sglang_patches import predictions as P

        rng = self.rng
        self.count += 1
        self.clock += rng.expovariate(ARRIVAL_RATE)
        output_len = min(int(rng.lognormvariate(5.3, 1.0)) + 1, 4096)
        predicted = output_len * rng.lognormvariate(0.0, 0.4)
        req = Req(f"r{self.count}", "", [0] * rng.randint(16, 1024), SamplingParams(max_new_tokens=output_len))
        req.time_stats.wait_queue_entry_time = self.clock
        req.arrival_processed_tokens = self.count * 300
        req.outlets_arrival_time = self.clock
        P.set_predicted_output_len(req, predicted, "external")
        return req

    def queue(self, n: int) -> list:
        return [self.make() for _ in range(n)]


# --------------------------------------------------------------------------------------------------
# Ordering
# --------------------------------------------------------------------------------------------------


def orderings() -> Dict[str, Callable[[list], None]]:
    """Each policy's per-round work on a waiting list, as SGLang 0.5.23 and the plugin run it."""
    from sglang.srt.managers.schedule_policy import SchedulePolicy

    from sglang_patches import ordering, state
    from sglang_patches.settings import read_settings
    from specforge_outlets.scheduling import QueuePolicy

    processed = [0]

    def outlets(order: QueuePolicy) -> Callable[[list], None]:
        chosen = dataclasses.replace(read_settings(), order=order)  # the defaults, --outlets-order ORDER

        def run(queue: list) -> None:
            state.use_settings(chosen)  # what the plugin reads once per process; two orders share this one
            ordering.sort_waiting(queue, chosen.scheduling)

        return run

    def hrrn(queue: list) -> None:
        processed[0] += 300_000
        SchedulePolicy._sort_by_hrrn(queue, set(), processed[0])

    return {
        "lof": lambda queue: SchedulePolicy._sort_by_longest_output(queue, False, 1),
        "hrrn": hrrn,
        "shortest-prefill-first": lambda queue: SchedulePolicy._sort_by_shortest_prefill(queue, set()),
        "outlets sjf": outlets(QueuePolicy.SJF),
        "outlets tail-safe": outlets(QueuePolicy.TAIL_SAFE),
    }


def churn(waiting: int) -> int:
    """Requests admitted from the front, and arriving at the end, between two rounds."""
    return max(1, int(CHURN * waiting))


def timed(function: Callable, *args) -> float:
    """Seconds one call takes, with the garbage collector off during it, as ``timeit`` times."""
    gc.disable()
    try:
        start = time.perf_counter()
        function(*args)
        return time.perf_counter() - start
    finally:
        gc.enable()


def measure_ordering(sizes, repetitions: int) -> List[dict]:
    policies = orderings()
    rows = []
    for n in sizes:
        steady: Dict[str, List[float]] = {name: [] for name in policies}
        first: Dict[str, List[float]] = {name: [] for name in policies}
        for repetition in range(repetitions):
            for name, sort in policies.items():  # interleaved: every policy sees the same machine state
                factory = RequestFactory(seed=repetition, backlog=n)
                queue = factory.queue(n)
                first[name].append(timed(sort, queue))
                for _ in range(ROUNDS):
                    del queue[:churn(n)]
                    queue.extend(factory.queue(churn(n)))
                    steady[name].append(timed(sort, queue))
        row = {"waiting": n}
        for name in policies:
            row[f"{name} steady ms"] = 1e3 * statistics.median(steady[name])
            row[f"{name} first ms"] = 1e3 * statistics.median(first[name])
        rows.append(row)
        print(f"ordering {n:>6}: " + ", ".join(f"{name} {row[f'{name} steady ms']:.3f}" for name in policies)
              + " ms (steady)", flush=True)
    return rows


# --------------------------------------------------------------------------------------------------
# Routing
# --------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------
# Prediction (predictor-only mode)
# --------------------------------------------------------------------------------------------------


def measure_predictor(draft: str, prompt_lens, repetitions: int) -> List[dict]:
    import torch

    from specforge_outlets.model.plain_draft import OutletsLengthPredictor

    torch.set_num_threads(1)
    with open(os.path.join(draft, "config.json")) as handle:
        config = json.load(handle)
    hidden, vocab = int(config["hidden_size"]), int(config["vocab_size"])
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(vocab, hidden)  # the target's; its values do not change the cost
    predictor = OutletsLengthPredictor(draft, embedding)
    rows = []
    for length in prompt_lens:
        features = torch.randn(length, 3 * hidden)
        prompt = torch.randint(0, vocab, (length,)).tolist()
        predictor.predict_output_len(features, prompt, 1)  # warm-up
        times = [timed(predictor.predict_output_len, features, prompt, 1) for _ in range(repetitions)]
        ms = 1e3 * statistics.median(times)
        rows.append({"prompt tokens": length, "ms per request": ms, "us per prefill token": 1e3 * ms / length})
        print(f"predictor {length:>5} prompt tokens: {ms:.2f} ms ({1e3 * ms / length:.1f} us/token)", flush=True)
    return rows


# --------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------


PARTS = ("ordering", "routing", "snapshot", "predictor")


def ratio_table(ordering: List[dict]) -> str:
    lines = ["| waiting | outlets sjf | outlets tail-safe | lof | hrrn | shortest-prefill-first | sjf / lof | tail-safe / lof |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for kind in ("steady", "first"):
        lines.append(f"| *{'steady round' if kind == 'steady' else 'first sort (no cached keys)'}* |||||||| ")
        for row in ordering:
            get = lambda name: row[f"{name} {kind} ms"]  # noqa: E731
            lines.append(
                f"| {row['waiting']:,} | {get('outlets sjf'):.3f} ms | {get('outlets tail-safe'):.3f} ms | "
                f"{get('lof'):.3f} ms | {get('hrrn'):.3f} ms | {get('shortest-prefill-first'):.3f} ms | "
                f"x{get('outlets sjf') / get('lof'):.2f} | x{get('outlets tail-safe') / get('lof'):.2f} |")
    return "\n".join(lines)


def measured_by(result: dict, part: str) -> str:
    return f"Measured by `{result['commands'][part]}` ({result['machines'][part]})."


def report(result: dict) -> str:
    """The measured parts' tables (a fresh output measured with ``--parts`` has only those)."""
    parts = ["# Scheduler hot-path overhead"]
    if "ordering" in result:
        parts += ["", "## Ordering, per scheduling round", "", measured_by(result, "ordering"), "",
                  ratio_table(result["ordering"])]
    if "routing" in result:
        parts += ["", "## Routing, per dispatch", "", measured_by(result, "routing"), "",
                  "| ranks | round_robin | total_tokens | outlets | outlets / total_tokens |", "|---:|---:|---:|---:|---:|"]
        parts += [f"| {row['ranks']} | {row['round_robin us']:.2f} us | {row['total_tokens us']:.2f} us | "
                  f"{row['outlets us']:.2f} us | x{row['outlets us'] / row['total_tokens us']:.2f} |"
                  for row in result["routing"]]
    if "snapshot" in result:
        parts += ["", "## Load snapshot, per publish (scheduler side)", "", measured_by(result, "snapshot"), "",
                  "| running | waiting | added by outlets |", "|---:|---:|---:|"]
        parts += [f"| {row['running']} | {row['waiting']:,} | {row['added ms']:.3f} ms |" for row in result["snapshot"]]
    if "predictor" in result:
        parts += ["", f"## Predictor-only mode, per request (CPU, 1 thread, draft {result['draft']})", "",
                  measured_by(result, "predictor"), "",
                  "| prompt tokens | per request | per prefill token |", "|---:|---:|---:|"]
        parts += [f"| {row['prompt tokens']} | {row['ms per request']:.2f} ms | {row['us per prefill token']:.1f} us |"
                  for row in result["predictor"]]
    return "\n".join(parts) + "\n"


def measure(args: argparse.Namespace) -> None:
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    from sglang.srt.plugins import load_plugins

    load_plugins()
    quick = args.quick
    repetitions = 2 if quick else REPETITIONS
    path = os.path.join(args.output, "result.json")
    result = {"commands": {}, "machines": {}}
    if set(args.parts) != set(PARTS) and os.path.isfile(path):
        with open(path) as handle:
            result = json.load(handle)
    measured = {
        "ordering": lambda: measure_ordering(QUEUE_SIZES[:2] if quick else QUEUE_SIZES, repetitions),
        "routing": lambda: measure_routing(RANKS, repetitions),
        "snapshot": lambda: measure_snapshot(SNAPSHOT_WAITING, repetitions),
        "predictor": lambda: measure_predictor(args.draft, PROMPT_LENS[:1] if quick else PROMPT_LENS, repetitions),
    }
    for part in args.parts:
        if part == "predictor" and not os.path.isfile(os.path.join(args.draft, "config.json")):
            print(f"predictor: skipped, no outlets export at {args.draft} (run benchmarks/sharegpt_outlets.py, "
                  "or pass --draft DIR from `outlets export`)", flush=True)
            continue
        if part == "predictor":
            result["draft"] = os.path.relpath(args.draft, REPO)
        result[part] = measured[part]()
        result["commands"][part] = "python benchmarks/scheduler_overhead.py measure " + " ".join(sys.argv[2:])
        result["machines"][part] = f"{os.cpu_count()} cores, python {sys.version.split()[0]}"
    write_text_atomic(path, json.dumps(result, indent=1))
    with open(os.path.join(args.output, "report.md"), "w") as handle:
        handle.write(report(result))
    print(report(result))


def plot(args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(args.result) as handle:
        result = json.load(handle)
    rows = result["ordering"]
    sizes = [row["waiting"] for row in rows]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, style in (("outlets sjf", "o-"), ("outlets tail-safe", "s-"), ("lof", "^--"), ("hrrn", "v--"),
                        ("shortest-prefill-first", "d--")):
        axes[0].plot(sizes, [row[f"{name} steady ms"] for row in rows], style, label=name)
    axes[0].set(xscale="log", yscale="log", xlabel="waiting requests", ylabel="ms per scheduling round",
                title="Ordering (steady round)")
    axes[0].legend(fontsize=8)
    routing = result["routing"]
    for method, style in (("outlets", "o-"), ("total_tokens", "^--"), ("round_robin", "v--")):
        axes[1].plot([row["ranks"] for row in routing], [row[f"{method} us"] for row in routing], style, label=method)
    axes[1].set(xlabel="data-parallel ranks", ylabel="us per dispatch", title="Routing", ylim=(0, None))
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.figure, dpi=120)
    print(f"wrote {args.figure}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("measure", help="measure (serve environment: SGLang + the plugin)")
    run.add_argument("--output", default=os.path.join(REPO, "benchmarks", "data", "scheduler-overhead"))
    run.add_argument("--draft", default=DEFAULT_DRAFT, help="an `outlets export` directory for the predictor cost")
    run.add_argument("--quick", action="store_true", help="small sizes and 2 repetitions (a smoke run)")
    run.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                     help="measure only these; the others' rows are kept from the output's result.json")
    run.set_defaults(func=measure)
    figure = commands.add_parser("plot", help="draw the figure from result.json (needs matplotlib)")
    figure.add_argument("result")
    figure.add_argument("--figure", default=os.path.join(REPO, "docs", "figures", "scheduler-overhead.png"))
    figure.set_defaults(func=plot)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
