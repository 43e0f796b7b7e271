"""summary.json, summary.md and the PNG plots of a simulation study."""

from __future__ import annotations

import os
from typing import Dict, List

from specforge_outlets.atomic import write_text_atomic
from specforge_outlets.serving.summary import write_summary
from specforge_outlets.serving.metrics import pipe_table
from specforge_outlets.simulation.study import POLICY_STUDY, PREDICTOR_STUDY

# Columns of the markdown tables: (header, metrics class, metric key, format).
TABLE_COLUMNS = (
    ("throughput tok/s", "all", "throughput_tok_s", "{:.0f}"),
    ("P50 e2e s", "all", "e2e_p50_s", "{:.2f}"),
    ("P99 e2e s", "all", "e2e_p99_s", "{:.2f}"),
    ("short P50 s", "short", "e2e_p50_s", "{:.2f}"),
    ("short P99 s", "short", "e2e_p99_s", "{:.2f}"),
    ("long P99 s", "long", "e2e_p99_s", "{:.2f}"),
    ("P99 TTFT s", "all", "ttft_p99_s", "{:.2f}"),
    ("P99 TPOT s", "all", "tpot_p99_s", "{:.4f}"),
    ("P99 ITL s", "all", "itl_p99_s", "{:.4f}"),
    ("P99 queue s", "all", "queue_p99_s", "{:.2f}"),
    ("max queue s", "all", "queue_max_s", "{:.1f}"),
)


def write_report(output_dir: str, header: Dict, rows: List[Dict]) -> List[str]:
    """Write the summary files and plots; return their paths."""
    os.makedirs(output_dir, exist_ok=True)
    paths = [write_text_atomic(os.path.join(output_dir, "summary.md"), markdown_summary(header, rows))]
    paths += _plots(output_dir, rows)
    paths.append(write_summary(output_dir, header, rows))  # last: the run is complete
    return paths


def markdown_summary(header: Dict, rows: List[Dict]) -> str:
    lines = [f"# Serving simulation: {header['trace']}", ""]
    lines += [f"- {key}: {value}" for key, value in header.items() if key != "trace"]
    for study, title, label in (
        (POLICY_STUDY, "Policy combinations", lambda row: f"{row['routing']} + {row['queue']} ({row['predictor']})"),
        (PREDICTOR_STUDY, "Controlled study: SJF fixed, predictor varied", lambda row: f"{row['routing']} + sjf, {row['predictor']}"),
    ):
        selected = [row for row in rows if row["study"] == study]
        if not selected:
            continue
        lines += ["", f"## {title}", "", markdown_table(selected, label)]
    return "\n".join(lines) + "\n"


def markdown_table(rows: List[Dict], label) -> str:
    header = ["rate x", "offered req/s", "policy"] + [column[0] for column in TABLE_COLUMNS]
    return pipe_table(header, (
        [f"{row['rate_scale']:g}", f"{row['offered_rps']:.1f}", label(row)]
        + [fmt.format(row["metrics"][cls][key]) for _, cls, key, fmt in TABLE_COLUMNS]
        for row in rows
    ))


def _plots(output_dir: str, rows: List[Dict]) -> List[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    panels = (("throughput_tok_s", "all", "output throughput (tok/s)"), ("e2e_p99_s", "short", "short-request P99 e2e (s)"))
    for study, name, series_of in (
        (POLICY_STUDY, "policies.png", lambda row: f"{row['routing']} + {row['queue']}"),
        (PREDICTOR_STUDY, "controlled_study.png", lambda row: f"SJF, {row['predictor']} predictor"),
    ):
        selected = [row for row in rows if row["study"] == study]
        if not selected:
            continue
        figure, axes = plt.subplots(1, 2, figsize=(11, 4))
        for series in dict.fromkeys(series_of(row) for row in selected):
            points = sorted((row["offered_rps"], row) for row in selected if series_of(row) == series)
            for axis, (key, cls, _) in zip(axes, panels):
                axis.plot([x for x, _ in points], [row["metrics"][cls][key] for _, row in points], marker="o", label=series)
        for axis, (_, _, ylabel) in zip(axes, panels):
            axis.set_xlabel("offered load (requests/s)")
            axis.set_ylabel(ylabel)
            axis.grid(alpha=0.3)
        axes[1].set_yscale("log")
        axes[0].legend(fontsize=7)
        figure.tight_layout()
        path = os.path.join(output_dir, name)
        figure.savefig(path, dpi=120)
        plt.close(figure)
        paths.append(path)
    return paths
