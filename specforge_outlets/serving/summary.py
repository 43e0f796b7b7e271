"""``summary.json`` of a serving run, simulated or measured: one writer and one reader.

``{...header, "runs": [row, ...]}``, each row with ``metrics`` for ``all``, ``short`` and ``long``
(``metrics.py``). ``outlets simulate`` and ``outlets bench-serving`` write it; ``outlets
compare-runs`` reads it. A run is complete when its summary.json is there: writers write it last.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List

from specforge_outlets.atomic import write_text_atomic
from specforge_outlets.errors import OutletsError
from specforge_outlets.serving.metrics import CLASSES
from specforge_outlets.strict_json import json_safe
from specforge_outlets.wandb_report import Table

SUMMARY = "summary.json"


def write_summary(output_dir: str, header: Dict[str, Any], runs: List[Dict[str, Any]]) -> str:
    """Write ``output_dir/summary.json`` atomically; return its path."""
    text = json.dumps(json_safe({**header, "runs": runs}), indent=2, allow_nan=False) + "\n"
    return write_text_atomic(os.path.join(output_dir, SUMMARY), text)


def read_summary(directory_or_file: str) -> Dict[str, Any]:
    """A summary with its ``runs`` checked; a missing or malformed file is refused naming it."""
    path = os.path.join(directory_or_file, SUMMARY) if os.path.isdir(directory_or_file) else directory_or_file
    if not os.path.isfile(path):
        raise OutletsError(f"{directory_or_file}: no {SUMMARY}; give an output directory of outlets bench-serving or "
                           "outlets simulate (an interrupted run has none)")
    try:
        with open(path, encoding="utf-8") as handle:
            summary = json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise OutletsError(f"{path}: not valid JSON ({exc}); rerun the command that wrote it") from None
    runs = summary.get("runs") if isinstance(summary, dict) else None
    if not isinstance(runs, list) or not runs:
        raise OutletsError(f"{path}: no 'runs' list; not a summary of outlets bench-serving or outlets simulate")
    for index, row in enumerate(runs):
        metrics = row.get("metrics") if isinstance(row, dict) else None
        if not isinstance(metrics, dict) or any(not isinstance(metrics.get(c), dict) for c in CLASSES):
            raise OutletsError(f"{path}: runs[{index}] has no metrics for all/short/long; rerun the command that wrote it")
    return {**summary, "path": path}


def summary_rows_table(runs: Sequence[Dict[str, Any]]) -> Table:
    """A summary.json's ``runs`` as one table: each row's own fields, then ``CLASS/metric`` columns."""
    columns: List[str] = []
    flat_rows = []
    for run in runs:
        flat = {key: value for key, value in run.items() if key != "metrics" and not isinstance(value, (dict, list))}
        flat.update({f"{cls}/{key}": value for cls in CLASSES for key, value in run["metrics"][cls].items()})
        columns += [key for key in flat if key not in columns]
        flat_rows.append(flat)
    return columns, [[json_safe(row.get(column)) for column in columns] for row in flat_rows]
