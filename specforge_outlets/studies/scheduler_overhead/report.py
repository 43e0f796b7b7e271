"""``report.md``: the measured parts' tables."""

from __future__ import annotations

from typing import List

def ratio_table(ordering: List[dict]) -> str:
    lines = ["| waiting | outlets sjf | outlets tail-safe | lof | hrrn | shortest-prefill-first | sjf / lof | tail-safe / lof |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for kind in ("steady", "first"):
        lines.append(f"| *{'steady round' if kind == 'steady' else 'first sort (no cached keys)'}* |||||||| ")
        for row in ordering:
            get = lambda name: row[f"{name} {kind} ms"]  # noqa: E731
            lines.append(
                f"| {row['waiting']:,} | {get('outlets sjf'):.3f} ms | {get('outlets tail-safe'):.3f} ms | "
                f"{get('lof'):.3f} ms | {get('hrrn'):.3f} ms | {get('shortest-prefill-first'):.3f} ms | "
                f"x{get('outlets sjf') / get('lof'):.2f} | x{get('outlets tail-safe') / get('lof'):.2f} |")
    return "\n".join(lines)


def measured_by(result: dict, part: str) -> str:
    return f"Measured by `{result['commands'][part]}` ({result['machines'][part]})."


def report(result: dict) -> str:
    """The measured parts' tables (a fresh output measured with ``--parts`` has only those)."""
    parts = ["# Scheduler hot-path overhead"]
    if "ordering" in result:
        parts += ["", "## Ordering, per scheduling round", "", measured_by(result, "ordering"), "",
                  ratio_table(result["ordering"])]
    if "routing" in result:
        parts += ["", "## Routing, per dispatch", "", measured_by(result, "routing"), "",
                  "| ranks | round_robin | total_tokens | outlets | outlets / total_tokens |", "|---:|---:|---:|---:|---:|"]
        parts += [f"| {row['ranks']} | {row['round_robin us']:.2f} us | {row['total_tokens us']:.2f} us | "
                  f"{row['outlets us']:.2f} us | x{row['outlets us'] / row['total_tokens us']:.2f} |"
                  for row in result["routing"]]
    if "snapshot" in result:
        parts += ["", "## Load snapshot, per publish (scheduler side)", "", measured_by(result, "snapshot"), "",
                  "| running | waiting | added by outlets |", "|---:|---:|---:|"]
        parts += [f"| {row['running']} | {row['waiting']:,} | {row['added ms']:.3f} ms |" for row in result["snapshot"]]
    if "predictor" in result:
        parts += ["", f"## Predictor-only mode, per request (CPU, 1 thread, draft {result['draft']})", "",
                  measured_by(result, "predictor"), "",
                  "| prompt tokens | per request | per prefill token |", "|---:|---:|---:|"]
        parts += [f"| {row['prompt tokens']} | {row['ms per request']:.2f} ms | {row['us per prefill token']:.1f} us |"
                  for row in result["predictor"]]
    return "\n".join(parts) + "\n"
