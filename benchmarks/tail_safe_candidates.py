"""Candidate tail-safe ordering keys against FCFS and plain SJF, in the simulator (issue 7, first round).

Plain SJF by predicted length helps the mean but can blow up the P99 of a length class under
overload or with noisy predictions. This sweep measures candidate keys before one goes into the
shared scheduling core (specforge_outlets/scheduling/keys.py). Every key is static per request
(computed when the request joins a waiting queue), so a heap holds it, as in the core. D = age of
the request that joined the same queue first among those still waiting, when this one joins.
Requests without a prediction yet (the prefill queues: OUTLETS predicts at prefill) stay in
arrival order under every key. The baseline is the FCFS queue with the same (least-predicted-work)
routing:

- ``sjf``: predicted remaining length R (plain SJF, no aging).
- ``sjf-aged``: R + 10 * arrival (the core's current default: 10 tokens of R per second waited).
- ``hol-window``: arrival + D * min(R / 800, 1): a request can only be overtaken by requests
  arriving within D after it, so its extra wait scales with the FCFS wait it faces anyway.
- ``class-offset``: arrival + 5 s if R >= 800 (predicted long) else arrival: FCFS within a class,
  predicted-long requests held back by a fixed 5 s.
- ``class-hol``: arrival + 0.1 * D if R >= 800 else arrival.

Workloads on `recipes/cluster-h100-4p2d.yaml` (decode-bound): the Azure conversation trace (99.8%
of outputs < 800 tokens), and the same arrivals and prompts with **synthetic** heavy-tailed outputs
(log-normal, median 300 tokens, sigma 1: 16% of outputs >= 800), the shape of ShareGPT-like
traffic where the method reports its gain. Predictions: exact, noisy (log-normal sigma 0.5) and
degraded (sigma 1.0, error doubled). Prints one line per run (ratios to FCFS: short P99 / long P99 /
short mean / throughput) and writes a markdown table.

    python benchmarks/tail_safe_candidates.py --output runs/tail-safe
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import math
import os
from collections import deque
from typing import Callable, Dict, Iterator, List

import numpy as np

import specforge_outlets.simulation.engine as engine
from specforge_outlets.scheduling import QueuePolicy, RoutingPolicy, SchedulingConfig, predicted_remaining
from specforge_outlets.scheduling.request_queue import FCFSRequestQueue, RequestQueue
from specforge_outlets.simulation.cluster import load_cluster_config
from specforge_outlets.simulation.engine import Policy, Simulation
from specforge_outlets.simulation.metrics import summarize
from specforge_outlets.simulation.predictors import PredictorKind, predict_lengths
from specforge_outlets.simulation.trace import Trace, load_trace

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACE = os.path.join(REPO, "..", "shared", "data", "traces", "AzureLLMInferenceTrace_conv.csv")
CLUSTER = os.path.join(REPO, "recipes", "cluster-h100-4p2d.yaml")
LONG = 800.0  # the short/long threshold of the metrics
PRIOR = 256.0

# key(R, arrival, D) -> sort value; D = age of the oldest waiting request when this one joins
KEYS: Dict[str, Callable[[float, float, float], float]] = {
    "sjf": lambda R, a, D: R,
    "sjf-aged": lambda R, a, D: R + 10.0 * a,
    "hol-window": lambda R, a, D: a + D * min(R / LONG, 1.0),
    "class-offset": lambda R, a, D: a + (5.0 if R >= LONG else 0.0),
    "class-hol": lambda R, a, D: a + (0.1 * D if R >= LONG else 0.0),
}
# workload -> rate scales from about half of saturation to twice it
SCALES = {"azure-conv": (6.5, 10, 13, 16, 20, 26), "heavy-tail": (3, 5, 6, 7, 8, 10, 12)}
SIGMAS = {"exact": 0.0, "noisy": 0.5, "degraded": 1.0}


class CandidateQueue(RequestQueue):
    """A heap on a candidate key; tracks the oldest waiting request for D."""

    def __init__(self, key: Callable[[float, float, float], float]) -> None:
        self.key, self.heap, self.counter = key, [], itertools.count()
        self.by_arrival: deque = deque()
        self.waiting: set = set()

    def _oldest_age(self, now: float) -> float:
        while self.by_arrival and id(self.by_arrival[0]) not in self.waiting:
            self.by_arrival.popleft()
        return now - self.by_arrival[0].arrival_time if self.by_arrival else 0.0

    def add_request(self, request) -> None:
        if request.predicted_output_len is None:  # prefill queues (prediction at prefill): FCFS for every key
            value = request.arrival_time
        else:
            remaining = predicted_remaining(request.predicted_output_len, request.num_generated_tokens, PRIOR)
            value = self.key(remaining, request.arrival_time, self._oldest_age(request.enqueue_time))
        heapq.heappush(self.heap, ((value, request.arrival_time), next(self.counter), request))
        self.by_arrival.append(request)
        self.waiting.add(id(request))

    def pop_request(self):
        request = heapq.heappop(self.heap)[2]
        self.waiting.discard(id(request))
        return request

    def peek_request(self):
        return self.heap[0][2]

    def __len__(self) -> int:
        return len(self.heap)

    def __iter__(self) -> Iterator:
        return (entry[2] for entry in sorted(self.heap, key=lambda entry: entry[:2]))


def workloads(num_requests: int) -> Dict[str, Trace]:
    conv = load_trace(TRACE).head(num_requests)
    rng = np.random.default_rng(1)
    heavy = np.clip(np.round(300 * np.exp(rng.normal(0.0, 1.0, len(conv)))), 2, 4000).astype(int)
    return {"azure-conv": conv,
            "heavy-tail": Trace("heavy-tail", conv.ids, conv.arrival_times, conv.input_lens, heavy)}


def run_one(trace: Trace, predictions, key_name: str, cluster) -> Dict[str, Dict[str, float]]:
    key = KEYS.get(key_name)
    engine.create_request_queue = (lambda policy, config: FCFSRequestQueue()) if key is None else (
        lambda policy, config: CandidateQueue(key))
    policy = Policy(RoutingPolicy.LEAST_PREDICTED_WORK, QueuePolicy.SJF)
    return summarize(Simulation(trace, predictions, cluster, policy, SchedulingConfig(PRIOR, 0.0)).run(), int(LONG))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="runs/tail-safe")
    parser.add_argument("--num-requests", type=int, default=8000)
    args = parser.parse_args()
    if not os.path.isfile(TRACE):
        print(f"no trace at {os.path.abspath(TRACE)}; nothing to measure")
        return 1
    cluster = load_cluster_config(CLUSTER)
    original = engine.create_request_queue
    rows: List[Dict] = []
    try:
        for workload, trace in workloads(args.num_requests).items():
            for quality, sigma in SIGMAS.items():
                predictions = predict_lengths(PredictorKind.NOISY, trace, 0, sigma)
                for scale in SCALES[workload]:
                    scaled = trace.scaled(scale)
                    fcfs = run_one(scaled, predictions, "fcfs", cluster)
                    for key_name in KEYS:
                        m = run_one(scaled, predictions, key_name, cluster)
                        row = {"workload": workload, "predictions": quality, "rate_scale": scale, "key": key_name,
                               "short_p99": m["short"]["e2e_p99_s"] / fcfs["short"]["e2e_p99_s"],
                               "long_p99": m["long"]["e2e_p99_s"] / fcfs["long"]["e2e_p99_s"],
                               "short_mean": m["short"]["e2e_mean_s"] / fcfs["short"]["e2e_mean_s"],
                               "throughput": m["all"]["throughput_tok_s"] / fcfs["all"]["throughput_tok_s"],
                               "max_queue_s": m["all"]["queue_max_s"], "fcfs_max_queue_s": fcfs["all"]["queue_max_s"],
                               "fcfs_short_p99_s": fcfs["short"]["e2e_p99_s"]}
                        rows.append(row)
                        print(f"{workload} {quality:8s} x{scale:<4g} {key_name:12s} short P99 {row['short_p99']:.2f}  "
                              f"long P99 {row['long_p99']:.2f}  short mean {row['short_mean']:.2f}  "
                              f"thr {row['throughput']:.3f}  max wait {row['max_queue_s']:.0f} s "
                              f"(FCFS {row['fcfs_max_queue_s']:.0f} s)", flush=True)
    finally:
        engine.create_request_queue = original
    os.makedirs(args.output, exist_ok=True)
    with open(os.path.join(args.output, "tail_safe.md"), "w") as handle:
        handle.write(worst_case_table(rows))
    print(worst_case_table(rows))
    return 0


def worst_case_table(rows: List[Dict]) -> str:
    """Per key: worst ratios to FCFS over every run, and the mean-latency gain near saturation."""
    lines = ["| key | worst short P99 / FCFS | worst long P99 / FCFS | short mean / FCFS at saturation "
             "(exact, noisy, degraded) | short P99 / FCFS at saturation (exact, noisy, degraded) | "
             "lowest throughput / FCFS | max wait (s) |", "|" + "---|" * 7]
    saturation = {"azure-conv": 13, "heavy-tail": 7}
    for key in KEYS:
        mine = [row for row in rows if row["key"] == key]
        near = {w: [row for row in mine if row["rate_scale"] == s and row["workload"] == w] for w, s in saturation.items()}
        fmt = lambda metric: "; ".join(f"{w}: " + ", ".join(f"{row[metric]:.2f}" for row in near[w]) for w in near)
        lines.append(f"| {key} | {max(r['short_p99'] for r in mine):.2f} | {max(r['long_p99'] for r in mine):.2f} | "
                     f"{fmt('short_mean')} | {fmt('short_p99')} | {min(r['throughput'] for r in mine):.3f} | "
                     f"{max(r['max_queue_s'] for r in mine):.0f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
