"""``map.json`` and ``map.md`` from the cells written: every figure as a ratio to the best prediction-free peer.

Per cell (regime, shape, load) and metric, the best peer is the one of SGLang's prediction-free configurations
with the best mean over the seeds; a run's ratio is the mean over seeds of its figure over that peer's on the
same trace. Online cells are read in their steady window (``metrics.WINDOW``), batches whole; map.json holds both.
Beside where a prediction pays, each cell says how far the plugin's default, layered on the peer a user picked,
is from the best peer (the issue's aim: within ``ALIGNED_WITHIN`` on every headline figure).
"""

from __future__ import annotations

import json
import math
import os
from typing import Dict, List, Tuple

import numpy as np

from specforge_outlets.atomic import write_text_atomic
from specforge_outlets.studies.regime_map.cells import read_cells
from specforge_outlets.studies.regime_map.metrics import SHORT_THRESHOLD, SLO, WINDOW
from specforge_outlets.studies.regime_map.regimes import AT_PREFILL, BOUNDS, CONTROLS, PLUGIN_DEFAULT, REGIMES

LOWER_IS_BETTER = ("ttft_mean_s", "ttft_p50_s", "ttft_p99_s", "e2e_mean_s", "e2e_p99_s", "short_p99_s",
                   "long_p99_s", "makespan_s")
HIGHER_IS_BETTER = ("goodput_rps", "slo_attainment", "throughput_tok_s")
METRICS = LOWER_IS_BETTER + HIGHER_IS_BETTER
LEARNED = "outlets r0"
PAYS_BELOW = 0.95  # a prediction pays: mean TTFT at most this ratio (or goodput at least its inverse) ...
TAILS_WITHIN = 1.05  # ... with P99 TTFT, short and long P99 at most this ratio ...
CONTROL_MARGIN = 0.02  # ... and below both controls (constant, shuffled r̂₀) by this much: the ranking, not the rule
TAILS = ("ttft_p99_s", "short_p99_s", "long_p99_s")
ALIGNED_WITHIN = 1.02  # the plugin's default at most this ratio on every figure of ALIGNMENT and 1 / goodput
ALIGNMENT = ("ttft_mean_s", "ttft_p99_s", "short_p99_s", "long_p99_s")
CellKey = Tuple[str, int, object]


def headline_window(cell: dict) -> str:
    return "whole" if cell["load"] is None else "steady"


def grouped(cells: List[dict]) -> Dict[CellKey, List[dict]]:
    groups: Dict[CellKey, List[dict]] = {}
    for cell in cells:
        groups.setdefault((cell["regime"], cell["shape"], cell["load"]), []).append(cell)
    return groups


def is_peer(run: dict) -> bool:
    return run["config"] == run["label"]


def summarize_cell(seeds: List[dict]) -> dict:
    """Mean figures over the seeds, the best peer per metric and every run's ratios to it (headline window); a
    configuration layered on a peer also its ratios to that peer."""
    window = headline_window(seeds[0])
    runs = [{run["label"]: run for run in cell["runs"]} for cell in seeds]
    labels = list(runs[0])
    mean = {label: {name: {metric: float(np.mean([seed[label][name][metric] for seed in runs])) for metric in METRICS}
                    for name in runs[0][label] if name in ("whole", "steady")} for label in labels}
    peers = [label for label in labels if is_peer(runs[0][label])]
    best = {}
    for metric in METRICS:
        pick = min if metric in LOWER_IS_BETTER else max
        best[metric] = pick(peers, key=lambda label: mean[label][window][metric])
    def ratio_to(label: str, reference) -> Dict[str, float]:
        """Mean over seeds of the run's figure over ``reference(metric)``'s on the same trace."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return {metric: float(np.mean([np.float64(seed[label][window][metric])
                                           / seed[reference(metric)][window][metric] for seed in runs]))
                    for metric in METRICS}

    ratios = {label: ratio_to(label, best.get) for label in labels}
    over = {label: runs[0][label].get("over") for label in labels}
    to_base = {label: ratio_to(label, lambda metric: over[label]) for label in labels if over[label]}
    first = seeds[0]
    return {key: first[key] for key in ("regime", "cluster", "arrivals", "shape", "load", "load_label", "rate_rps",
                                         "capacity_rps", "window", "ttft", "prediction_pass_s")} | {
        "seeds": [cell["seed"] for cell in seeds], "headline_window": window, "best_peer": best,
        "runs": {label: {"config": runs[0][label]["config"], "rung": runs[0][label]["rung"],
                         "point": runs[0][label]["point"], "over": over[label], "mean": mean[label],
                         "ratio": ratios[label], "ratio_to_base": to_base.get(label)}
                 for label in labels}}


def outlets_labels(cell: dict) -> List[str]:
    return [label for label, run in cell["runs"].items() if run["rung"] == LEARNED]


def sibling(cell: dict, label: str, rung: str) -> str:
    """The run of the same configuration and prediction point with another rung."""
    run = cell["runs"][label]
    return next(other for other, entry in cell["runs"].items()
                if entry["config"] == run["config"] and entry["point"] == run["point"] and entry["rung"] == rung)


def verdict(cell: dict, label: str) -> str:
    ratio = cell["runs"][label]["ratio"]
    gain = ratio["ttft_mean_s"] <= PAYS_BELOW or ratio["goodput_rps"] >= 1 / PAYS_BELOW
    if not gain:
        return "no"
    worst_tail = max(TAILS, key=lambda metric: ratio[metric] if np.isfinite(ratio[metric]) else 0.0)
    if ratio[worst_tail] > TAILS_WITHIN:
        return f"no: {worst_tail.replace('_s', '')} {ratio[worst_tail]:.2f}"
    controls = min(cell["runs"][sibling(cell, label, rung)]["ratio"]["ttft_mean_s"] for rung in CONTROLS)
    if ratio["ttft_mean_s"] > controls - CONTROL_MARGIN:
        return f"no: a control does as well ({controls:.2f})"
    return "pays"


def best_outlets(cell: dict) -> str:
    """The configuration (and point, a lower bound's left out) with OUTLETS r̂₀ of the lowest mean TTFT ratio."""
    reachable = [label for label in outlets_labels(cell) if cell["runs"][label]["point"] not in BOUNDS]
    return min(reachable, key=lambda label: cell["runs"][label]["ratio"]["ttft_mean_s"])


def plugin_default_label(cell: dict) -> str:
    """The plugin's default with OUTLETS r̂₀ (a batch: predicted at prefill, as a server runs it: a prediction pass
    before the batch is a client's opt-in, shown among the best uses), layered on the peer a user would have picked:
    the best peer by mean TTFT where the plugin is layered on it, else the base of the lower mean TTFT."""
    runs = cell["runs"]
    labels = [label for label in outlets_labels(cell) if runs[label]["config"].startswith(PLUGIN_DEFAULT)
              and runs[label]["point"] == AT_PREFILL]
    return min(labels, key=lambda label: runs[runs[label]["over"]]["ratio"]["ttft_mean_s"])


def worst_figure(ratio: Dict[str, float]) -> Tuple[str, float]:
    """The worst of the ALIGNMENT ratios and 1 / goodput (a figure without a value, none in the window, left out)."""
    goodput = ratio["goodput_rps"]
    figures = {**{metric.replace("_s", ""): ratio[metric] for metric in ALIGNMENT},
               "1/goodput": 1.0 / goodput if goodput > 0 else math.inf}
    name = max((name for name in figures if not math.isnan(figures[name])), key=lambda name: figures[name])
    return name, figures[name]


def shown(label: str) -> str:
    """A run's label in a markdown table (its separators are not the table's)."""
    return label.replace(" | ", " · ")


def free_bound(cell: dict, label: str) -> str:
    """A batch's lower bound beside its headline: the same configuration with r̂₀ at arrival for free."""
    run = cell["runs"][label]
    free = [entry for entry in cell["runs"].values() if entry["config"] == run["config"]
            and entry["rung"] == run["rung"] and entry["point"] in BOUNDS]
    return "".join(f" (pass free, a bound: {entry['ratio']['ttft_mean_s']:.2f})" for entry in free)


def load_text(cell: dict) -> str:
    if cell["load"] is None:
        return f"{cell['shape']} at once"
    return f"{cell['load']:g} ({cell['load_label']}, {cell['rate_rps']:g} rps), {cell['shape']} requests"


def alignment_text(cell: dict, label: str) -> str:
    """Its worst ratio to the best peers, within ALIGNED_WITHIN or not, and its worst to the peer it is layered on."""
    name, worst = worst_figure(cell["runs"][label]["ratio"])
    base_name, base_worst = worst_figure(cell["runs"][label]["ratio_to_base"])
    return (f"{worst:.2f} ({name}) | {'yes' if worst <= ALIGNED_WITHIN else 'no'} | "
            f"{base_worst:.2f} ({base_name})")


def headline_rows(summaries: List[dict]) -> List[str]:
    rows = ["| regime | load | best peer by mean TTFT | plugin default over, OUTLETS: mean TTFT / P99 TTFT / short "
            "P99 / long P99 / goodput | its worst (1/goodput for goodput) | within "
            f"{ALIGNED_WITHIN} | its worst against the peer it is layered on | best with OUTLETS | its mean TTFT / "
            "P99 TTFT / long P99 | constant / shuffled / oracle (same config) mean TTFT | where it pays |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for cell in summaries:
        default, best = plugin_default_label(cell), best_outlets(cell)
        d, b = cell["runs"][default]["ratio"], cell["runs"][best]["ratio"]
        controls = " / ".join(f"{cell['runs'][sibling(cell, best, rung)]['ratio']['ttft_mean_s']:.2f}"
                              for rung in (*CONTROLS, "oracle"))
        rows.append(f"| {cell['regime']} | {load_text(cell)} | {cell['best_peer']['ttft_mean_s']} | "
                    f"{cell['runs'][default]['config'].replace(PLUGIN_DEFAULT + ' ', '')}: {d['ttft_mean_s']:.2f} / {d['ttft_p99_s']:.2f} / "
                    f"{d['short_p99_s']:.2f} / {d['long_p99_s']:.2f} / {d['goodput_rps']:.2f} | "
                    f"{alignment_text(cell, default)} | {shown(best.replace(' | outlets r0', ''))} | "
                    f"{b['ttft_mean_s']:.2f} / {b['ttft_p99_s']:.2f} / {b['long_p99_s']:.2f} | {controls} | "
                    f"{verdict(cell, best)}{free_bound(cell, best)} |")
    return rows


DETAIL = ("ttft_mean_s", "ttft_p50_s", "ttft_p99_s", "e2e_mean_s", "e2e_p99_s", "short_p99_s", "long_p99_s",
          "goodput_rps", "slo_attainment", "throughput_tok_s", "makespan_s")


def detail_rows(cell: dict) -> List[str]:
    window = cell["headline_window"]
    rows = ["| run | " + " | ".join(metric.replace("_s", "").replace("_", " ") for metric in DETAIL)
            + " | whole-trace mean TTFT (s) |", "|---|" + "---:|" * (len(DETAIL) + 1)]
    for label, run in cell["runs"].items():
        rows.append(f"| {shown(label)} | " + " | ".join(f"{run['ratio'][metric]:.2f}" for metric in DETAIL)
                    + f" | {run['mean']['whole']['ttft_mean_s']:.3g} |")
    best = cell["best_peer"]["ttft_mean_s"]
    rows.append(f"| (best peer's {window} figures, s) | " + " | ".join(
        f"{cell['runs'][cell['best_peer'][metric]]['mean'][window][metric]:.3g}" for metric in DETAIL) + f" | "
        f"{cell['runs'][best]['mean']['whole']['ttft_mean_s']:.3g} |")
    return rows


def summaries_of(output: str) -> List[dict]:
    """Every complete cell's summary, in the map's order: regime, then shape, then load."""
    groups = grouped(read_cells(output))
    order = list(REGIMES)
    keys = sorted(groups, key=lambda key: (order.index(key[0]), key[1], -1.0 if key[2] is None else key[2]))
    return [summarize_cell(sorted(groups[key], key=lambda cell: cell["seed"])) for key in keys]


def report(args) -> None:
    summaries = summaries_of(args.output)
    with open(os.path.join(args.output, "capacity.json")) as handle:
        capacity = json.load(handle)
    write_text_atomic(os.path.join(args.output, "map.json"), json.dumps(
        {"capacity": capacity, "window": WINDOW, "slo_s": SLO, "short_threshold": SHORT_THRESHOLD,
         "cells": summaries}, indent=1))
    lines = ["# The regime map (benchmarks/regime_map.py)", "",
             "Where a length prediction pays against SGLang's best prediction-free configuration. Every ratio is to "
             "the best prediction-free peer of that cell for that metric (SGLang's default, total_requests / "
             "total_tokens balancing with tuned ratio knobs; PD: also --max-running-requests "
             "512), on the same trace, mean over seeds; below 1 is better, except goodput, SLO attainment and "
             "throughput. The prediction configurations are the plugin layered on a peer (its routing, knobs and "
             "max running): its default order and KV admission over SGLang's default and over total_requests "
             "(SGLang's default knobs; PD: max running 512); over total_requests, SJF (aged), tail-safe by ranks "
             "and in batches longest-predicted-first (SGLang's admission: the order alone); and the plugin's "
             "opt-in routing (--load-balance-method outlets) with its default order and admission; colocated, its "
             "opt-in KV admission by the predicted peak (--outlets-kv-admission peak) with its default order over "
             "total_requests. \"Plugin default over\": layered on the best peer by mean TTFT where it is a base, else "
             "on the base of lower mean TTFT (a batch: r̂₀ at prefill, as a server runs it); its worst ratio of "
             "mean TTFT, P99 TTFT, short and long P99 and 1/goodput, within "
             f"{ALIGNED_WITHIN} or not (the issue's aim; the best peer may differ by metric), and the same worst "
             "against the peer it is layered on alone (what the plugin itself changes). Online cells: the steady "
             f"window ({WINDOW}); batches: the "
             "whole batch from its "
             "submission. TTFT as SGLang reports it (PD: the first decode batch). "
             f"Pays: mean TTFT ≤ {PAYS_BELOW} (or goodput ≥ {1 / PAYS_BELOW:.2f}) with P99 TTFT, short and long "
             f"P99 ≤ {TAILS_WITHIN}, and below both controls (constant, shuffled r̂₀) by {CONTROL_MARGIN}. "
             f"SLO: TTFT ≤ {SLO['ttft']:g} s and TPOT ≤ {SLO['tpot'] * 1e3:g} ms. Short: < {SHORT_THRESHOLD} output "
             "tokens. Capacity per cluster (capacity.json): "
             + "; ".join(f"{name} {entry['capacity_rps']:g} rps" for name, entry in capacity.items()) + ".", "",
             "## Where a prediction pays", ""] + headline_rows(summaries)
    for cell in summaries:
        seeds = ", ".join(map(str, cell["seeds"]))
        lines += ["", f"## {cell['regime']}, {load_text(cell)}, seeds {seeds}", ""] + detail_rows(cell)
    path = os.path.join(args.output, "map.md")
    write_text_atomic(path, "\n".join(lines) + "\n")
    print(f"wrote {path}")
