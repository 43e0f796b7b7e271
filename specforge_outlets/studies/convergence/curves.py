"""A convergence run's layout (``--run``) and ``curves.json``, where each draft's validation points go.

The drafts train side by side, each writing only its own entry, under a lock; ``curves.png`` is drawn
again with every entry written.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
from typing import Any, Dict, Optional

from specforge_outlets.atomic import write_text_atomic
from specforge_outlets.evaluation.checkpoint_curve import plot_curves
from specforge_outlets.studies.committed_data import LABEL_SET

REPORT = os.path.join(LABEL_SET, "convergence")  # curves.json and curves.png, committed
DEFAULT_BUDGET = 4000  # optimizer steps per draft, for runs that record none yet


def paths(run: str) -> Dict[str, str]:
    base = os.path.join(run, "convergence")
    return {"base": base, "fit": os.path.join(base, "features", "fit"), "val": os.path.join(base, "features", "val"),
            "train": os.path.join(run, "features", "train")}


def recorded_budget(report: str) -> int:
    """The budget ``report``'s curves.json records, or DEFAULT_BUDGET before any run wrote one."""
    path = os.path.join(report, "curves.json")
    if not os.path.exists(path):
        return DEFAULT_BUDGET
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)["budget"]


def read_curves(args: argparse.Namespace) -> Dict[str, Any]:
    path = os.path.join(args.report, "curves.json")
    if not os.path.exists(path):
        return {"budget": args.budget, "drafts": {}}
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def write_entry(args: argparse.Namespace, name: str, entry: Dict[str, Any]) -> None:
    """Store one run's entry; the drafts train side by side, so each writes only its own, under a lock."""
    os.makedirs(args.report, exist_ok=True)
    with open(os.path.join(paths(args.run)["base"], "curves.lock"), "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        curves = read_curves(args)
        curves["budget"] = args.budget
        curves["drafts"][name] = entry
        write_text_atomic(os.path.join(args.report, "curves.json"), json.dumps(curves, indent=2))
        plot_curves({run: value["points"] for run, value in curves["drafts"].items()},
                    os.path.join(args.report, "curves.png"))


def run_name(draft: str, variant: Optional[str], train_files: Optional[int] = None) -> str:
    """A draft's run, a variant's (``outlets-float32``: bf16's effect at equal steps) or a subset's (``outlets-n263``)."""
    return (draft if variant is None else f"{draft}-{variant}") + (f"-n{train_files}" if train_files else "")


def train_dir(args: argparse.Namespace, name: str) -> str:
    return os.path.join(paths(args.run)["base"], f"train-{name}")


def export_dir(args: argparse.Namespace, name: str, step: int) -> str:
    """Where run ``name``'s checkpoint at ``step`` is exported (``evaluate_new`` writes it)."""
    return os.path.join(paths(args.run)["base"], "exports", f"{name}-step{step}")
