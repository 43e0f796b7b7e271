"""``outlets compare-runs``: measured and simulated runs in one table and one figure.

Reads the ``summary.json`` of ``outlets bench-serving`` and ``outlets simulate`` directories (both
write ``{header..., "runs": [{..., "metrics": {"all"|"short"|"long": {...}}}]}``) and the result file
of a stock ``python -m sglang.benchmark.serving --output-file FILE`` (one run per line, its keys read
by ``sglang_result.row_from_sglang``), and lists every row under SGLang's result keys
(``compare_keys.py``: milliseconds, ``p99_ttft_ms``; ``output_throughput``; ``request_goodput``,
``slo_attainment``) and the length classes' (``short_p99_e2e_latency_ms``), ``--metrics`` choosing
which, plus the policy columns when a row has them (simulator rows). ``inf`` latencies (failed
requests) stay ``inf``; what a run did not record (SGLang's length classes) reads ``–``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List, Tuple

from specforge_outlets.loadgen.compare_keys import KEYS, CompareKey, parse_metrics
from specforge_outlets.serving.summary import SUMMARY, read_summary
from specforge_outlets.errors import OutletsError

POLICY_KEYS = ("study", "routing", "queue", "predictor", "rate_scale")
# The two panels of compare.png.
PLOT_METRICS = ("short_p99_e2e_latency_ms", "output_throughput")


@dataclass(frozen=True)
class RunRow:
    """One row of one summary.json, with where it came from."""

    run: str  # directory name
    label: str
    kind: str  # bench-serving | simulate | sglang.benchmark.serving
    row: Dict


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "compare-runs",
        help="compare bench-serving and simulate runs: compare.md and compare.png",
        description="Read summary.json of bench-serving and/or simulate output directories and write one "
                    "table (compare.md, SGLang's result keys) and bars of short-request P99 and output throughput "
                    "(compare.png).",
    )
    parser.add_argument("runs", nargs="+", metavar="DIR|FILE",
                        help="bench-serving or simulate output directories, or a sglang.benchmark.serving --output-file")
    parser.add_argument("--output", required=True,
                        help="directory for compare.md and compare.png, or a FILE.md (the plot goes to FILE.png)")
    parser.add_argument("--metrics", metavar="KEY,KEY,...",
                        help="the table's columns, by SGLang's result keys (e.g. p99_ttft_ms,mean_tpot_ms,"
                             "request_throughput,request_goodput) or a length class's (short_p99_e2e_latency_ms); "
                             f"default: {','.join(column.name for column in parse_metrics(None))}; "
                             f"all: {', '.join(KEYS)}")
    parser.set_defaults(func=run)


def run(args) -> int:
    columns = parse_metrics(args.metrics)  # before any file is read: a typo is refused at once
    rows = [row for directory in args.runs for row in load_rows(directory)]
    markdown_path, plot_path = _output_paths(args.output)
    table = markdown_table(rows, columns)
    with open(markdown_path, "w", encoding="utf-8") as handle:
        handle.write("# Runs compared\n\n" + "\n".join(f"- {d}" for d in args.runs) + "\n\n" + table + "\n")
    plot(rows, plot_path)
    print(table)
    print(f"wrote {markdown_path}\nwrote {plot_path}")
    return 0


def load_rows(directory: str) -> List[RunRow]:
    """Every row of ``directory/summary.json``, or of a sglang.benchmark.serving result file; a missing or
    malformed file names itself."""
    if os.path.isfile(directory) and os.path.basename(directory) != SUMMARY:
        return sglang_rows(directory)
    summary = read_summary(directory)
    name = os.path.basename(os.path.normpath(os.path.dirname(os.path.abspath(summary["path"]))))
    kind = summary.get("kind", "simulate")
    return [RunRow(name, _label(row), kind, row) for row in summary["runs"]]


def sglang_rows(path: str) -> List[RunRow]:
    """The runs of a ``sglang.benchmark.serving --output-file``: one row per line, labelled by its settings."""
    from specforge_outlets.loadgen.sglang_result import read_sglang_results, row_from_sglang

    name = os.path.basename(path)
    return [RunRow(name, f"{r.get('backend', 'sglang')} {r.get('dataset_name', '')} rate {r.get('request_rate', '?')}"
                   .replace("  ", " "), "sglang.benchmark.serving", row_from_sglang(r, name))
            for r in read_sglang_results(path)]


def _label(row: Dict) -> str:
    if row.get("label"):
        return str(row["label"])
    parts = [f"{row['routing']} + {row['queue']}" if "routing" in row and "queue" in row else "",
             f"{row['predictor']}" if "predictor" in row else "",
             f"x{row['rate_scale']:g}" if isinstance(row.get("rate_scale"), (int, float)) else ""]
    return ", ".join(part for part in parts if part) or "run"


def _value(row: RunRow, column: CompareKey) -> float:
    try:
        return column.value(row.row)
    except (TypeError, ValueError):
        raise OutletsError(f"run {row.run} ({row.label}): {column.name} is not a number") from None


def markdown_table(rows: List[RunRow], columns: List[CompareKey]) -> str:
    from specforge_outlets.serving.metrics import format_metric, pipe_table

    policy_keys = [key for key in POLICY_KEYS if any(key in r.row for r in rows)]
    header = ["run", "label", "kind"] + policy_keys + [column.name for column in columns]
    return pipe_table(header, (
        [r.run, r.label, r.kind] + [str(r.row.get(key, "–")) for key in policy_keys]
        + [format_metric(_value(r, column), column.fmt) for column in columns]
        for r in rows
    ))


def plot(rows: List[RunRow], path: str) -> None:
    """Two panels of bars, one bar per row: short-request P99 e2e (ms) and output throughput (tok/s)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from specforge_outlets.serving.bars import draw_bars

    names = [f"{r.run}: {r.label}" for r in rows]
    colours = {run: f"C{i % 10}" for i, run in enumerate(dict.fromkeys(r.run for r in rows))}
    figure, axes = plt.subplots(1, 2, figsize=(max(8.0, 0.5 * len(rows) + 4), 4.5))
    for axis, name in zip(axes, PLOT_METRICS):
        draw_bars(axis, names, [_value(r, KEYS[name]) for r in rows], [colours[r.run] for r in rows], rotation=60)
        axis.set_title(name)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _output_paths(output: str) -> Tuple[str, str]:
    if output.endswith(".md"):
        directory = os.path.dirname(output) or "."
        os.makedirs(directory, exist_ok=True)
        return output, output[: -len(".md")] + ".png"
    if os.path.isfile(output):
        raise OutletsError(f"--output {output} is a file; give a directory or a path ending in .md")
    os.makedirs(output, exist_ok=True)
    return os.path.join(output, "compare.md"), os.path.join(output, "compare.png")
