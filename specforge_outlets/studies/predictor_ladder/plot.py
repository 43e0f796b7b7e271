"""The ladder's figure: gain against prediction quality at each knee, one line per configuration."""

from __future__ import annotations

import json

import numpy as np

from specforge_outlets.studies.predictor_ladder.cells import CONFIGS, LOADS, SGLANG_DEFAULT, read_cells
from specforge_outlets.studies.predictor_ladder.quality import quality_path
from specforge_outlets.studies.predictor_ladder.report import DEFAULT_CONFIG, best_sglang, ratios
from specforge_outlets.studies.predictor_ladder.rungs import BESIDE, RUNGS


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
