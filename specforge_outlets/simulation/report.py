"""summary.json, summary.md and the PNG plots of a simulation study.

The plots are what a user compares policies by: short requests' P99 (what length-aware scheduling
buys) and goodput (what it costs), against offered load, one line per policy.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable, Dict, List, Tuple

from specforge_outlets.atomic import write_text_atomic
from specforge_outlets.serving.bars import draw_bars
from specforge_outlets.serving.summary import write_summary
from specforge_outlets.serving.metrics import format_metric, metric_value, pipe_table
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
# With --goodput: requests within every SLO target, per second and as a share, overall and short.
GOODPUT_COLUMNS = (
    ("goodput req/s", "all", "goodput_rps", "{:.2f}"),
    ("SLO attainment", "all", "slo_attainment", "{:.2f}"),
    ("short goodput req/s", "short", "goodput_rps", "{:.2f}"),
    ("short SLO attainment", "short", "slo_attainment", "{:.2f}"),
)
# Plot styling: a marker and line style per policy, so that lines lying on each other stay told apart
# (hollow markers, each a size smaller than the one before).
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
LINE_STYLES = ("-", "--", "-.", ":")
MARKER_SIZE = 11
MARKER_SHRINK = 0.6  # each later policy's marker is this much smaller, so that one on top leaves the one below visible
LOG_SPAN = 20.0  # a latency panel goes log when its largest value is this many times its smallest
HEADROOM = 1.15  # a linear panel's top, over its largest value
LEGEND_COLUMNS = 3  # policies per legend row, under the panels
LEGEND_ROW_HEIGHT = 0.055  # share of the figure's height one legend row takes


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
    """One row per run; an empty class's latency reads ``–`` (not ``nan``), goodput only when --goodput was given."""
    columns = TABLE_COLUMNS + (GOODPUT_COLUMNS if any("goodput_rps" in row["metrics"]["all"] for row in rows) else ())
    header = ["rate x", "offered req/s", "policy"] + [column[0] for column in columns]
    return pipe_table(header, (
        [f"{row['rate_scale']:g}", f"{row['offered_rps']:.1f}", label(row)]
        + [format_metric(row["metrics"][cls].get(key), fmt) for _, cls, key, fmt in columns]
        for row in rows
    ))


@dataclass(frozen=True)
class Panel:
    """One panel of a study's figure: a metric of one length class against offered load."""

    metrics_class: str
    key: str
    title: str
    may_use_log: bool  # latencies span decades across loads; rates and shares do not


SHORT_P99 = Panel("short", "e2e_p99_s", "short-request P99 e2e latency (s)", may_use_log=True)
GOODPUT = Panel("all", "goodput_rps", "goodput (requests/s within every SLO)", may_use_log=False)
THROUGHPUT = Panel("all", "throughput_tok_s", "output throughput (tokens/s)", may_use_log=False)


def panels_for(rows: List[Dict]) -> Tuple[Panel, Panel]:
    """Short P99 beside goodput when the run had SLO targets (--goodput), else beside throughput."""
    return SHORT_P99, GOODPUT if any(GOODPUT.key in row["metrics"][GOODPUT.metrics_class] for row in rows) else THROUGHPUT


def study_figure(rows: List[Dict], series_of: Callable[[Dict], str]):
    """Each panel against offered load, one line per policy with its own marker; one load level (a
    single --rate-scale) as one bar per policy instead of lone points on a needle-thin axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = list(dict.fromkeys(series_of(row) for row in rows))
    loads = sorted({row["offered_rps"] for row in rows})
    figure, axes = plt.subplots(1, 2, figsize=(12, 5))
    for axis, panel in zip(axes, panels_for(rows)):
        values = {name: sorted((row["offered_rps"], _plotted(row, panel)) for row in rows if series_of(row) == name)
                  for name in series}
        if len(loads) == 1:
            draw_bars(axis, series, [values[name][0][1] for name in series],
                      [f"C{index % 10}" for index in range(len(series))], rotation=30)
            axis.set_xlabel(f"policy at offered load {loads[0]:.2f} requests/s")
        else:
            for index, name in enumerate(series):
                axis.plot([x for x, _ in values[name]], [y for _, y in values[name]], label=name,
                          marker=MARKERS[index % len(MARKERS)], markersize=MARKER_SIZE - MARKER_SHRINK * (index % len(MARKERS)),
                          fillstyle="none", linestyle=LINE_STYLES[index % len(LINE_STYLES)], linewidth=1.2)
            axis.set_xlabel("offered load (requests/s)")
            axis.grid(alpha=0.3)
        _scale(axis, [y for points in values.values() for _, y in points], panel)
        axis.set_title(panel.title, fontsize=10)
    if len(loads) > 1:  # one legend for both panels, under them, over no data
        columns = min(len(series), LEGEND_COLUMNS)
        figure.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=columns, fontsize=8)
        figure.tight_layout(rect=(0, LEGEND_ROW_HEIGHT * math.ceil(len(series) / columns), 1, 1))
    else:
        figure.tight_layout()
    return figure


def _plotted(row: Dict, panel: Panel) -> float:
    return metric_value(row["metrics"][panel.metrics_class].get(panel.key))


def _scale(axis, values: List[float], panel: Panel) -> None:
    """From zero, unless a latency spans more than LOG_SPAN (then log): equal values never make a
    needle-thin axis around them."""
    finite = [value for value in values if math.isfinite(value) and value > 0]
    if panel.may_use_log and finite and max(finite) / min(finite) > LOG_SPAN:
        axis.set_yscale("log")
        return
    axis.set_ylim(bottom=0.0, top=max(finite) * HEADROOM if finite else 1.0)


def _plots(output_dir: str, rows: List[Dict]) -> List[str]:
    import matplotlib.pyplot as plt

    paths = []
    for study, name, series_of in (
        (POLICY_STUDY, "policies.png", lambda row: f"{row['routing']} + {row['queue']}"),
        (PREDICTOR_STUDY, "controlled_study.png", lambda row: f"SJF, {row['predictor']} predictor"),
    ):
        selected = [row for row in rows if row["study"] == study]
        if not selected:
            continue
        figure = study_figure(selected, series_of)
        path = os.path.join(output_dir, name)
        figure.savefig(path, dpi=120)
        plt.close(figure)
        paths.append(path)
    return paths
