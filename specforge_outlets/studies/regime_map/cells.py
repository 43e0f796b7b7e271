"""A cell of the map: one regime, shape, load and seed; SGLang's peers, and every prediction configuration with its
rungs (a batch: at every prediction point).

A cell's JSON is written after each run, and a rerun simulates only the runs a cell lacks or whose configuration
changed (its routing, order, admission, knobs or --max-running-requests); ``simulate`` runs seed 0 of every cell
before any other seed, so an interrupted map is whole at its first seed. Capacities are measured once per cluster
(``capacity.json``) and kept.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Dict, List, Optional, Tuple

import numpy as np

from specforge_outlets.atomic import write_text_atomic
from specforge_outlets.scheduling import SchedulingConfig
from specforge_outlets.serving.trace import Trace
from specforge_outlets.simulation.engine import Policy, Simulation
from specforge_outlets.simulation.sglang_peers import queue_policy, routing_policy
from specforge_outlets.studies.predictor_ladder.cells import SGLANG_DEFAULT
from specforge_outlets.studies.predictor_ladder.rungs import RUNGS as LADDER_RUNGS
from specforge_outlets.studies.regime_map.arrivals import ARRIVALS
from specforge_outlets.studies.regime_map.capacity import bisect_capacity, served_share
from specforge_outlets.studies.regime_map.metrics import WINDOW, prediction_pass_s, run_figures
from specforge_outlets.studies.regime_map.requests import DRAWS
from specforge_outlets.studies.regime_map.regimes import (
    AT_ARRIVAL,
    AT_PREFILL,
    CAPACITY_HINTS,
    CAPACITY_REQUESTS,
    CLUSTERS,
    LONG_LOAD,
    POINTS,
    REGIMES,
    Configuration,
    Regime,
    load_label,
    peers,
    prediction_configs,
)


def sample_trace(work, arrivals: str, rate: float, capacity: float, count: int, seed: int, draw: str = "uniform"
                 ) -> Tuple[Trace, np.ndarray]:
    """``count`` samples of the workload by the named draw (``uniform``: as the ladder's Poisson traces draw them,
    which this reproduces for ``poisson``), arriving by the named process at a mean of ``rate``."""
    rng = np.random.default_rng(seed)
    drawn = DRAWS[draw][0](rng, work, count)
    times = ARRIVALS[arrivals](rng, rate, capacity, count, seed)
    trace = Trace(f"{work.name}-{arrivals}-{rate:g}rps", [f"{work.ids[i]}#{n}" for n, i in enumerate(drawn)], times,
                  work.input_lens[drawn], work.output_lens[drawn])
    return trace, drawn


def simulate_run(trace: Trace, predictions, cluster, configuration: Configuration):
    setup = configuration.setup
    policy = Policy(routing_policy(setup.routing), queue_policy(setup.queue))
    return Simulation(trace, predictions, configuration.cluster(cluster), policy, SchedulingConfig()).run()


def capacities(output: str, work, clusters: List[str], requests: int) -> Dict[str, dict]:
    """Each cluster's capacity (``capacity.bisect_capacity`` under SGLang's default), measured once and kept."""
    path = os.path.join(output, "capacity.json")
    made: Dict[str, dict] = {}
    if os.path.exists(path):
        with open(path) as handle:
            made = json.load(handle)
    for name in clusters:
        if name in made:
            continue
        cluster, default = CLUSTERS[name](), peers(CLUSTERS[name]().mode)[SGLANG_DEFAULT]

        def share_at(rate: float) -> float:
            trace, _ = sample_trace(work, "poisson", rate, rate, requests, 0)
            return served_share(simulate_run(trace, [None] * len(trace), cluster, default))

        started = time.perf_counter()
        made[name] = {**bisect_capacity(share_at, CAPACITY_HINTS[name]), "requests": requests, "seed": 0,
                      "peer": SGLANG_DEFAULT}
        print(f"capacity of {name}: {made[name]['capacity_rps']:g} rps ({time.perf_counter() - started:.0f} s)",
              flush=True)
        os.makedirs(output, exist_ok=True)
        write_text_atomic(path, json.dumps(made, indent=1))
    return made


def slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-").replace("--", "-")


def cell_path(output: str, regime: str, shape: int, load: Optional[float], seed: int) -> str:
    load_part = "batch" if load is None else f"{load:g}cap"
    return os.path.join(output, "cells", f"{slug(regime)}-{shape}-{load_part}-seed{seed}.json")


def run_plan(regime: Regime) -> List[Tuple[str, str, Configuration, str, str, Optional[str]]]:
    """Every run of a cell: (label, configuration name, configuration, rung, prediction point, the peer it is
    layered on), peers first."""
    mode = CLUSTERS[regime.cluster]().mode
    plan = [(name, name, configuration, "none", AT_PREFILL, None) for name, configuration in peers(mode).items()]
    points = list(POINTS) if regime.batch else [AT_PREFILL]
    configs = prediction_configs(mode, regime.batch)
    for point in points:
        for name, config in configs.items():
            for rung in config.rungs:
                if rung == "none" and point != AT_PREFILL:
                    continue  # nothing to predict, nothing to charge
                label = f"{name} | {rung}" + (f" | {point}" if regime.batch else "")
                plan.append((label, name, config.configuration, rung, point, config.over))
    return plan


def settings_of(configuration: Configuration) -> dict:
    """What a run of a configuration records of it; a run recorded with other settings is simulated anew."""
    setup = configuration.setup
    return {"routing": setup.routing, "queue": setup.queue, "admission": setup.admission.value,
            "knobs": list(setup.knobs), "max_running_requests": configuration.max_running_requests}


def current(run: Optional[dict], configuration: Configuration) -> bool:
    """Whether a recorded run was made with the configuration's settings."""
    return run is not None and all(run.get(key) == value for key, value in settings_of(configuration).items())


def run_record(planned: Tuple[str, str, Configuration, str, str], result, submitted: np.ndarray, batch: bool,
               wall_s: float, over: Optional[str] = None) -> dict:
    """A run's entry in its cell: what ran (a ``run_plan`` row; ``over``: the peer it is layered on), its settings,
    its figures (``metrics.run_figures``), its retractions and the seconds it took to simulate."""
    label, name, configuration, rung, point = planned
    return {"label": label, "config": name, "rung": rung, "point": point, "over": over,
            **settings_of(configuration), **run_figures(result, submitted, batch),
            "retractions": int(result.retractions.sum()), "wall_s": round(wall_s, 2)}


def simulate_cell(work, regime_name: str, shape: int, load: Optional[float], seed: int, capacity: float,
                  path: str) -> int:
    """Every run of a cell, the cell written after each; a cell written before keeps its runs and only those it
    lacks, or recorded under other settings, are simulated. Returns the number simulated."""
    regime = REGIMES[regime_name]
    done: Dict[str, dict] = {}
    if os.path.exists(path):
        with open(path) as handle:
            done = {run["label"]: run for run in json.load(handle)["runs"]}
    rate = capacity * (load if load is not None else 1.0)
    trace, drawn = sample_trace(work, regime.arrivals, rate, capacity, shape, seed, regime.draw)
    cluster = CLUSTERS[regime.cluster]()
    pass_s = prediction_pass_s(cluster, DRAWS[regime.draw][1](work, drawn)) if regime.batch else 0.0
    cell = {"regime": regime_name, "cluster": regime.cluster, "arrivals": regime.arrivals, "shape": shape,
            "load": load, "load_label": load_label(load), "capacity_rps": capacity,
            "rate_rps": None if regime.batch else round(rate, 3), "seed": seed,
            "window": "the whole batch, from its submission" if regime.batch else WINDOW,
            "ttft": "as SGLang reports it (PD: the first decode batch)", "prediction_pass_s": round(pass_s, 3),
            "runs": []}
    predictions: Dict[str, list] = {}
    simulated = 0
    for label, name, configuration, rung, point, over in run_plan(regime):
        if not current(done.get(label), configuration):
            if rung not in predictions:
                predictions[rung] = LADDER_RUNGS[rung](work, trace, drawn, seed)
            predict_at, charged = POINTS[point]
            submitted = trace.arrival_times
            run_trace = dataclasses.replace(trace, arrival_times=submitted + pass_s) if charged else trace
            started = time.perf_counter()
            result = simulate_run(run_trace, predictions[rung], dataclasses.replace(cluster, predict_at=predict_at),
                                  configuration)
            done[label] = run_record((label, name, configuration, rung, point), result, submitted, regime.batch,
                                     time.perf_counter() - started, over)
            simulated += 1
        cell["runs"].append(done[label])
        write_text_atomic(path, json.dumps(cell, separators=(",", ":")))
    return simulated


def shapes_and_loads(args, regime: Regime, work) -> List[Tuple[int, Optional[float]]]:
    """A regime's (shape, load) cells: a batch's sizes (prompt groups: the whole workload, each prompt once), or
    the online shape at every load, and a long trace at LONG_LOAD where the regime has one."""
    if regime.batch and regime.draw == "prompt groups":
        return [(len(work.ids), None)]
    if regime.batch:
        return [(shape, None) for shape in args.batch_shapes]
    long = [(args.long_requests, LONG_LOAD)] if regime.long_trace and args.long_requests else []
    return [(args.requests, load) for load in args.loads] + long


def cell_list(args, capacity: Dict[str, dict], work) -> List[Tuple[str, int, Optional[float], int, float]]:
    """(regime, shape, load, seed, capacity) of every cell, seed-major: a first seed's map is whole first."""
    cells = []
    for seed in args.seeds:
        for name in args.regimes:
            regime = REGIMES[name]
            cells += [(name, shape, load, seed, capacity[regime.cluster]["capacity_rps"])
                      for shape, load in shapes_and_loads(args, regime, work)]
    return cells


def complete(path: str, regime: Regime) -> bool:
    if not os.path.exists(path):
        return False
    with open(path) as handle:
        done = {run["label"]: run for run in json.load(handle)["runs"]}
    return all(current(done.get(label), configuration) for label, _, configuration, *_ in run_plan(regime))


def simulate(args, work=None) -> int:
    """Capacities, then every cell not complete; returns the runs simulated."""
    if work is None:
        from specforge_outlets.studies.label_set_samples import LabelSetSamples

        work = LabelSetSamples(args.record)
    clusters = list(dict.fromkeys(REGIMES[name].cluster for name in args.regimes))
    capacity = capacities(args.output, work, clusters, CAPACITY_REQUESTS)
    cells = cell_list(args, capacity, work)
    simulated = 0
    for number, (name, shape, load, seed, cap) in enumerate(cells, 1):
        path = cell_path(args.output, name, shape, load, seed)
        if complete(path, REGIMES[name]):
            continue
        started = time.perf_counter()
        simulated += simulate_cell(work, name, shape, load, seed, cap, path)
        print(f"[{number}/{len(cells)}] {name}, {shape} requests, load {load}, seed {seed}: "
              f"{time.perf_counter() - started:.0f} s", flush=True)
    return simulated


def read_cells(output: str) -> List[dict]:
    folder = os.path.join(output, "cells")
    cells = []
    for file in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        with open(os.path.join(folder, file)) as handle:
            cell = json.load(handle)
        if complete(os.path.join(folder, file), REGIMES[cell["regime"]]):
            cells.append(cell)
        else:
            print(f"{file}: not complete, left out", flush=True)
    return cells
