"""sglang-router's power-of-two against the exact least-predicted-work argmin, simulated.

Behind ``sglang-router --decode-policy power_of_two`` (docs/serving.md step 7) the decode instance
of a request is the less loaded of two drawn at random, by loads the router polled up to one
``--worker-startup-check-interval`` ago (1 s at the least), where the plugin's own data-parallel
router and the simulator's default take the least loaded of all, read at dispatch. This measures
what that costs on the serving study's set-up (``serving_study_sharegpt.py``): its method's workload
(the label set's test requests resampled into Poisson traces) on 1 prefill + 3 decode H100s
(``recipes/cluster-h100-1p3d.yaml``, ``max_new_tokens`` 2,048), the plugin's default order
(tail-safe) with OUTLETS r̂₀ (what the method deploys) or the oracle, under both of the study's KV
admissions (by prediction in 100,000 tokens per instance, where the cache binds; the full
reservation in the GPU's cache), at loads near and past each one's saturation. Decode routers:

- ``round-robin``: the baseline of every ratio (same admission, order, predictor, trace and load);
- ``least-predicted-work``: the exact argmin on fresh loads;
- ``power-of-two, 1 s stale``: sglang-router's power_of_two polling every second
  (``load_poll_interval_s`` 1, its least);
- ``power-of-two, fresh``: the same draws on loads read at every dispatch (``load_poll_interval_s``
  0), which separates the cost of two random candidates from the cost of stale loads.

Each ratio is the mean over the trace seeds (``--trace-seeds``) and, for power-of-two, the router's
seeds (``--router-seeds``); the short P99's range over them is given beside it. The simulator routes
a PD request to its decode instance when its prefill ends, where the router picks it at arrival:
with one prefill instance and short prompts (prefill queue P99 under 0.1 s on this workload) the
two differ by less than a poll interval.

Stages (each output is kept and skipped; delete it to run again): ``simulate`` writes
``result.json`` (every run), ``report`` writes ``report.md`` and ``ratios.json``.

    taskset -c 1 .venv/bin/python benchmarks/power_of_two_routing.py    # 504 runs, about 6 minutes on one core
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys
import time
from typing import List

import numpy as np

from specforge_outlets.atomic import write_text_atomic
from specforge_outlets.demo.stages import written
from specforge_outlets.scheduling import DEFAULT_LOAD_POLL_INTERVAL_S, SchedulingConfig
from specforge_outlets.simulation.cluster import KVAdmission
from specforge_outlets.simulation.engine import Policy, Simulation
from specforge_outlets.simulation.sglang_peers import queue_policy, routing_policy
from specforge_outlets.simulation.study import summarize
from specforge_outlets.studies import sharegpt_serving as study

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CLUSTER = "1P+3D"
KV_CAPACITY = 100_000  # per instance with KV admission by prediction, as the serving study's KV-bound set-up
QUEUE = "tail-safe"  # the plugin's default order
PREDICTORS = ("outlets r0", "oracle")
# admission -> loads (requests/s) near and past its saturation on this workload: with tail-safe and a
# prediction the cluster saturates near 30-40 rps where the cache binds, near 60 rps with the full
# reservation (the serving study's report.md)
SETUPS = {"KV by prediction": (KVAdmission.PREDICTED, (20.0, 30.0, 40.0, 60.0)),
          "full reservation": (KVAdmission.MAX_NEW_TOKENS, (40.0, 60.0, 80.0))}
# (label, routing, seconds between the router's load polls; 0: loads read at every dispatch)
ROUTERS = [("round-robin", "round-robin", 0.0),
           ("least-predicted-work", "least-predicted-work", 0.0),
           ("power-of-two, 1 s stale", "power-of-two", DEFAULT_LOAD_POLL_INTERVAL_S),
           ("power-of-two, fresh", "power-of-two", 0.0)]
BASELINE = "round-robin"
METRICS = (("short_p99_s", "short", "e2e_p99_s"), ("long_p99_s", "long", "e2e_p99_s"),
           ("all_p99_s", "all", "e2e_p99_s"), ("throughput_tok_s", "all", "throughput_tok_s"))
SHORT_THRESHOLD = 800  # output tokens, the serving study's


def simulate(args) -> None:
    path = os.path.join(args.output, "result.json")
    if written(path):
        return
    work = study.LabelSetWorkload()
    rows = []
    for (setup, (admission, rates)), trace_seed in itertools.product(SETUPS.items(), args.trace_seeds):
        base = study.cluster_for(CLUSTER, admission, KV_CAPACITY)
        for rate in rates:
            trace, cache = work.trace(rate, args.requests, trace_seed), {}
            for predictor, (label, routing, interval) in itertools.product(PREDICTORS, ROUTERS):
                if predictor not in cache:
                    cache[predictor] = work.predictions(predictor, trace, trace_seed)
                predictions, trajectories = cache[predictor]
                cluster = dataclasses.replace(base, load_poll_interval_s=interval)
                policy = Policy(routing_policy(routing), queue_policy(QUEUE))
                for router_seed in (args.router_seeds if routing == "power-of-two" else [0]):  # the others draw nothing
                    started = time.perf_counter()
                    result = Simulation(trace, predictions, cluster, policy, SchedulingConfig(), trajectories,
                                        router_seed).run()
                    metrics = summarize(result, SHORT_THRESHOLD)
                    rows.append({"setup": setup, "rate_rps": rate, "trace_seed": trace_seed, "predictor": predictor,
                                 "router": label, "router_seed": router_seed,
                                 **{name: metrics[cls][key] for name, cls, key in METRICS},
                                 "retractions": int(result.retractions.sum()),
                                 "sim_wall_s": time.perf_counter() - started})
                    print(f"{setup:17s} {rate:4g} rps seed {trace_seed} {predictor:10s} {label:24s} "
                          f"{router_seed:>2}  short P99 {rows[-1]['short_p99_s']:7.2f} s"
                          f"  thr {rows[-1]['throughput_tok_s']:7.0f}  ({rows[-1]['sim_wall_s']:.1f} s)", flush=True)
    result = {"command": " ".join(["python benchmarks/power_of_two_routing.py", *sys.argv[1:]]),
              "workload": work.name, "cluster": CLUSTER, "queue": QUEUE, "kv_capacity_tokens": KV_CAPACITY,
              "max_new_tokens": study.MAX_NEW_TOKENS, "requests": args.requests, "trace_seeds": args.trace_seeds,
              "router_seeds": args.router_seeds, "short_threshold": SHORT_THRESHOLD,
              "wall_s": sum(row["sim_wall_s"] for row in rows), "rows": rows}
    os.makedirs(args.output, exist_ok=True)
    write_text_atomic(path, json.dumps(result, indent=1))
    print(f"wrote {path}")


def ratios(result: dict) -> List[dict]:
    """Per setup, load, predictor and router: each metric's ratio to round robin on the same trace,
    the mean over the trace and router seeds, and the short P99 ratio's range."""
    rows = result["rows"]
    baseline = {(row["setup"], row["rate_rps"], row["trace_seed"], row["predictor"]): row
                for row in rows if row["router"] == BASELINE}
    out = []
    for setup, (_, rates) in SETUPS.items():
        for predictor, (label, _, _), rate in itertools.product(PREDICTORS, ROUTERS, rates):
            runs = [row for row in rows if (row["setup"], row["rate_rps"], row["predictor"], row["router"]) ==
                    (setup, rate, predictor, label)]
            if not runs:
                continue
            each = {name: [row[name] / baseline[(setup, rate, row["trace_seed"], predictor)][name] for row in runs]
                    for name, _, _ in METRICS}
            out.append({"setup": setup, "rate_rps": rate, "predictor": predictor, "router": label, "runs": len(runs),
                        **{name: float(np.mean(values)) for name, values in each.items()},
                        "short_p99_range": [float(min(each["short_p99_s"])), float(max(each["short_p99_s"]))],
                        "baseline": {name: float(np.mean([baseline[(setup, rate, seed, predictor)][name]
                                                          for seed in result["trace_seeds"]]))
                                     for name, _, _ in METRICS}})
    return out


def cell(row: dict) -> tuple:
    """The (admission, load, predictor) a ratio row is for."""
    return row["setup"], row["rate_rps"], row["predictor"]


def gaps_to_argmin(table: List[dict]) -> List[str]:
    """Per power-of-two variant, the range over every cell of its mean ratios less the argmin's."""
    argmin = {cell(row): row for row in table if row["router"] == "least-predicted-work"}
    lines = ["## Power-of-two less the exact argmin", "",
             "The range, over every admission, predictor and load below, of power-of-two's mean ratio less "
             "least-predicted-work's (negative: power-of-two lower)", "",
             "| router | short P99 | long P99 | all P99 | throughput |", "|---|---:|---:|---:|---:|"]
    for label, routing, _ in ROUTERS:
        if routing != "power-of-two":
            continue
        cells = []
        for name, _, _ in METRICS:
            gaps = [row[name] - argmin[cell(row)][name] for row in table if row["router"] == label]
            cells.append(f"{min(gaps):+.3f} to {max(gaps):+.3f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines + [""]


def report(args) -> None:
    path = os.path.join(args.output, "report.md")
    if written(path):
        return
    with open(os.path.join(args.output, "result.json")) as handle:
        result = json.load(handle)
    table = ratios(result)
    write_text_atomic(os.path.join(args.output, "ratios.json"), json.dumps(table, indent=1))
    lines = ["# sglang-router's power-of-two against the exact least-predicted-work argmin (simulated)", "",
             f"`{result['command']}`", "",
             f"The method's workload ({result['workload']}), {result['requests']} requests per run, trace seeds "
             f"{result['trace_seeds']}, power-of-two's router seeds {result['router_seeds']}; {result['cluster']} H100, "
             f"order {result['queue']}, max_new_tokens {result['max_new_tokens']}; KV by prediction in "
             f"{result['kv_capacity_tokens']} tokens per instance, or the full reservation in the GPU's cache; short = "
             f"fewer than {result['short_threshold']} output tokens. Simulated in {result['wall_s'] / 60:.1f} min.", "",
             "Each cell: short P99 [its range over the seeds] / long P99 / all P99 / throughput, as ratios to round "
             "robin with the same admission, order, predictor, trace and load (mean over the seeds).", ""]
    lines += gaps_to_argmin(table)
    for setup, (_, rates) in SETUPS.items():
        lines += [f"## {setup}", "", "| predictor | router | " + " | ".join(f"{rate:g} rps" for rate in rates) + " |",
                  "|---|---|" + "---:|" * len(rates)]
        for predictor, (label, _, _) in itertools.product(PREDICTORS, ROUTERS):
            if label == BASELINE:
                continue
            cells = []
            for rate in rates:
                row = next(r for r in table if (r["setup"], r["rate_rps"], r["predictor"], r["router"]) ==
                           (setup, rate, predictor, label))
                low, high = row["short_p99_range"]
                cells.append(f"{row['short_p99_s']:.2f} [{low:.2f}-{high:.2f}] / {row['long_p99_s']:.2f} / "
                             f"{row['all_p99_s']:.2f} / {row['throughput_tok_s']:.2f}")
            lines.append(f"| {predictor} | {label} | " + " | ".join(cells) + " |")
        lines += ["", "Round robin itself (mean over the trace seeds): short P99 s / long P99 s / all P99 s / tok/s", "",
                  "| predictor | " + " | ".join(f"{rate:g} rps" for rate in rates) + " |", "|---|" + "---:|" * len(rates)]
        for predictor in PREDICTORS:
            cells = []
            for rate in rates:
                base = next(r for r in table if (r["setup"], r["rate_rps"], r["predictor"]) ==
                            (setup, rate, predictor))["baseline"]
                cells.append(f"{base['short_p99_s']:.1f} / {base['long_p99_s']:.1f} / {base['all_p99_s']:.1f} / "
                             f"{base['throughput_tok_s']:.0f}")
            lines.append(f"| {predictor} | " + " | ".join(cells) + " |")
        lines.append("")
    write_text_atomic(path, "\n".join(lines))
    print(f"wrote {path}")


STAGES = {"simulate": simulate, "report": report}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", default=os.path.join(REPO, "benchmarks", "data", "power-of-two"))
    parser.add_argument("--stages", nargs="+", choices=list(STAGES), default=list(STAGES))
    parser.add_argument("--requests", type=int, default=6000, help="requests per run (the serving study's)")
    parser.add_argument("--trace-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--router-seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    args = parser.parse_args()
    for stage in args.stages:
        STAGES[stage](args)


if __name__ == "__main__":
    main()
