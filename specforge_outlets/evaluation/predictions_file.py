"""The per-request predictions file (``predictions/<predictor>.jsonl``): ``outlets eval`` writes it, the serving side reads it.

One JSON object per request: ``id``, ``predicted_output_len`` (> 0) and, when known,
``true_output_len``; optionally ``trajectory``, the predictor's dynamic estimates (entry k: the
remaining length it predicts at output token k + 1, counting that token, as EAGLE-3 mode re-predicts),
which ``outlets simulate --predictor file-dynamic`` replays. ``outlets simulate --predictor file`` joins it to a trace by id (or, without
a shared id, samples its errors at the same true length); ``outlets bench-serving --predictions``
sends each value with its request. Both read it here, so a file one accepts the other accepts.

A file of several predictors is read with the one to use named (``predictor``): ``outlets eval``'s
complete record (``predictions.jsonl.gz``, gzip-compressed, one row per request with a ``static``
map of r̂₀ and a ``dynamic`` map of trajectories by predictor; a censored row's length is a lower
bound, so it is read as unknown), or rows that each carry a ``predictor`` field (``predictions.jsonl``).
"""

from __future__ import annotations

import gzip
import json
import math
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

from specforge_outlets.data.jsonl import BadLine, iter_jsonl, write_jsonl
from specforge_outlets.errors import OutletsError

# Fields a row's true length may come under (``output_length``: traces and bench-serving records).
TRUE_LENGTH_FIELDS = ("true_output_len", "output_length")
# A row quoted in an error is cut to this many characters: a complete record's row holds every
# predictor's estimate at every output token (kilobytes).
MAX_QUOTED_ROW_CHARS = 200
# The first two bytes of a gzip file (RFC 1952): ``outlets eval``'s complete record is compressed.
GZIP_MAGIC = b"\x1f\x8b"


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


def quoted_row(row: Any) -> str:
    """A row as an error quotes it: its repr, cut to ``MAX_QUOTED_ROW_CHARS``."""
    text = repr(row)
    if len(text) <= MAX_QUOTED_ROW_CHARS:
        return text
    return f"{text[:MAX_QUOTED_ROW_CHARS]}... ({len(text)} characters)"


def _gzip_rows(path: str) -> Iterator[Tuple[int, Any]]:
    """``iter_jsonl`` of a gzip-compressed file: ``(line_number, object_or_BadLine)``."""
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                value = BadLine(f"malformed JSON ({exc.msg} at column {exc.colno})")
            if not isinstance(value, (dict, BadLine)):
                value = BadLine(f"expected a JSON object, got {type(value).__name__}")
            yield number, value


def _rows(path: str) -> Iterator[Tuple[int, Any]]:
    with open(path, "rb") as handle:
        compressed = handle.read(len(GZIP_MAGIC)) == GZIP_MAGIC
    return _gzip_rows(path) if compressed else iter_jsonl(path)


def _predictors_of(row: Dict[str, Any]) -> List[str]:
    return sorted(row["static"]) if isinstance(row.get("static"), dict) else []


def _select(row: Dict[str, Any], predictor: Optional[str], where: str, predictor_flag: str) -> Optional[Dict[str, Any]]:
    """The row as one predictor's (id, predicted_output_len, true length, trajectory), or None: another predictor's."""
    record = isinstance(row.get("static"), dict)
    if predictor is None:
        if record:
            raise OutletsError(
                f"{where}: a row of outlets eval's complete record, with the predictions of "
                f"{', '.join(_predictors_of(row))}; name the one to use with {predictor_flag} NAME")
        return row
    if record:
        if predictor not in row["static"]:
            raise OutletsError(f"{where}: no prediction of {predictor_flag} {predictor!r}; this row has "
                               f"{', '.join(_predictors_of(row))}")
        dynamic = row.get("dynamic") if isinstance(row.get("dynamic"), dict) else {}
        return {"id": row.get("id"), "predicted_output_len": row["static"][predictor],
                # a censored response was cut: its length is a lower bound, not the true length
                "true_output_len": None if row.get("censored") else row.get("true_output_len"),
                "trajectory": dynamic.get(predictor)}
    if "predictor" in row:
        return row if row["predictor"] == predictor else None
    raise OutletsError(f"{where}: {predictor_flag} {predictor!r} names a predictor of a file of several (outlets eval's "
                       "predictions.jsonl.gz or predictions.jsonl), but this row has no 'static' map or 'predictor' "
                       f"field; drop {predictor_flag} for a file of one predictor")


def read_predictions(path: str, flag: str = "--predictions", predictor: Optional[str] = None,
                     predictor_flag: str = "--file-predictor") -> List[PredictionRow]:
    """Every row of the file (of a file of several predictors, ``predictor``'s); a bad row is refused
    naming the flag, the file and the line."""
    if not os.path.isfile(path):
        raise OutletsError(f"{flag} {path}: no such file")
    rows: List[PredictionRow] = []
    first_line: Dict[str, int] = {}  # id -> the line it first appeared on
    seen_predictors: List[str] = []
    try:
        for line_number, raw in _rows(path):
            where = f"{flag} {path} line {line_number}"
            if isinstance(raw, BadLine):
                raise OutletsError(f"{where}: {raw}")
            if "predictor" in raw and str(raw["predictor"]) not in seen_predictors:
                if predictor is None and seen_predictors:
                    raise OutletsError(f"{where}: rows of several predictors ({seen_predictors[0]!r} before, "
                                       f"{raw['predictor']!r} here); name the one to use with {predictor_flag} NAME")
                seen_predictors.append(str(raw["predictor"]))
            seen_predictors = seen_predictors or _predictors_of(raw)
            row = _select(raw, predictor, where, predictor_flag)
            if row is None:
                continue
            if "id" not in row or not _positive(row.get("predicted_output_len")):
                raise OutletsError(f"{where}: needs an id and a positive predicted_output_len, got {quoted_row(raw)}")
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
    except (OSError, EOFError, UnicodeDecodeError) as exc:  # a cut or corrupt gzip file, or not text
        raise OutletsError(f"{flag} {path}: not a readable JSONL or gzip-compressed JSONL file ({exc})") from None
    if not rows:
        if predictor is not None:
            raise OutletsError(f"{flag} {path}: no predictions of {predictor_flag} {predictor!r}"
                               + (f" (predictors in the file: {', '.join(seen_predictors)})" if seen_predictors else ""))
        raise OutletsError(f"{flag} {path}: no predictions")
    return rows


def predictions_by_id(path: str, flag: str = "--predictions", predictor: Optional[str] = None) -> Dict[str, float]:
    return {row.id: row.predicted_output_len for row in read_predictions(path, flag, predictor)}
