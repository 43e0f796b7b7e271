"""``report.md``: every ratio to the best SGLang peer at that load and cache, mean [range] over seeds."""

from __future__ import annotations

import json
import os
from typing import Dict, List, Tuple

import numpy as np

from specforge_outlets.atomic import write_text_atomic
from specforge_outlets.studies.committed_data import REPO
from specforge_outlets.studies.label_set_samples import LEARNED
from specforge_outlets.studies.predictor_ladder.cells import (
    CONFIGS,
    PAST_FUTURE_PEERS,
    PEERS,
    SGLANG_DEFAULT,
    SGLANG_PEERS,
    SHORT_THRESHOLD,
    by_label,
    read_cells,
)
from specforge_outlets.studies.predictor_ladder.quality import quality_path
from specforge_outlets.studies.predictor_ladder.rungs import BESIDE, RUNGS


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
