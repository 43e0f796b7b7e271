"""The map's figure: mean TTFT as a ratio to the best prediction-free peer, per regime against load (a batch: against
its size), for the plugin's default (layered on the peer a user picked) and the best configuration with OUTLETS
r̂₀, its controls and the oracle; a regime's long trace at capacity as stars beside its line."""

from __future__ import annotations

from typing import List

from specforge_outlets.studies.regime_map.report import (
    CONTROLS,
    best_outlets,
    plugin_default_label,
    sibling,
    summaries_of,
)
from specforge_outlets.studies.predictor_ladder.cells import SGLANG_DEFAULT

METRIC = "ttft_mean_s"
LOG_ABOVE = 3.0  # a panel whose ratios reach this is drawn on a log scale


def plot(args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summaries = summaries_of(args.output)
    regimes: List[str] = list(dict.fromkeys(cell["regime"] for cell in summaries))
    columns = min(4, len(regimes))
    rows = -(-len(regimes) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 3.2 * rows), squeeze=False)
    for index, regime in enumerate(regimes):
        axis = axes[index // columns][index % columns]
        ours = [cell for cell in summaries if cell["regime"] == regime]
        long = [cell for cell in ours if cell["load"] is not None and cell["shape"] != args.requests]
        cells = sorted((cell for cell in ours if cell not in long),
                       key=lambda cell: cell["shape"] if cell["load"] is None else cell["load"])
        x = [cell["shape"] if cell["load"] is None else cell["load"] for cell in cells]

        def line(pick, **style) -> None:
            axis.plot(x, [cell["runs"][pick(cell)]["ratio"][METRIC] for cell in cells], marker="o", markersize=3,
                      **style)

        line(plugin_default_label, label="plugin default over the peer picked, OUTLETS r̂₀", color="C0")
        line(best_outlets, label="best config, OUTLETS r̂₀", color="C1")
        for pick, color in ((plugin_default_label, "C0"), (best_outlets, "C1")) if long else ():
            axis.plot([cell["load"] for cell in long], [cell["runs"][pick(cell)]["ratio"][METRIC] for cell in long],
                      marker="*", markersize=9, linestyle="none", color=color,
                      label=f"the same, {long[0]['shape']:,} requests")
        for rung, color in zip((*CONTROLS, "oracle"), ("C7", "C8", "C2")):
            line(lambda cell, rung=rung: sibling(cell, best_outlets(cell), rung), label=f"same config, {rung}",
                 color=color, linestyle=":")
        line(lambda cell: SGLANG_DEFAULT, label=SGLANG_DEFAULT, color="grey", linestyle="--")
        axis.axhline(1.0, color="black", linewidth=0.8)
        if max((max(line.get_ydata()) for line in axis.get_lines() if len(line.get_ydata())), default=0) > LOG_ABOVE:
            axis.set_yscale("log")
        if cells and cells[0]["load"] is not None:
            axis.axvspan(1.0, max(x + [1.0]) + 0.05, color="red", alpha=0.06)  # overload
        axis.set_title(regime, fontsize=9)
        axis.set_xlabel("requests at once" if cells and cells[0]["load"] is None else "load / capacity")
        axis.set_ylabel("mean TTFT / best peer")
    for index in range(len(regimes), rows * columns):
        axes[index // columns][index % columns].axis("off")
    handles, labels = axes[0][0].get_legend_handles_labels()
    spare = axes[-1][-1] if len(regimes) < rows * columns else axes[0][0]
    spare.legend(handles, labels, fontsize=7, loc="center", title="black: best prediction-free peer per cell\n"
                 "red: overload; batches: r̂₀ at arrival, pass charged", title_fontsize=7)
    figure.tight_layout()
    figure.savefig(args.figure, dpi=110)
    print(f"wrote {args.figure}")
