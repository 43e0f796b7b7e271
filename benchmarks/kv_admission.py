"""KV admission by predicted length against reserving max_new_tokens, in the simulator (issue 7).

A decode instance that reserves prompt + max_new_tokens of KV cache per request admits fewer
requests than fit: most outputs are far shorter. Reserving prompt + predicted remaining x (1 +
margin) instead (``kv_admission: predicted`` in the cluster YAML) runs more requests per batch; a
request that outgrows its reservation can overflow the cache, and the instance then retracts the
longest predicted remaining and recomputes it later. This measures throughput, latency and
retractions for both, under the FCFS, tail-safe and SJF orders, with exact, noisy and degraded
predictions, near saturation and at twice it:

- ``recipes/cluster-h100-4p2d.yaml`` as it is (256 running requests at most per decode instance),
- the same with ``max_running_requests: 1024``, so that the cache, not the request limit, binds and
  underestimates turn into retractions.

Baseline of every ratio: FCFS with max_new_tokens reservations on the same cluster and load. Note
that SGLang itself charges a running request only ``new_token_ratio`` (0.7 decaying to 0.1) of its
remaining max_new_tokens, so it admits more than this baseline: these gains are an upper bound of
what predicted admission adds to SGLang.

    python benchmarks/kv_admission.py --output runs/kv-admission
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from typing import Dict, List

from specforge_outlets.scheduling import QueuePolicy, RoutingPolicy, SchedulingConfig
from specforge_outlets.simulation.cluster import ClusterConfig, KVAdmission, load_cluster_config
from specforge_outlets.simulation.engine import Policy, Simulation
from specforge_outlets.serving.metrics import pipe_table
from specforge_outlets.simulation.study import summarize
from specforge_outlets.simulation.predictors import PredictorKind, predict_lengths

from tail_safe_sweep import CLUSTER, LOADS, NOISE, SHORT_THRESHOLD, TRACE, loaded_throughput, workloads

MARGINS = (0.2, 0.5)  # share of the prediction reserved on top
ORDERS = (QueuePolicy.FCFS, QueuePolicy.TAIL_SAFE, QueuePolicy.SJF)
KV_BOUND_MAX_RUNNING = 1024  # the second cluster: the cache binds before the request limit


def admissions(base: ClusterConfig) -> Dict[str, ClusterConfig]:
    found = {"max-new-tokens": base}
    for margin in MARGINS:
        found[f"predicted +{margin:.0%}"] = dataclasses.replace(
            base, kv_admission=KVAdmission.PREDICTED, kv_prediction_margin=margin)
    return found


def run(trace, predictions, cluster: ClusterConfig, order: QueuePolicy) -> Dict:
    result = Simulation(trace, predictions, cluster, Policy(RoutingPolicy.LEAST_PREDICTED_WORK, order),
                        SchedulingConfig()).run()
    metrics = summarize(result, SHORT_THRESHOLD)
    return {"throughput": loaded_throughput(result), "short_p99": metrics["short"]["e2e_p99_s"],
            "long_p99": metrics["long"]["e2e_p99_s"], "mean": metrics["all"]["e2e_mean_s"],
            "retractions": int(result.retractions.sum()), "most_retractions": int(result.retractions.max())}


def sweep(num_requests: int, progress=print) -> List[Dict]:
    base = load_cluster_config(CLUSTER)
    clusters = {"4p2d": base, f"4p2d, {KV_BOUND_MAX_RUNNING} running": dataclasses.replace(
        base, max_running_requests=KV_BOUND_MAX_RUNNING)}
    rows = []
    for workload, trace in workloads(num_requests).items():
        scales, saturation = LOADS[workload]
        for quality, sigma in NOISE.items():
            predictions = predict_lengths(PredictorKind.NOISY, trace, 0, sigma)
            for scale in (saturation, 2 * saturation if 2 * saturation in scales else scales[-1]):
                scaled = trace.scaled(scale)
                for cluster_name, cluster in clusters.items():
                    baseline = None
                    for admission, config in admissions(cluster).items():
                        for order in ORDERS:
                            m = run(scaled, predictions, config, order)
                            baseline = baseline or m
                            row = {"workload": workload, "predictions": quality, "rate_scale": scale,
                                   "cluster": cluster_name, "admission": admission, "order": order.value,
                                   "throughput": m["throughput"] / baseline["throughput"],
                                   "short_p99": m["short_p99"] / baseline["short_p99"],
                                   "long_p99": m["long_p99"] / baseline["long_p99"],
                                   "mean": m["mean"] / baseline["mean"],
                                   "retractions": m["retractions"], "most_retractions": m["most_retractions"]}
                            rows.append(row)
                            progress(" | ".join(f"{value:.3f}" if isinstance(value, float) else str(value)
                                                for value in row.values()))
    return rows


def table(rows: List[Dict]) -> str:
    header = ["workload", "predictions", "load", "cluster", "admission", "order", "throughput / base",
              "short P99 / base", "long P99 / base", "mean / base", "retractions (most per request)"]
    body = [[r["workload"], r["predictions"], f"x{r['rate_scale']:g}", r["cluster"], r["admission"], r["order"],
             f"{r['throughput']:.3f}", f"{r['short_p99']:.2f}", f"{r['long_p99']:.2f}", f"{r['mean']:.2f}",
             f"{r['retractions']} ({r['most_retractions']})"] for r in rows]
    return pipe_table(header, body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="runs/kv-admission")
    parser.add_argument("--num-requests", type=int, default=8000)
    args = parser.parse_args()
    if not os.path.isfile(TRACE):
        print(f"no trace at {os.path.abspath(TRACE)}; nothing to measure")
        return 1
    rows = sweep(args.num_requests, progress=lambda line: print(line, flush=True))
    os.makedirs(args.output, exist_ok=True)
    with open(os.path.join(args.output, "results.jsonl"), "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
    text = table(rows)
    with open(os.path.join(args.output, "kv_admission.md"), "w", encoding="utf-8") as handle:
        handle.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
