"""The figure: ordering per round against the waiting list's size, routing per dispatch against the ranks."""

from __future__ import annotations

import argparse
import json

def plot(args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(args.result) as handle:
        result = json.load(handle)
    rows = result["ordering"]
    sizes = [row["waiting"] for row in rows]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, style in (("outlets sjf", "o-"), ("outlets tail-safe", "s-"), ("lof", "^--"), ("hrrn", "v--"),
                        ("shortest-prefill-first", "d--")):
        axes[0].plot(sizes, [row[f"{name} steady ms"] for row in rows], style, label=name)
    axes[0].set(xscale="log", yscale="log", xlabel="waiting requests", ylabel="ms per scheduling round",
                title="Ordering (steady round)")
    axes[0].legend(fontsize=8)
    routing = result["routing"]
    for method, style in (("outlets", "o-"), ("total_tokens", "^--"), ("round_robin", "v--")):
        axes[1].plot([row["ranks"] for row in routing], [row[f"{method} us"] for row in routing], style, label=method)
    axes[1].set(xlabel="data-parallel ranks", ylabel="us per dispatch", title="Routing", ylim=(0, None))
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.figure, dpi=120)
    print(f"wrote {args.figure}")
