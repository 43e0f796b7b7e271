"""A cell of the ladder: one workload, cache, load and seed, every peer and every configuration with every rung.

A cell's JSON is written after each run, and a rerun simulates only the runs a cell lacks; ``simulate``
runs the knees first, so an interrupted study leaves whole figures behind.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Dict, List, Optional, Tuple

from specforge_outlets.atomic import write_text_atomic
from specforge_outlets.scheduling import SchedulingConfig
from specforge_outlets.serving.trace import Trace
from specforge_outlets.simulation.cluster import KVAdmission
from specforge_outlets.simulation.engine import Policy, Simulation
from specforge_outlets.simulation.sglang_peers import queue_policy, routing_policy
from specforge_outlets.simulation.study import summarize
from specforge_outlets.studies import sharegpt_serving as study
from specforge_outlets.studies.predictor_ladder.rungs import RUNGS, workloads

SHORT_THRESHOLD = 800  # a short request has fewer output tokens (the method's threshold)
# KV tokens per instance: the binding cache of the admission study, or the GPU's own (None: from memory)
REGIMES = {"100k": 100_000, "gpu": None}
LOAD_NAMES = ("knee", "past")  # --loads: the two of LOADS
# (knee, past it) in requests/s per workload and cache: where SGLang's default throughput stops growing with the
# load (measured at 6,000 requests, seed 0; docs/admission.md)
LOADS = {("sharegpt-smollm2", "100k"): (40.0, 60.0), ("sharegpt-smollm2", "gpu"): (80.0, 120.0),
         ("sharegpt-chatgpt", "100k"): (16.0, 24.0), ("sharegpt-chatgpt", "gpu"): (24.0, 32.0),
         ("azure-conv", "100k"): (40.0, 60.0), ("azure-conv", "gpu"): (60.0, 80.0)}


@dataclasses.dataclass(frozen=True)
class Setup:
    """Routing, queue order, KV admission and SGLang's ratio knobs (conservativeness, min factor, decay steps)."""

    routing: str
    queue: str
    admission: KVAdmission
    knobs: Tuple[float, float, int] = (1.0, 0.14, 600)


# The plugin's configurations, each run with every rung: its default when the ladder ran (KV admitted by the
# predicted future peak; SGLang's own admission is the default since the regime map), the charge (the one before),
# the order alone under SGLang's admission, SJF instead of tail-safe
CONFIGS = {
    "peak, the default (tail-safe + KV by the predicted peak)": Setup("least-predicted-work", "tail-safe",
                                                                       KVAdmission.PEAK),
    "charge (tail-safe + KV by prediction)": Setup("least-predicted-work", "tail-safe", KVAdmission.PREDICTED),
    "order only (tail-safe, SGLang's admission)": Setup("least-predicted-work", "tail-safe", KVAdmission.SGLANG),
    "sjf + KV by prediction": Setup("least-predicted-work", "sjf", KVAdmission.PREDICTED),
}
# SGLang's ratio knobs tuned: (--schedule-conservativeness, SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR,
# SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS); SGLang's defaults first
KNOB_GRID = [(c, f, d) for c in (1.0, 0.5) for f, d in ((0.14, 600), (0.05, 150))]
BALANCING = {"total_requests": "least-requests", "total_tokens": "total-tokens"}
SGLANG_DEFAULT = "SGLang default (round robin + fcfs)"
PEERS = {
    SGLANG_DEFAULT: Setup("round-robin", "fcfs", KVAdmission.SGLANG),
    **{f"SGLang {name} c{c:g} f{f:g} d{d}": Setup(routing, "fcfs", KVAdmission.SGLANG, (c, f, d))
       for name, routing in BALANCING.items() for c, f, d in KNOB_GRID},
    # the prediction-free past-future admission (the peak with every end from the instance's history of lengths)
    **{f"past-future {name} + fcfs": Setup(routing, "fcfs", KVAdmission.PAST_FUTURE)
       for name, routing in {"round robin": "round-robin", "total_requests": "least-requests"}.items()},
    "vLLM default (round robin + fcfs)": Setup("round-robin", "fcfs", KVAdmission.VLLM),
}
# the reference of every ratio: SGLang's default and SGLang tuned by its own knobs
SGLANG_PEERS = [label for label in PEERS if label.startswith("SGLang")]
PAST_FUTURE_PEERS = [label for label in PEERS if label.startswith("past-future")]


def cluster_of(setup: Setup, kv_capacity: Optional[int]):
    base = study.cluster_for("colocated x4", KVAdmission.PREDICTED, 100_000)
    conservativeness, min_factor, decay_steps = setup.knobs
    return dataclasses.replace(base, kv_admission=setup.admission, kv_capacity_tokens=kv_capacity,
                               schedule_conservativeness=conservativeness, min_new_token_ratio_factor=min_factor,
                               new_token_ratio_decay_steps=decay_steps)


def run(trace: Trace, predictions, setup: Setup, kv_capacity: Optional[int]) -> dict:
    started = time.perf_counter()
    policy = Policy(routing_policy(setup.routing), queue_policy(setup.queue))
    result = Simulation(trace, predictions, cluster_of(setup, kv_capacity), policy, SchedulingConfig()).run()
    metrics = summarize(result, SHORT_THRESHOLD)
    return {"short_p99_s": round(metrics["short"]["e2e_p99_s"], 3),
            "long_p99_s": round(metrics["long"]["e2e_p99_s"], 3),
            "throughput_tok_s": round(metrics["all"]["throughput_tok_s"], 1),
            "retractions": int(result.retractions.sum()), "wall_s": round(time.perf_counter() - started, 2)}


def cell_path(output: str, workload: str, regime: str, rate: float, seed: int) -> str:
    return os.path.join(output, "cells", f"{workload}-{regime}-{rate:g}rps-seed{seed}.json")


def simulate_cell(work, regime: str, rate: float, seed: int, requests: int, path: str) -> None:
    """Every run of a cell, the cell written after each (a session that ends loses one run at most); a cell written
    before keeps its runs, and only the runs it lacks are simulated and added."""
    done = {}
    if os.path.exists(path):
        with open(path) as handle:
            done = by_label(json.load(handle))
    trace, drawn = work.trace(rate, requests, seed)
    capacity = REGIMES[regime]
    cell = {"workload": work.name, "regime": regime, "kv_capacity_tokens": capacity, "rate_rps": rate, "seed": seed,
            "requests": requests, "runs": []}

    def add(label: str, identity: dict, predictions, setup: Setup) -> dict:
        cell["runs"].append(done.get(label) or {**identity, **run(trace, predictions, setup, capacity)})
        write_text_atomic(path, json.dumps(cell, separators=(",", ":")))
        return cell["runs"][-1]

    for label, setup in PEERS.items():
        result = add(label, {"peer": label}, [None] * len(trace), setup)
        print(f"  {label:52s} short P99 {result['short_p99_s']:7.2f} s  ({result['wall_s']:.1f} s)", flush=True)
    for rung, predict in RUNGS.items():
        predictions = predict(work, trace, drawn, seed)
        for config, setup in CONFIGS.items():
            result = add(f"{config} | {rung}", {"config": config, "rung": rung}, predictions, setup)
            print(f"  {config:44s} {rung:20s} short P99 {result['short_p99_s']:7.2f} s  "
                  f"retractions {result['retractions']:4d}  ({result['wall_s']:.1f} s)", flush=True)


def complete(path: str) -> bool:
    """Whether a cell holds every run of today's peers, configurations and rungs."""
    if not os.path.exists(path):
        return False
    with open(path) as handle:
        done = by_label(json.load(handle))
    return all(label in done for label in PEERS) and all(f"{config} | {rung}" in done
                                                         for config in CONFIGS for rung in RUNGS)


def simulate(args) -> None:
    """The cells, knees first (every workload, cache and seed), then past the knees: an interrupted run leaves
    whole figures behind, and a rerun resumes at the first cell not complete."""
    cells = [(name, regime, LOADS[(name, regime)][LOAD_NAMES.index(load)], seed) for load in args.loads
             for seed in args.seeds
             for name in args.workloads for regime in args.regimes]
    made: Dict[str, object] = {}
    for number, (name, regime, rate, seed) in enumerate(cells, 1):
        path = cell_path(args.output, name, regime, rate, seed)
        if complete(path):
            continue
        if name not in made:
            made[name] = workloads([name], args.record)[name]()
        print(f"[{number}/{len(cells)}] {name} {regime} {rate:g} rps seed {seed}", flush=True)
        started = time.perf_counter()
        simulate_cell(made[name], regime, rate, seed, args.requests, path)
        print(f"[{number}/{len(cells)}] done in {time.perf_counter() - started:.0f} s", flush=True)


def read_cells(output: str) -> Dict[Tuple[str, str, float], List[dict]]:
    """The complete cells by (workload, cache, load), one per seed, seeds in order (one still running is left out)."""
    cells: Dict[Tuple[str, str, float], List[dict]] = {}
    folder = os.path.join(output, "cells")
    for file in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if not complete(os.path.join(folder, file)):
            print(f"{file}: not complete, left out", flush=True)
            continue
        with open(os.path.join(folder, file)) as handle:
            cell = json.load(handle)
        cells.setdefault((cell["workload"], cell["regime"], cell["rate_rps"]), []).append(cell)
    for seeds in cells.values():
        seeds.sort(key=lambda cell: cell["seed"])
    return cells


def by_label(cell: dict) -> Dict[str, dict]:
    return {run.get("peer") or f"{run['config']} | {run['rung']}": run for run in cell["runs"]}
