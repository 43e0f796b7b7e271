"""The per-request predictions file (``predictions/<predictor>.jsonl``): ``outlets eval`` writes it, the serving side reads it.

One JSON object per request: ``id``, ``predicted_output_len`` (> 0) and, when known,
``true_output_len``; optionally ``trajectory``, the predictor's dynamic estimates (entry k: the
remaining length it predicts at output token k + 1, counting that token, as EAGLE-3 mode re-predicts),
which ``outlets simulate --predictor file-dynamic`` replays. ``outlets simulate --predictor file`` joins it to a trace by id (or, without
a shared id, samples its errors at the same true length); ``outlets bench-serving --predictions``
sends each value with its request. Both read it here, so a file one accepts the other accepts.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from specforge_outlets.data.jsonl import BadLine, iter_jsonl, write_jsonl
from specforge_outlets.errors import OutletsError

# Fields a row's true length may come under (``output_length``: traces and bench-serving records).
TRUE_LENGTH_FIELDS = ("true_output_len", "output_length")


@dataclass(frozen=True)
class PredictionRow:
    id: str
    predicted_output_len: float
    true_output_len: Optional[float] = None
    trajectory: Optional[Tuple[float, ...]] = None


def write_predictions(path: str, rows: List[PredictionRow]) -> None:
    """Write the file atomically (temporary name, then rename)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_jsonl(path, [{"id": row.id, "predicted_output_len": row.predicted_output_len,
                        "true_output_len": row.true_output_len,
                        **({"trajectory": list(row.trajectory)} if row.trajectory is not None else {})}
                       for row in rows])


def _positive(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def read_predictions(path: str, flag: str = "--predictions") -> List[PredictionRow]:
    """Every row of the file; a bad row is refused naming the flag, the file and the line."""
    if not os.path.isfile(path):
        raise OutletsError(f"{flag} {path}: no such file")
    rows: List[PredictionRow] = []
    first_line: Dict[str, int] = {}  # id -> the line it first appeared on
    for line_number, row in iter_jsonl(path):
        where = f"{flag} {path} line {line_number}"
        if isinstance(row, BadLine):
            raise OutletsError(f"{where}: {row}")
        if "id" not in row or not _positive(row.get("predicted_output_len")):
            raise OutletsError(f"{where}: needs an id and a positive predicted_output_len, got {row!r}")
        true = next((row[field] for field in TRUE_LENGTH_FIELDS if row.get(field) is not None), None)
        if true is not None and not _positive(true):
            raise OutletsError(f"{where}: {TRUE_LENGTH_FIELDS[0]} must be a positive number, got {true!r}")
        trajectory = row.get("trajectory")
        if trajectory is not None and not (isinstance(trajectory, list) and trajectory and all(
                _positive(value) or value == 0 for value in trajectory)):
            raise OutletsError(f"{where}: trajectory must be a non-empty list of non-negative numbers (the "
                               "estimate at each output token)")
        request_id = str(row["id"])
        if request_id in first_line:
            raise OutletsError(f"{where}: id {request_id!r} again (first on line {first_line[request_id]}); "
                               "one prediction per request: drop or rename the duplicate")
        first_line[request_id] = line_number
        rows.append(PredictionRow(request_id, float(row["predicted_output_len"]),
                                  None if true is None else float(true),
                                  None if trajectory is None else tuple(float(value) for value in trajectory)))
    if not rows:
        raise OutletsError(f"{flag} {path}: no predictions")
    return rows


def predictions_by_id(path: str, flag: str = "--predictions") -> Dict[str, float]:
    return {row.id: row.predicted_output_len for row in read_predictions(path, flag)}
