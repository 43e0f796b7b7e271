"""``report.json`` of ``outlets eval``: one writer, and one typed reader for what later stages read from it.

The demo's summary, the learning curve and the ShareGPT benchmark read the same few fields (the
test split, its size, each predictor's scores, the noise floor); they read them here as
:class:`EvalReport`, so a report of another version or a field renamed is refused in one place,
naming the file, instead of failing with a ``KeyError`` three modules away.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from specforge_outlets.atomic import write_text_atomic
from specforge_outlets.errors import OutletsError

REPORT = "report.json"
REPORT_VERSION = 2  # bumped when a field readers use changes


@dataclass(frozen=True)
class PredictorScore:
    static_mae: float
    static_mae_ci: Tuple[float, float]
    dynamic_mae: Optional[float]
    spearman: Optional[float]


@dataclass(frozen=True)
class EvalReport:
    path: str
    features: str  # the test split's feature directory
    n_requests: int  # finished test requests, the ones scored
    n_train_requests: int
    predictors: Dict[str, PredictorScore]  # in the report's order
    noise_floor_static_mae: Optional[float]


def recorded_path(path: Optional[str]) -> Optional[str]:
    """An input as a report records it, naming it without saying where on this machine it was: relative to
    the current directory when under it (a checkout's runs/), else the directory it is in and its name
    (``specforge-outlets/smollm2-135m`` for a target in a model cache), so a committed report holds no home
    or scratch path and two reports of one test split still record the same name."""
    if path is None:
        return None
    absolute = os.path.abspath(path)
    here = os.getcwd()
    if absolute.startswith(here + os.sep):
        return os.path.relpath(absolute, here)
    parent, name = os.path.split(absolute)
    return os.path.join(os.path.basename(parent), name)


def write_report(directory: str, report: Dict[str, Any]) -> str:
    """Write ``directory/report.json`` atomically (last: its presence means the evaluation finished)."""
    return write_text_atomic(os.path.join(directory, REPORT), json.dumps(report, indent=2))


def read_report(directory: str) -> EvalReport:
    path = os.path.join(directory, REPORT) if os.path.isdir(directory) else directory
    if not os.path.isfile(path):
        raise OutletsError(f"{directory}: no {REPORT}; run `outlets eval` (an interrupted one writes none)")
    try:
        with open(path, encoding="utf-8") as handle:
            raw = json.load(handle)
    except (OSError, json.JSONDecodeError) as exc:
        raise OutletsError(f"{path}: not readable JSON ({exc}); rerun `outlets eval`") from None
    if not isinstance(raw, dict) or raw.get("version") != REPORT_VERSION:
        found = raw.get("version") if isinstance(raw, dict) else None
        raise OutletsError(f"{path}: report version {found}, this package reads {REPORT_VERSION}; rerun `outlets eval`")
    try:
        predictors = {
            name: PredictorScore(float(entry["static_mae"]), tuple(entry["static_mae_ci"]),
                                 entry.get("dynamic_mae"), entry.get("spearman"))
            for name, entry in raw["predictors"].items()}
        floor = raw.get("noise_floor")
        return EvalReport(path, str(raw["features"]), int(raw["n_requests"]), int(raw["n_train_requests"]), predictors,
                          None if not floor else float(floor["static_mae"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise OutletsError(f"{path}: malformed report ({type(exc).__name__}: {exc}); rerun `outlets eval`") from None
