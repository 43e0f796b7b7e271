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
The complete record's own rows, every predictor's, checked, are :func:`iter_record`'s: the serving
benchmarks replay them (``specforge_outlets/studies/committed_data.py``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

from specforge_outlets.data.jsonl import BadLine, iter_jsonl, write_jsonl
from specforge_outlets.errors import OutletsError

# Fields a row's true length may come under (``output_length``: traces and bench-serving records).
TRUE_LENGTH_FIELDS = ("true_output_len", "output_length")
# Every row of ``outlets eval``'s complete record holds these (``report.request_rows`` writes them).
RECORD_FIELDS = ("id", "true_output_len", "censored", "static", "dynamic")
# A row quoted in an error is cut to this many characters: a complete record's row holds every
# predictor's estimate at every output token (kilobytes).
MAX_QUOTED_ROW_CHARS = 200


@dataclass(frozen=True)
class PredictionRow:
    id: str
    predicted_output_len: float
    true_output_len: Optional[float] = None
    trajectory: Optional[Tuple[float, ...]] = None
    # a quantile predictor's (a predicted length distribution): the levels, the whole length's quantiles at them, and
    # entry k of ``quantile_trajectory`` the remaining length's quantiles at output token k + 1
    # (as ``trajectory``); checked where they are used (``simulation/predicted_lengths.py``)
    quantile_levels: Optional[Tuple[float, ...]] = None
    quantiles: Optional[Tuple[float, ...]] = None
    quantile_trajectory: Optional[Tuple[Tuple[float, ...], ...]] = None


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


def _lines(path: str, flag: str) -> Iterator[Tuple[int, Dict[str, Any]]]:
    """``(line_number, row)`` of a plain or gzip-compressed JSONL file; a missing or unreadable file
    or a line that is not a JSON object is refused naming the flag, the file and the line."""
    if not os.path.isfile(path):
        raise OutletsError(f"{flag} {path}: no such file")
    try:
        for number, row in iter_jsonl(path):
            if isinstance(row, BadLine):
                raise OutletsError(f"{flag} {row}")
            yield number, row
    except (OSError, EOFError, UnicodeDecodeError) as exc:  # a cut or corrupt gzip file, or not text
        raise OutletsError(f"{flag} {path}: not a readable JSONL or gzip-compressed JSONL file ({exc})") from None


def iter_record(path: str, flag: str = "--predictions") -> Iterator[Tuple[int, Dict[str, Any]]]:
    """``(line_number, row)`` of each row of ``outlets eval``'s complete record (``predictions.jsonl.gz``).

    Every row is checked to hold ``RECORD_FIELDS``: ``id``; ``true_output_len``, a positive number
    (for a censored response the length it ran to, a lower bound); ``censored``, true or false;
    ``static``, each predictor's r̂₀; ``dynamic``, each re-predicting predictor's estimate at every
    output token. A row that does not is refused naming ``flag``, the file and the line.
    """
    for number, row in _lines(path, flag):
        missing = [field for field in RECORD_FIELDS if field not in row]
        if missing:
            problem = f"no {', '.join(missing)}"
        elif not _positive(row["true_output_len"]):
            problem = f"true_output_len must be a positive number, got {row['true_output_len']!r}"
        elif not isinstance(row["censored"], bool):
            problem = f"censored must be true or false, got {row['censored']!r}"
        elif not (isinstance(row["static"], dict) and isinstance(row["dynamic"], dict)):
            problem = "static and dynamic must be maps by predictor name"
        else:
            yield number, row
            continue
        raise OutletsError(f"{flag} {path} line {number}: {problem}; not a row of outlets eval's complete record "
                           f"({quoted_row(row)})")


def _is_record(path: str, flag: str) -> bool:
    """Whether the file is ``outlets eval``'s complete record: its first row has a ``static`` map."""
    for _, row in _lines(path, flag):
        return isinstance(row.get("static"), dict)
    return False


def _select(row: Dict[str, Any], record: bool, predictor: Optional[str], where: str,
            predictor_flag: str) -> Optional[Dict[str, Any]]:
    """The row as one predictor's (id, predicted_output_len, true length, trajectory), or None: another predictor's."""
    if record:
        if predictor is None:
            raise OutletsError(
                f"{where}: a row of outlets eval's complete record, with the predictions of "
                f"{', '.join(sorted(row['static']))}; name the one to use with {predictor_flag} NAME")
        if predictor not in row["static"]:
            raise OutletsError(f"{where}: no prediction of {predictor_flag} {predictor!r}; this row has "
                               f"{', '.join(sorted(row['static']))}")
        quantiles = (row.get("quantiles") or {}).get(predictor) or {}
        return {"id": row["id"], "predicted_output_len": row["static"][predictor],
                # a censored response was cut: its length is a lower bound, not the true length
                "true_output_len": None if row["censored"] else row["true_output_len"],
                "trajectory": row["dynamic"].get(predictor),
                **({"quantile_levels": row.get("quantile_levels"), "quantiles": quantiles.get("static"),
                    "quantile_trajectory": quantiles.get("dynamic")} if quantiles else {})}
    if predictor is None:
        return row
    if "predictor" in row:
        return row if row["predictor"] == predictor else None
    raise OutletsError(f"{where}: {predictor_flag} {predictor!r} names a predictor of a file of several (outlets eval's "
                       "predictions.jsonl.gz or predictions.jsonl), but this row has no 'static' map or 'predictor' "
                       f"field; drop {predictor_flag} for a file of one predictor")


def read_predictions(path: str, flag: str = "--predictions", predictor: Optional[str] = None,
                     predictor_flag: str = "--file-predictor") -> List[PredictionRow]:
    """Every row of the file (of a file of several predictors, ``predictor``'s); a bad row is refused
    naming the flag, the file and the line."""
    record = _is_record(path, flag)
    rows: List[PredictionRow] = []
    first_line: Dict[str, int] = {}  # id -> the line it first appeared on
    seen_predictors: List[str] = []
    for line_number, raw in iter_record(path, flag) if record else _lines(path, flag):
        where = f"{flag} {path} line {line_number}"
        if record:
            seen_predictors = seen_predictors or sorted(raw["static"])
        elif "predictor" in raw and str(raw["predictor"]) not in seen_predictors:
            if predictor is None and seen_predictors:
                raise OutletsError(f"{where}: rows of several predictors ({seen_predictors[0]!r} before, "
                                   f"{raw['predictor']!r} here); name the one to use with {predictor_flag} NAME")
            seen_predictors.append(str(raw["predictor"]))
        row = _select(raw, record, predictor, where, predictor_flag)
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
                                  None if trajectory is None else tuple(float(value) for value in trajectory),
                                  *_quantile_fields(row)))
    if not rows:
        if predictor is not None:
            raise OutletsError(f"{flag} {path}: no predictions of {predictor_flag} {predictor!r}"
                               + (f" (predictors in the file: {', '.join(seen_predictors)})" if seen_predictors else ""))
        raise OutletsError(f"{flag} {path}: no predictions")
    return rows


def _quantile_fields(row: Dict[str, Any]) -> Tuple[Any, Any, Any]:
    """``quantile_levels``, ``quantiles`` and ``quantile_trajectory`` as tuples where present (unchecked here)."""
    def as_tuple(value, depth: int):
        if not isinstance(value, list):
            return value
        return tuple(as_tuple(item, depth - 1) if depth > 1 else item for item in value)

    return (as_tuple(row.get("quantile_levels"), 1), as_tuple(row.get("quantiles"), 1),
            as_tuple(row.get("quantile_trajectory"), 2))


def predictions_by_id(path: str, flag: str = "--predictions", predictor: Optional[str] = None) -> Dict[str, float]:
    return {row.id: row.predicted_output_len for row in read_predictions(path, flag, predictor)}
