"""How fast `outlets simulate` runs: 20,000 requests under the 6 policy combinations, and how the
cost grows with requests and with instances.

    .venv/bin/python benchmarks/simulate_speed.py [--trace AZURE_CSV]

Lengths come from the Azure conversation trace when present, else from a log-normal stand-in.
Load is set near the 1P+3D cluster's saturation, where queues and batches are largest.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from specforge_outlets.scheduling import QueuePolicy, RoutingPolicy, SchedulingConfig
from specforge_outlets.simulation.cluster import cluster_config_from_dict
from specforge_outlets.simulation.engine import Simulation
from specforge_outlets.simulation.predictors import PredictorKind, predict_lengths
from specforge_outlets.simulation.study import policy_grid
from specforge_outlets.serving.trace import Trace, load_trace, synthetic_poisson

AZURE_CONV = "/work/shared/data/traces/AzureLLMInferenceTrace_conv.csv"
RATE_RPS = 25.0  # ~4.5x the Azure conversation trace's rate: near the 1P+3D saturation


def lengths_source(path: str) -> Trace:
    if os.path.isfile(path):
        return load_trace(path)
    rng = np.random.default_rng(0)
    n = 20_000
    return Trace("lognormal", [str(i) for i in range(n)], np.arange(n, dtype=float),
                 np.clip(rng.lognormal(6.8, 0.8, n), 1, 8000).astype(np.int64),
                 np.clip(rng.lognormal(4.9, 1.0, n), 1, 1000).astype(np.int64))


def time_run(trace: Trace, cluster, policies) -> float:
    predictions = predict_lengths(PredictorKind.NOISY, trace, 0)
    started = time.perf_counter()
    for policy in policies:
        Simulation(trace, predictions, cluster, policy, SchedulingConfig()).run()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=AZURE_CONV)
    args = parser.parse_args()
    source = lengths_source(args.trace)
    cluster = cluster_config_from_dict({}, "defaults")  # 1 prefill + 3 decode, H100, Llama-3.1-8B
    grid = policy_grid(list(RoutingPolicy), list(QueuePolicy))

    trace = synthetic_poisson(source, RATE_RPS, 20_000, seed=0)
    seconds = time_run(trace, cluster, grid)
    print(f"20,000 requests x {len(grid)} policies: {seconds:.1f} s "
          f"({len(grid) * len(trace) / seconds:,.0f} simulated requests/s)")

    print("\nrequests  policy                      seconds  requests/s")
    for policy in (grid[0], grid[-1]):
        for n in (5_000, 10_000, 20_000, 40_000):
            seconds = time_run(synthetic_poisson(source, RATE_RPS, n, seed=0), cluster, [policy])
            print(f"{n:8d}  {policy.label:26s}  {seconds:7.2f}  {n / seconds:10,.0f}")

    print("\ndecode instances (load scaled with them)  policy  seconds")
    for decode in (3, 6, 12):
        scaled = cluster_config_from_dict({"prefill_instances": decode // 3, "decode_instances": decode}, "scaled")
        trace = synthetic_poisson(source, RATE_RPS * decode / 3, 20_000, seed=0)
        for policy in (grid[0], grid[-1]):
            print(f"{decode:3d}  {policy.label:26s}  {time_run(trace, scaled, [policy]):6.2f}")


if __name__ == "__main__":
    main()
