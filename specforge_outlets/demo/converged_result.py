"""The method's real result, shown beside the demo's smoke run: the committed converged export, rescored.

The demo's own draft trains for minutes on a few dozen conversations: it shows that the pipeline
runs, not what the method predicts. The convergence study's OUTLETS export
(``benchmarks/data/sharegpt-smollm2/convergence/draft-outlets/``, trained to its budget on the
ShareGPT label set) is committed with its evaluation record, every test request's r̂₀ and r̂_t as
``outlets eval`` predicted them. The demo rescores that record with the evaluation's own scoring
(``evaluation.report.score``), so what it prints is computed on this machine, not pasted; the
record is in a checkout only (not in an installed package).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np

from specforge_outlets import resources
from specforge_outlets.evaluation.predictions_file import iter_record
from specforge_outlets.evaluation.predictor_api import Prediction
from specforge_outlets.evaluation.report import score
from specforge_outlets.evaluation.requests import Request, Split

CONVERGENCE_DIR = os.path.join(resources.CHECKOUT_DIR, "benchmarks", "data", "sharegpt-smollm2", "convergence")
EXPORT_DIR = os.path.join(CONVERGENCE_DIR, "draft-outlets")
EVAL_DIR = os.path.join(CONVERGENCE_DIR, "eval")
RECORD = "predictions.jsonl.gz"  # the evaluation's complete record (evaluation/report.py)
REPORT = "report.json"  # the evaluation's report: what was scored (draft, training requests)
# The method and the baseline it has to beat, in the order printed.
SHOWN = ("outlets", "constant")
# The command that wrote the record (docs/results.md, "On the test split").
REPRODUCE = "python benchmarks/convergence.py --run RUN test"


@dataclass(frozen=True)
class ConvergedResult:
    draft: str  # the export's name as the evaluation recorded it
    n_train_requests: int
    n_requests: int  # finished test requests scored (censored ones have no true length)
    scores: Dict[str, Dict]  # predictor -> evaluation.report.score's entry


def rescore(eval_dir: str = EVAL_DIR) -> Optional[ConvergedResult]:
    """The shown predictors scored from the committed record; ``None`` where it is not on this machine."""
    record = os.path.join(eval_dir, RECORD)
    if not os.path.isfile(record):
        return None
    rows = [row for _, row in iter_record(record, "the converged export's evaluation record") if not row["censored"]]
    test = Split(eval_dir, [Request(row["id"], record, 0, int(row["true_output_len"]), None) for row in rows], {}, 0)
    scores = {name: score(test, predictions(rows, name), "model") for name in SHOWN}
    with open(os.path.join(eval_dir, REPORT), encoding="utf-8") as f:
        report = json.load(f)
    return ConvergedResult(report["draft"], int(report["n_train_requests"]), len(rows), scores)


def predictions(rows: List[Dict], name: str) -> List[Prediction]:
    """One predictor's r̂₀ per row, with its r̂_t where the record holds them (re-predicting predictors)."""
    return [Prediction(float(row["static"][name]),
                       np.asarray(row["dynamic"][name], np.float64) if name in row["dynamic"] else None)
            for row in rows]
