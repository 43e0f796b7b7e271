"""Routing rules side by side on the regime map's colocated cluster: does a rule that reads the prediction lose to
SGLang's prediction-free balancing anywhere?

Each cell (load, seed) draws the map's trace (``regime_map.cells.sample_trace``: the label set's samples, Poisson
arrivals at a fraction of ``capacity.json``'s capacity) and runs SGLang's prediction-free routings (round robin,
``total_requests``, ``total_tokens``) once, and the routings that read r̂₀ (least predicted work, least requests
then work) with every rung of ``RUNGS``. Only the routing differs within a stack (``STACKS``: SGLang's FCFS and
admission, and the plugin's default queue and KV admission); the peers always run SGLang's FCFS and admission, as
the map's do. A cell's JSON is shaped as the map's, so ``regime_map.report.summarize_cell`` gives the ratios to the
best peer per metric (steady window, mean over seeds of the per-seed ratio). A cell's JSON is written after each
run and a rerun simulates only what it lacks.
"""

from __future__ import annotations

import json
import os
import time
from typing import Dict, List, Tuple

import numpy as np

from specforge_outlets.atomic import write_text_atomic
from specforge_outlets.scheduling import KVAdmission
from specforge_outlets.studies.predictor_ladder.cells import Setup
from specforge_outlets.studies.predictor_ladder.rungs import RUNGS as LADDER_RUNGS
from specforge_outlets.studies.regime_map.cells import run_record, sample_trace, simulate_run
from specforge_outlets.studies.regime_map.metrics import WINDOW
from specforge_outlets.studies.regime_map.regimes import AT_PREFILL, CLUSTERS, Configuration, load_label
from specforge_outlets.studies.regime_map.report import summarize_cell

CLUSTER = "colocated x4"  # the map's cluster where least predicted work lost P99 TTFT to total_requests
ARRIVALS = "poisson"
# SGLang's prediction-free --load-balance-method choices, by its spelling, as the simulator names them
PEERS = {"SGLang round_robin": "round-robin", "SGLang total_requests": "least-requests",
         "SGLang total_tokens": "total-tokens"}
PREDICTED = ("least-predicted-work", "least-requests-then-work")  # the routings that read r̂₀
# the ladder's rungs from no information to all of it, its two controls included
RUNGS = ("none", "constant", "outlets r0 shuffled", "outlets r0", "oracle")
# (queue order, KV admission) under which the predicted routings run: SGLang's, so that only the routing differs,
# and the plugin's default when the study ran (the peak; SGLang's admission since the regime map)
STACKS: Dict[str, Tuple[str, KVAdmission]] = {"fcfs": ("fcfs", KVAdmission.SGLANG),
                                              "plugin default": ("tail-safe", KVAdmission.PEAK)}
LEARNED = "outlets r0"
TOTAL_REQUESTS = "SGLang total_requests"  # the peer --load-balance-method outlets must never lose to
# the references of the two bars, and the key of each run's ratios to it
REFERENCES = {"the best peer per metric": "ratio", TOTAL_REQUESTS: "ratio_to_total_requests"}
WITHIN = 1.02  # the bar: every figure within this ratio of the best peer's (goodput: at least its inverse)
HEADLINE = ("ttft_mean_s", "ttft_p99_s", "short_p99_s", "long_p99_s", "goodput_rps")


def run_plan(stacks: List[str]) -> List[Tuple[str, str, Configuration, str]]:
    """(label, configuration name, configuration, rung) of every run of a cell, peers first."""
    plan = [(name, name, Configuration(Setup(routing, "fcfs", KVAdmission.SGLANG)), "none")
            for name, routing in PEERS.items()]
    for stack in stacks:
        queue, admission = STACKS[stack]
        for routing in PREDICTED:
            name = f"{routing} · {stack}"
            plan += [(f"{name} | {rung}", name, Configuration(Setup(routing, queue, admission)), rung)
                     for rung in RUNGS]
    return plan


def cell_path(output: str, load: float, seed: int) -> str:
    return os.path.join(output, "cells", f"colocated-{load:g}cap-seed{seed}.json")


def simulate_cell(work, load: float, seed: int, capacity: float, requests: int, stacks: List[str],
                  path: str) -> int:
    """Every run of a cell not yet in its JSON; returns the number simulated."""
    done: Dict[str, dict] = {}
    if os.path.exists(path):
        with open(path) as handle:
            done = {run["label"]: run for run in json.load(handle)["runs"]}
    rate = capacity * load
    trace, drawn = sample_trace(work, ARRIVALS, rate, capacity, requests, seed)
    cluster = CLUSTERS[CLUSTER]()
    cell = {"regime": "colocated", "cluster": CLUSTER, "arrivals": ARRIVALS, "shape": requests, "load": load,
            "load_label": load_label(load), "capacity_rps": capacity, "rate_rps": round(rate, 3), "seed": seed,
            "window": WINDOW, "ttft": "as SGLang reports it", "prediction_pass_s": 0.0, "runs": []}
    predictions: Dict[str, list] = {}
    simulated = 0
    for label, name, configuration, rung in run_plan(stacks):
        if label not in done:
            if rung not in predictions:
                predictions[rung] = LADDER_RUNGS[rung](work, trace, drawn, seed)
            started = time.perf_counter()
            result = simulate_run(trace, predictions[rung], cluster, configuration)
            done[label] = run_record((label, name, configuration, rung, AT_PREFILL), result, trace.arrival_times,
                                     False, time.perf_counter() - started)
            simulated += 1
        cell["runs"].append(done[label])
        write_text_atomic(path, json.dumps(cell, separators=(",", ":")))
    return simulated


def simulate(args, work) -> None:
    """Every cell, stack-major then seed-major: the first stack's first seed is whole first."""
    with open(args.capacity) as handle:
        capacity = json.load(handle)[CLUSTER]["capacity_rps"]
    for count in range(1, len(args.stacks) + 1):
        for seed in args.seeds:
            for load in args.loads:
                started = time.perf_counter()
                made = simulate_cell(work, load, seed, capacity, args.requests, args.stacks[:count],
                                     cell_path(args.output, load, seed))
                if made:
                    print(f"stacks {args.stacks[:count]}, load {load:g}, seed {seed}: {made} runs, "
                          f"{time.perf_counter() - started:.0f} s", flush=True)


def verdict(ratios: Dict[str, float]) -> bool:
    """Whether every headline figure is within ``WITHIN`` of the reference's."""
    return all(ratios[metric] >= 1 / WITHIN if metric == "goodput_rps" else ratios[metric] <= WITHIN
               for metric in HEADLINE)


def ratios_to(seeds: List[dict], reference: str) -> Dict[str, Dict[str, float]]:
    """Every run's headline figures over ``reference``'s on the same trace (steady window), mean over seeds."""
    runs = [{run["label"]: run["steady"] for run in cell["runs"]} for cell in seeds]
    return {label: {metric: float(np.mean([seed[label][metric] / seed[reference][metric] for seed in runs]))
                    for metric in HEADLINE} for label in runs[0]}


def report(args) -> dict:
    """``result.json`` and ``table.md``: each run's ratios to the best peer per metric and to ``total_requests``,
    and whether each predicted routing with OUTLETS r̂₀ is within the bar against each at every load (the runs of
    ``args.stacks`` only: a cell may hold other stacks' too)."""
    planned = {label for label, *_ in run_plan(args.stacks)}
    groups: Dict[float, List[dict]] = {}
    for seed in args.seeds:
        for load in args.loads:
            with open(cell_path(args.output, load, seed)) as handle:
                cell = json.load(handle)
            cell["runs"] = [run for run in cell["runs"] if run["label"] in planned]  # the stacks asked for
            groups.setdefault(load, []).append(cell)
    cells = []
    for _, seeds in sorted(groups.items()):
        cell = summarize_cell(seeds)
        for label, ratio in ratios_to(seeds, TOTAL_REQUESTS).items():
            cell["runs"][label]["ratio_to_total_requests"] = ratio
        cells.append(cell)
    labels = [label for label, run in cells[0]["runs"].items() if run["rung"] == LEARNED]
    passes = {reference: {label: all(verdict(cell["runs"][label][key]) for cell in cells) for label in labels}
              for reference, key in REFERENCES.items()}
    result = {"cluster": CLUSTER, "arrivals": ARRIVALS, "requests": args.requests, "seeds": args.seeds,
              "stacks": args.stacks,
              "window": WINDOW, "bar": f"every one of {', '.join(HEADLINE)} within {WITHIN}x of the reference's",
              "within_bar_with_outlets_r0": passes, "cells": cells}
    os.makedirs(args.output, exist_ok=True)
    write_text_atomic(os.path.join(args.output, "result.json"), json.dumps(result, indent=1))
    write_text_atomic(os.path.join(args.output, "table.md"), table(cells, passes, args))
    return result


def table(cells: List[dict], passes: Dict[str, Dict[str, bool]], args) -> str:
    columns = " | ".join(["mean TTFT", "P99 TTFT", "short P99", "long P99", "goodput", f"within {WITHIN}x"])
    lines = [f"# Routing rules on the regime map's {CLUSTER} ({ARRIVALS}, {args.requests} requests, seeds "
             f"{', '.join(map(str, args.seeds))})", "",
             f"Steady window ({WINDOW}); each figure the mean over seeds of its ratio to the reference's on the same "
             "trace: first the best prediction-free peer per metric (by its mean over seeds), then SGLang's "
             "`total_requests`. Goodput: higher is better. Peers run SGLang's FCFS and admission; the stack after "
             "`·` is the predicted routing's queue and KV admission.", "",
             f"| load | run | {columns} | {columns} |", "|---|---|" + "---|" * 12]
    for cell in cells:
        for label, run in cell["runs"].items():
            parts = [" | ".join(f"{run[key][metric]:.2f}" for metric in HEADLINE)
                     + f" | {'yes' if verdict(run[key]) else 'no'}" for key in REFERENCES.values()]
            lines.append(f"| {cell['load']:g} ({cell['rate_rps']:g} rps) | {label} | {' | '.join(parts)} |")
    lines += ["", "Best peer per metric, by load:", ""]
    lines += [f"- {cell['load']:g}: " + ", ".join(f"{metric} {cell['best_peer'][metric]}" for metric in HEADLINE)
              for cell in cells]
    for reference, verdicts in passes.items():
        lines += ["", f"With OUTLETS r̂₀, within {WITHIN}x of {reference} at every load:", ""]
        lines += [f"- {label}: {'yes' if ok else 'no'}" for label, ok in verdicts.items()]
    return "\n".join(lines) + "\n"
