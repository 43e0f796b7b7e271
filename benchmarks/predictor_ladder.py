"""The ladder of predictors: does better prediction give better serving, against SGLang at its best?

Rungs (``RUNGS``), from no information to all of it: none; a constant (the train split's median,
261 tokens); OUTLETS r̂₀ shuffled across requests (its values, no per-request information); the
learned predictors' r̂₀ (the MiniLM regressor ``bert``, OUTLETS, the N/2 probe ``probe-mid``); the
per-prompt ceiling (each sample predicted by the mean of its prompt's other samples: the best a
predictor of the prompt alone can do, up to the noise of three samples); the oracle. Each rung runs
under every scheduler configuration that reads predictions (``CONFIGS``), beside the peers that read
none (``PEERS``): SGLang's and vLLM's defaults and SGLang tuned by its own knobs (a grid of
``--schedule-conservativeness``, ``SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR`` and
``SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS`` with ``total_requests`` / ``total_tokens`` balancing).

Workloads: the label set with its four samples per prompt (the test response and three regenerated
ones, ``noise-seed*.jsonl.gz``: 253 prompts of the evaluation record, every rung's values known per
sample, requests drawn uniformly from the 1,012 samples), and ``serving_study_sharegpt.py``'s
``sharegpt-chatgpt`` and ``azure-conv`` (../shared, read, never copied), where each rung's values
carry the errors it made on the label set's samples at a similar true length (``with_measured_errors``).
Azure's recorded arrivals are one trace: a seed takes its own window of ``--requests`` requests.
Caches (``REGIMES``): 4 colocated H100 instances of 100,000 KV tokens (the cache binds, as
``admission_study.py``) or of the GPU's own (454k tokens). Loads: each workload's knee and past it.

Stages, each resumable (a cell's JSON is kept and skipped; delete it to run again):

- ``simulate``: one JSON per (workload, cache, load, seed) under ``cells/``, every run in it (written after each
  run; a rerun simulates only the runs a cell lacks);
- ``quality``: each rung's censoring-aware C-index per workload (``quality-<workload>.json``);
- ``report``: ``report.md``, every ratio to the best SGLang peer at that load (mean [range] over seeds);
- ``plot``: ``docs/figures/predictor-ladder.png``, gain against prediction quality, one line per configuration.

    OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python benchmarks/predictor_ladder.py          # every stage
    .venv/bin/python benchmarks/predictor_ladder.py report plot                             # from the cells written

The converged drafts' rungs (``convergence.py test``'s record; the trace draws from its prompts, so
every run of a cell, peers too, is its own):

    .venv/bin/python benchmarks/predictor_ladder.py --workloads sharegpt-smollm2 --regimes 100k \
        --record benchmarks/data/sharegpt-smollm2/convergence/eval/predictions.jsonl.gz \
        --output benchmarks/data/predictor-ladder-converged --figure docs/figures/predictor-ladder-converged.png
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from specforge_outlets.studies import sharegpt_serving as study  # noqa: E402
from specforge_outlets.studies.committed_data import EVAL_RECORD  # noqa: E402
from specforge_outlets.studies.label_set_samples import LEARNED, LabelSetSamples  # noqa: E402
from specforge_outlets.atomic import write_text_atomic  # noqa: E402
from specforge_outlets.evaluation.censoring import CensoredRequests, c_index  # noqa: E402
from specforge_outlets.scheduling import SchedulingConfig  # noqa: E402
from specforge_outlets.serving.trace import Trace  # noqa: E402
from specforge_outlets.simulation.cluster import KVAdmission  # noqa: E402
from specforge_outlets.simulation.engine import Policy, Simulation  # noqa: E402
from specforge_outlets.simulation.predicted_lengths import (  # noqa: E402
    constant_predictions,
    mean_rescaled_predictions,
    shuffled_predictions,
    with_measured_errors,
)
from specforge_outlets.simulation.sglang_peers import queue_policy, routing_policy  # noqa: E402
from specforge_outlets.simulation.study import summarize  # noqa: E402

OUTPUT = os.path.join(REPO, "benchmarks", "data", "predictor-ladder")
FIGURE = os.path.join(REPO, "docs", "figures", "predictor-ladder.png")
CAP = study.MAX_NEW_TOKENS  # a response cut at the label set's limit ran this long
SHORT_THRESHOLD = 800
# KV tokens per instance: the binding cache of the admission study, or the GPU's own (None: from memory)
REGIMES = {"100k": 100_000, "gpu": None}
LOAD_NAMES = ("knee", "past")  # --loads: the two of LOADS
# (knee, past it) in requests/s per workload and cache: where SGLang's default throughput stops growing with the
# load (measured at 6,000 requests, seed 0; docs/admission.md)
LOADS = {("sharegpt-smollm2", "100k"): (40.0, 60.0), ("sharegpt-smollm2", "gpu"): (80.0, 120.0),
         ("sharegpt-chatgpt", "100k"): (16.0, 24.0), ("sharegpt-chatgpt", "gpu"): (24.0, 32.0),
         ("azure-conv", "100k"): (40.0, 60.0), ("azure-conv", "gpu"): (60.0, 80.0)}


# -- workloads: requests, and each rung's values for them --------------------------------------------


class TransferredErrors:
    """A lengths-only workload of the serving study; each rung's values carry the errors it made on the label set's
    samples at a similar true length (a rung is drawn with its own generator, so adding one changes no other)."""

    def __init__(self, name: str, label_set: LabelSetSamples) -> None:
        self.name, self.label_set = name, label_set
        self.source = study.workloads()[name]()
        self.train_median = label_set.train_median

    def trace(self, rate_rps: float, count: int, seed: int) -> Tuple[Trace, None]:
        if not self.source.recorded_arrivals:
            return self.source.trace(rate_rps, count, seed), None
        whole = self.source.lengths  # recorded arrivals: the seed's own window, scaled to the rate
        if (seed + 1) * count > len(whole):
            raise SystemExit(f"{self.name} holds {len(whole)} requests: {seed + 1} windows of {count} do not fit")
        window = slice(seed * count, (seed + 1) * count)
        times = whole.arrival_times[window] - whole.arrival_times[window][0]
        trace = Trace(f"{self.name}-window{seed}", whole.ids[window], times, whole.input_lens[window],
                      whole.output_lens[window])
        return trace.scaled(rate_rps / trace.offered_rps), None

    def measured(self, rung: str, trace: Trace, drawn: None, seed: int) -> List[float]:
        rng = np.random.default_rng([seed, sorted(self.label_set.values).index(rung)])
        return with_measured_errors(self.label_set.output_lens, self.label_set.values[rung], trace.output_lens,
                                    rng).tolist()


RESCALED = "outlets r0 mean-rescaled"  # shown beside the ladder, not a rung of its order (it knows the mean)
# its controls, at the same mean: no ranking (a constant) and no per-request ranking (OUTLETS' values shuffled)
RESCALED_CONTROLS = ("constant mean-rescaled", "outlets r0 shuffled mean-rescaled")
BESIDE = (RESCALED, *RESCALED_CONTROLS)  # the rungs that know the mean
Rung = Callable[[object, Trace, Optional[np.ndarray], int], List[Optional[float]]]
RUNGS: Dict[str, Rung] = {
    "none": lambda work, trace, drawn, seed: [None] * len(trace),
    "constant": lambda work, trace, drawn, seed: constant_predictions(work.train_median, len(trace)),
    "outlets r0 shuffled": lambda work, trace, drawn, seed: shuffled_predictions(
        work.measured("outlets r0", trace, drawn, seed), seed),
    **{rung: (lambda rung: lambda work, trace, drawn, seed: work.measured(rung, trace, drawn, seed))(rung)
       for rung in LEARNED},
    # OUTLETS' ranking at the workload's mean length: what calibrating r̂₀ by finished lengths could gain
    RESCALED: lambda work, trace, drawn, seed: mean_rescaled_predictions(
        work.measured("outlets r0", trace, drawn, seed), trace.output_lens),
    RESCALED_CONTROLS[0]: lambda work, trace, drawn, seed: mean_rescaled_predictions(
        constant_predictions(work.train_median, len(trace)), trace.output_lens),
    RESCALED_CONTROLS[1]: lambda work, trace, drawn, seed: mean_rescaled_predictions(
        shuffled_predictions(work.measured("outlets r0", trace, drawn, seed), seed), trace.output_lens),
    "ceiling": lambda work, trace, drawn, seed: work.measured("ceiling", trace, drawn, seed),
    "oracle": lambda work, trace, drawn, seed: trace.output_lens.astype(np.float64).tolist(),
}

# -- the runs of a cell ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Setup:
    """Routing, queue order, KV admission and SGLang's ratio knobs (conservativeness, min factor, decay steps)."""

    routing: str
    queue: str
    admission: KVAdmission
    knobs: Tuple[float, float, int] = (1.0, 0.14, 600)


# The plugin's configurations, each run with every rung: its default (KV admitted by the predicted future peak),
# the charge (the former default), the order alone under SGLang's admission, SJF instead of tail-safe
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


def workloads(names: Sequence[str], record: str) -> Dict[str, Callable[[], object]]:
    label_set = LabelSetSamples(record)
    made = {LabelSetSamples.name: lambda: label_set}
    made.update({name: (lambda name: lambda: TransferredErrors(name, label_set))(name)
                 for name in ("sharegpt-chatgpt", "azure-conv")})
    return {name: made[name] for name in names}


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


# -- prediction quality ------------------------------------------------------------------------------

QUALITY_REQUESTS = 3000  # C-index pairs grow as the square: a trace's first requests suffice


def quality_path(output: str, workload: str) -> str:
    return os.path.join(output, f"quality-{workload}.json")


def quality(args) -> None:
    """Each rung's C-index (censoring-aware: a response cut at the cap is only known to be at least that long) on
    requests of the workload's knee (seed 0), as the simulator gives them; no prediction ranks nothing (0.5)."""
    for name, make in workloads(args.workloads, args.record).items():
        path = quality_path(args.output, name)
        scores = {}
        if os.path.exists(path):
            with open(path) as handle:
                scores = json.load(handle)["c_index"]
        if all(rung in scores for rung in RUNGS):
            continue
        work = make()
        trace, drawn = work.trace(LOADS[(name, "100k")][0], QUALITY_REQUESTS, 0)
        censored = work.censored[drawn] if drawn is not None else np.zeros(len(trace), bool)
        requests = CensoredRequests.of(trace.output_lens, censored)
        for rung, predict in [(rung, predict) for rung, predict in RUNGS.items() if rung not in scores]:
            predictions = predict(work, trace, drawn, 0)
            scores[rung] = 0.5 if predictions[0] is None else round(c_index(requests, predictions), 4)
        write_text_atomic(path, json.dumps({"workload": name, "requests": len(trace), "censored": int(censored.sum()),
                                            "c_index": scores}, indent=1))
        print(f"{name}: " + ", ".join(f"{rung} {score:.3f}" for rung, score in scores.items()), flush=True)


# -- report ------------------------------------------------------------------------------------------


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


def best_sglang(seeds: List[dict]) -> str:
    """The SGLang peer (its default or tuned) with the lowest short P99, mean over the seeds."""
    return min(SGLANG_PEERS, key=lambda peer: np.mean([by_label(cell)[peer]["short_p99_s"] for cell in seeds]))


def ratios(seeds: List[dict], label: str, reference: str, key: str) -> np.ndarray:
    """Per seed, ``label``'s ``key`` as a ratio to ``reference``'s on the same trace."""
    return np.array([by_label(cell)[label][key] / by_label(cell)[reference][key] for cell in seeds])


def spread(values: np.ndarray) -> str:
    return f"{values.mean():.2f} [{values.min():.2f}-{values.max():.2f}]"


def ladder_table(seeds_at: Dict[float, List[dict]]) -> List[str]:
    rates = sorted(seeds_at)
    best = {rate: best_sglang(seeds_at[rate]) for rate in rates}
    lines = ["| configuration | rung | " + " | ".join(f"{rate:g} rps" for rate in rates) + " |",
             "|---|---|" + "---:|" * len(rates)]
    rows = [(config, rung, f"{config} | {rung}") for config in CONFIGS for rung in RUNGS]
    rows += [(peer, "", peer) for peer in PEERS]
    for config, rung, label in rows:
        cells = []
        for rate in rates:
            seeds = seeds_at[rate]
            short, long, throughput = (ratios(seeds, label, best[rate], key)
                                       for key in ("short_p99_s", "long_p99_s", "throughput_tok_s"))
            retractions = np.mean([by_label(cell)[label]["retractions"] for cell in seeds])
            cells.append(f"{spread(short)} / {long.mean():.2f} / {throughput.mean():.2f} ({retractions:.0f})")
        lines.append(f"| {config} | {rung} | " + " | ".join(cells) + " |")
    lines += ["", "| the best SGLang peer | " + " | ".join(f"{rate:g} rps" for rate in rates) + " |",
              "|---|" + "---:|" * len(rates),
              "| which | " + " | ".join(best[rate] for rate in rates) + " |",
              "| its short P99 s | " + " | ".join(
                  f"{np.mean([by_label(c)[best[rate]]['short_p99_s'] for c in seeds_at[rate]]):.1f}" for rate in rates)
              + " |",
              "| SGLang default's short P99 as a ratio to it | " + " | ".join(
                  spread(ratios(seeds_at[rate], SGLANG_DEFAULT, best[rate], "short_p99_s")) for rate in rates) + " |"]
    return lines


DEFAULT_CONFIG = next(iter(CONFIGS))
AIM_CONFIGS = [DEFAULT_CONFIG, "charge (tail-safe + KV by prediction)"]  # the default and the former one
ORDER = ["constant", *LEARNED, "ceiling", "oracle"]  # the aim: short P99 falls (or holds) along this order
AIM_COLUMNS = ["constant", *LEARNED, *BESIDE, "ceiling", "oracle"]
MONOTONE_SLACK = 0.02  # of the short P99 ratio


def aim_rows(config: str, workload: str, regime: str, seeds_at: Dict[float, List[dict]]) -> List[str]:
    """The issue's aim under ``config``, at each load: the ladder's order, the oracle and the ceiling against the best
    SGLang peer, no class above 1.05x; the best past-future peer beside them."""
    rows = []
    for index, rate in enumerate(sorted(seeds_at)):
        seeds, best = seeds_at[rate], best_sglang(seeds_at[rate])
        short = {rung: ratios(seeds, f"{config} | {rung}", best, "short_p99_s").mean() for rung in AIM_COLUMNS}
        ceiling_long = ratios(seeds, f"{config} | ceiling", best, "long_p99_s").mean()
        past_future = min(ratios(seeds, peer, best, "short_p99_s").mean() for peer in PAST_FUTURE_PEERS)
        learned_best = min(short[rung] for rung in LEARNED)
        learned_worst = max(short[rung] for rung in LEARNED)
        # within MONOTONE_SLACK: a difference smaller than the seeds' usual spread orders nothing
        monotone = (short["constant"] >= learned_worst - MONOTONE_SLACK
                    and learned_best >= short["ceiling"] - MONOTONE_SLACK
                    and short["ceiling"] >= short["oracle"] - MONOTONE_SLACK)
        ceiling_meets = short["ceiling"] <= 0.6 and not ceiling_long > 1.05
        checks = [yes_no(monotone), yes_no(short["oracle"] <= 1), f"{yes_no(ceiling_meets)} ({ceiling_long:.2f})"]
        rows.append(f"| {workload} | {regime} | {rate:g}{' (knee)' if index == 0 else ''} | "
                    + " | ".join(f"{short[rung]:.2f}" for rung in AIM_COLUMNS) + f" | {past_future:.2f} | "
                    + " | ".join(checks) + " |")
    return rows


def glance_table(seeds: List[dict], scores: Dict[str, float]) -> List[str]:
    """Per rung, its C-index and its short P99 ratio to the best SGLang peer under every configuration."""
    best = best_sglang(seeds)
    lines = ["| rung | C-index | " + " | ".join(CONFIGS) + " |", "|---|---:|" + "---:|" * len(CONFIGS)]
    for rung in RUNGS:
        cells = [spread(ratios(seeds, f"{config} | {rung}", best, "short_p99_s")) for config in CONFIGS]
        lines.append(f"| {rung} | {scores.get(rung, float('nan')):.3f} | " + " | ".join(cells) + " |")
    return lines


def yes_no(value: bool) -> str:
    return "yes" if value else "no"


def report(args) -> None:
    cells = read_cells(args.output)
    grouped: Dict[Tuple[str, str], Dict[float, List[dict]]] = {}
    for (workload, regime, rate), seeds in cells.items():
        grouped.setdefault((workload, regime), {})[rate] = seeds
    lines = ["# The ladder of predictors (benchmarks/predictor_ladder.py)", "",
             "Every ratio is to the best SGLang peer at that load and cache (the lowest short P99 of SGLang's default "
             "and its tuned grid, mean over seeds), computed per seed on the same trace; mean [range] over the seeds. "
             f"Short: output < {SHORT_THRESHOLD} tokens.",
             f"Monotone: constant ≥ learned ≥ ceiling ≥ oracle, each within {MONOTONE_SLACK}.",
             f"The learned rungs' r̂₀: {os.path.relpath(os.path.abspath(args.record), REPO)}."]
    for config in AIM_CONFIGS:
        lines += ["", f"## The aim under {config}: short P99 ratio per rung", "",
                  "| workload | cache | requests/s | " + " | ".join(AIM_COLUMNS) + " | best past-future peer | monotone "
                  "| oracle ≤ 1 | ceiling ≤ 0.6, long ≤ 1.05 (ceiling's long; nan: no long request) |",
                  "|---|---|---|" + "---:|" * (len(AIM_COLUMNS) + 1) + "---|---|---|"]
        for (workload, regime), seeds_at in grouped.items():
            lines += aim_rows(config, workload, regime, seeds_at)
    lines += ["", "## Prediction quality: censoring-aware C-index of each rung", "",
              "| workload | " + " | ".join(RUNGS) + " |", "|---|" + "---:|" * len(RUNGS)]
    for name in dict.fromkeys(workload for workload, _ in grouped):
        if os.path.exists(quality_path(args.output, name)):
            with open(quality_path(args.output, name)) as handle:
                scores = json.load(handle)["c_index"]
            lines.append(f"| {name} | " + " | ".join(f"{scores[rung]:.3f}" for rung in RUNGS) + " |")
    for (workload, regime), seeds_at in grouped.items():
        scores = {}
        if os.path.exists(quality_path(args.output, workload)):
            with open(quality_path(args.output, workload)) as handle:
                scores = json.load(handle)["c_index"]
        for rate in sorted(seeds_at):
            seeds = ", ".join(str(cell["seed"]) for cell in seeds_at[rate])
            lines += ["", f"## At a glance: {workload}, {regime} cache, {rate:g} requests/s "
                      f"(short P99 / the best SGLang peer's, seeds {seeds})", ""] + glance_table(seeds_at[rate], scores)
    for (workload, regime), seeds_at in grouped.items():
        seeds = sorted({cell["seed"] for cells_ in seeds_at.values() for cell in cells_})
        lines += ["", f"## {workload}, {regime} cache (seeds {', '.join(map(str, seeds))})", "",
                  "short P99 ratio mean [range] / long P99 ratio / throughput ratio (retractions, mean per run)", ""]
        lines += ladder_table(seeds_at)
    path = os.path.join(args.output, "report.md")
    write_text_atomic(path, "\n".join(lines) + "\n")
    print(f"wrote {path}")


def plot(args) -> None:
    """Gain against prediction quality at each knee: short P99 as a ratio to the best SGLang peer against the rung's
    C-index, one line per configuration (the range over seeds as bars); panels: workload x cache."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = read_cells(args.output)
    panels = [(workload, regime) for workload in args.workloads for regime in args.regimes
              if (workload, regime, LOADS[(workload, regime)][0]) in cells]
    regimes = [regime for regime in args.regimes if any(regime == r for _, r in panels)]
    names = [workload for workload in args.workloads if any(workload == w for w, _ in panels)]
    figure, axes = plt.subplots(len(regimes), len(names), figsize=(4.2 * len(names), 3.6 * len(regimes)),
                                squeeze=False, sharex=True)
    for (workload, regime) in panels:
        axis = axes[regimes.index(regime)][names.index(workload)]
        with open(quality_path(args.output, workload)) as handle:
            scores = json.load(handle)["c_index"]
        rate = LOADS[(workload, regime)][0]
        seeds = cells[(workload, regime, rate)]
        best = best_sglang(seeds)
        # by quality, ties in the ladder's order; the rescaled r̂₀ ranks as r̂₀ does: a star of its own
        rungs = sorted([rung for rung in RUNGS if rung not in BESIDE], key=lambda rung: scores[rung])
        for config, marker in zip(CONFIGS, "osv^"):
            values = [ratios(seeds, f"{config} | {rung}", best, "short_p99_s") for rung in rungs]
            mean = np.array([v.mean() for v in values])
            errors = np.array([[v.mean() - v.min() for v in values], [v.max() - v.mean() for v in values]])
            axis.errorbar([scores[rung] for rung in rungs], mean, yerr=errors, marker=marker, markersize=3, capsize=2,
                          label=config)
        for rung, marker in zip(BESIDE, "*XP"):  # the rescaled r̂₀ and its controls at the same mean
            rescaled = ratios(seeds, f"{DEFAULT_CONFIG} | {rung}", best, "short_p99_s").mean()
            axis.plot([scores[rung]], [rescaled], marker=marker, markersize=8, color="C0", linestyle="none",
                      label=f"{DEFAULT_CONFIG.split(' (')[0]}, {rung}")
        for rung in ("constant", "outlets r0", "ceiling", "oracle"):
            value = ratios(seeds, f"{DEFAULT_CONFIG} | {rung}", best, "short_p99_s").mean()
            axis.annotate(rung, (scores[rung], value), fontsize=7, xytext=(3, 4), textcoords="offset points")
        axis.axhline(1.0, color="black", linewidth=0.8)
        axis.axhline(ratios(seeds, SGLANG_DEFAULT, best, "short_p99_s").mean(), color="grey", linestyle="--",
                     linewidth=0.8)
        axis.set_title(f"{workload}, {regime} cache, {rate:g} rps", fontsize=9)
        axis.set_xlabel("C-index of the rung")
        axis.set_ylabel("short P99 / best SGLang")
    axes[0][0].legend(fontsize=7, title="black: best SGLang peer; dashed: SGLang default", title_fontsize=7)
    figure.tight_layout()
    figure.savefig(args.figure, dpi=110)
    print(f"wrote {args.figure}")


STAGES = {"simulate": simulate, "quality": quality, "report": report, "plot": plot}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stages", nargs="*", help=f"of {', '.join(STAGES)} (default: all, in order)")
    parser.add_argument("--workloads", nargs="+", default=["sharegpt-smollm2", "sharegpt-chatgpt", "azure-conv"])
    parser.add_argument("--regimes", nargs="+", choices=list(REGIMES), default=list(REGIMES))
    parser.add_argument("--loads", nargs="+", choices=LOAD_NAMES, default=list(LOAD_NAMES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--output", default=OUTPUT)
    parser.add_argument("--record", default=EVAL_RECORD,
                        help="the evaluation record the learned rungs read (default: the committed label-set eval's)")
    parser.add_argument("--figure", default=FIGURE)
    args = parser.parse_args()
    if os.path.abspath(args.record) != EVAL_RECORD and os.path.abspath(args.output) == OUTPUT:
        parser.error(f"--record {args.record}: give it its own --output (the cells under {OUTPUT} are the committed "
                     "record's; a cell keeps the runs it has)")
    unknown = [stage for stage in args.stages if stage not in STAGES]
    if unknown:
        parser.error(f"unknown stage(s) {', '.join(unknown)}; of {', '.join(STAGES)}")
    for stage in args.stages or list(STAGES):
        STAGES[stage](args)


if __name__ == "__main__":
    main()
