"""Request traces: arrival times with prompt and output lengths.

Formats: the Azure LLM inference CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``), JSONL with
``timestamp,input_length,output_length`` (and an optional ``id``), and synthetic Poisson arrivals
with (prompt, output) length pairs drawn from another trace. A JSONL ``timestamp`` is in seconds,
except in the Mooncake trace format (rows with ``hash_ids``, as SGLang's ``bench_serving`` replays
them), where it is in milliseconds: read as seconds, such a trace would offer a thousandth of its load. Arrival times are shifted so that
the first request arrives at 0; rate scaling divides them, so a scale of 2 offers twice the load.
Lengths to draw Poisson requests from (:func:`load_lengths`) can also come from a lengths-only CSV
(``num_prefill_tokens,num_decode_tokens``, as sarathi-serve's ShareGPT statistics), which has no
arrival times and so is not a trace.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass
from datetime import datetime
from typing import List, Optional, Sequence

import numpy as np

from specforge_outlets.data.jsonl import BadLine, iter_jsonl
from specforge_outlets.errors import OutletsError

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
JSONL_FIELDS = ("timestamp", "input_length", "output_length")
MOONCAKE_FIELD = "hash_ids"  # present in the Mooncake trace format, whose timestamps are milliseconds
MOONCAKE_SECONDS_PER_UNIT = 1e-3
LENGTHS_COLUMNS = ("num_prefill_tokens", "num_decode_tokens")  # a lengths-only CSV


@dataclass(frozen=True)
class Trace:
    """Requests in arrival order: ids, arrival times (s, first at 0), prompt and output lengths."""

    name: str
    ids: Sequence[str]
    arrival_times: np.ndarray
    input_lens: np.ndarray
    output_lens: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_times[-1]) if len(self) else 0.0

    @property
    def offered_rps(self) -> float:
        """Mean arrival rate (requests/s) over the trace."""
        return len(self) / self.duration_s if self.duration_s > 0 else math.inf

    def scaled(self, rate_scale: float) -> "Trace":
        """The same requests arriving ``rate_scale`` times faster."""
        if not (rate_scale > 0 and math.isfinite(rate_scale)):
            raise OutletsError(f"--rate-scale must be a positive number, got {rate_scale}")
        return Trace(self.name, self.ids, self.arrival_times / rate_scale, self.input_lens, self.output_lens)

    def head(self, num_requests: int) -> "Trace":
        """The first ``num_requests`` requests."""
        return Trace(
            self.name,
            self.ids[:num_requests],
            self.arrival_times[:num_requests],
            self.input_lens[:num_requests],
            self.output_lens[:num_requests],
        )


def load_trace(path: str) -> Trace:
    """Load an Azure CSV (``.csv``) or a JSONL (``.jsonl``) trace."""
    if not os.path.isfile(path):
        raise OutletsError(f"trace {path}: no such file")
    if path.endswith(".csv"):
        if _is_lengths_csv(path):
            raise OutletsError(
                f"trace {path}: has request lengths ({','.join(LENGTHS_COLUMNS)}) but no arrival times; draw "
                "requests from it with --lengths-from FILE --poisson-rate RPS")
        return _load_azure_csv(path)
    if path.endswith(".jsonl"):
        return _load_jsonl(path)
    raise OutletsError(f"trace {path}: unknown format; use an Azure .csv or a .jsonl with {', '.join(JSONL_FIELDS)}")


def load_lengths(path: str) -> Trace:
    """(prompt, output) lengths to draw requests from: a trace, or a lengths-only CSV (arrival times all 0)."""
    if path.endswith(".csv") and os.path.isfile(path) and _is_lengths_csv(path):
        return _load_lengths_csv(path)
    return load_trace(path)


def poisson_arrival_times(rng: np.random.Generator, rate_rps: float, count: int) -> np.ndarray:
    """Arrival times with exponential gaps at ``rate_rps`` (a finite, positive rate), the first at 0."""
    gaps = rng.exponential(1.0 / rate_rps, size=count)
    return np.cumsum(gaps) - gaps[0]


def synthetic_poisson(lengths_from: Trace, rate_rps: float, num_requests: int, seed: int) -> Trace:
    """Poisson arrivals at ``rate_rps`` with (prompt, output) pairs drawn from another trace."""
    if not (rate_rps > 0 and math.isfinite(rate_rps)):
        raise OutletsError(f"--poisson-rate must be a positive number of requests/s, got {rate_rps}")
    if num_requests < 1:
        raise OutletsError(f"--num-requests must be at least 1, got {num_requests}")
    rng = np.random.default_rng(seed)
    arrivals = poisson_arrival_times(rng, rate_rps, num_requests)
    rows = rng.integers(0, len(lengths_from), size=num_requests)
    return Trace(
        f"poisson-{rate_rps:g}rps-{lengths_from.name}",
        [f"poisson-{index}" for index in range(num_requests)],
        arrivals,
        lengths_from.input_lens[rows],
        lengths_from.output_lens[rows],
    )


def _parse_timestamp(value: str) -> float:
    """Seconds: a number, or an ISO date-time (Azure traces have 7 fractional digits)."""
    try:
        return float(value)
    except ValueError:
        pass
    date, _, fraction = value.strip().partition(".")
    seconds = datetime.fromisoformat(date).timestamp()
    return seconds + (float(f"0.{fraction}") if fraction else 0.0)


def _parse_count(value, where: str, field: str, minimum: int) -> int:
    try:
        number = int(value)
        if number != float(value):
            raise ValueError
    except (TypeError, ValueError):
        raise OutletsError(f"{where}: {field} must be an integer, got {value!r}") from None
    if number < minimum:
        fix = "drop the row" if field in ("GeneratedTokens", "output_length", LENGTHS_COLUMNS[1]) else "fix the row"
        raise OutletsError(f"{where}: {field} must be at least {minimum}, got {number}; {fix}")
    return number


def _check_timestamp(where: str, field: str, value: float, previous: Optional[float]) -> None:
    if not math.isfinite(value) or value < 0:
        raise OutletsError(f"{where}: {field} must be a non-negative time, got {value}")
    if previous is not None and value < previous:
        raise OutletsError(f"{where}: {field} goes back in time ({value} after {previous}); sort the trace by {field}")


def _build(name: str, ids: List[str], times: List[float], inputs: List[int], outputs: List[int], path: str) -> Trace:
    if not ids:
        raise OutletsError(f"trace {path}: no requests")
    arrivals = np.asarray(times, dtype=np.float64)
    return Trace(name, ids, arrivals - arrivals[0], np.asarray(inputs, np.int64), np.asarray(outputs, np.int64))


def _load_azure_csv(path: str) -> Trace:
    ids, times, inputs, outputs = [], [], [], []
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [column for column in AZURE_COLUMNS if column not in (reader.fieldnames or [])]
        if missing:
            raise OutletsError(
                f"trace {path}: missing column(s) {', '.join(missing)}; an Azure trace has the header "
                f"{','.join(AZURE_COLUMNS)}"
            )
        previous = None
        for row_index, row in enumerate(reader):
            where = f"trace {path} line {reader.line_num} (row {row_index})"
            try:
                timestamp = _parse_timestamp(row["TIMESTAMP"])
            except (TypeError, ValueError):
                raise OutletsError(f"{where}: TIMESTAMP {row['TIMESTAMP']!r} is neither seconds nor a date-time") from None
            _check_timestamp(where, "TIMESTAMP", timestamp, previous)
            previous = timestamp
            ids.append(str(row_index))
            times.append(timestamp)
            inputs.append(_parse_count(row["ContextTokens"], where, "ContextTokens", 1))
            outputs.append(_parse_count(row["GeneratedTokens"], where, "GeneratedTokens", 1))
    return _build(os.path.basename(path).rsplit(".", 1)[0], ids, times, inputs, outputs, path)


def _is_lengths_csv(path: str) -> bool:
    with open(path, newline="", encoding="utf-8") as handle:
        columns = next(csv.reader(handle), [])
    return all(column in columns for column in LENGTHS_COLUMNS) and AZURE_COLUMNS[0] not in columns


def _load_lengths_csv(path: str) -> Trace:
    ids, inputs, outputs = [], [], []
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        for row_index, row in enumerate(reader):
            where = f"lengths {path} line {reader.line_num} (row {row_index})"
            ids.append(str(row_index))
            inputs.append(_parse_count(row[LENGTHS_COLUMNS[0]], where, LENGTHS_COLUMNS[0], 1))
            outputs.append(_parse_count(row[LENGTHS_COLUMNS[1]], where, LENGTHS_COLUMNS[1], 1))
    return _build(os.path.basename(path).rsplit(".", 1)[0], ids, [0.0] * len(ids), inputs, outputs, path)


def _load_jsonl(path: str) -> Trace:
    ids, times, inputs, outputs = [], [], [], []
    previous = None
    mooncake: Optional[bool] = None  # decided by the first row: hash_ids = Mooncake, timestamps in ms
    for line_number, row in iter_jsonl(path):
        if isinstance(row, BadLine):
            raise OutletsError(str(row))
        where = f"trace {path} line {line_number}"
        missing = [field for field in JSONL_FIELDS if field not in row]
        if missing:
            raise OutletsError(f"{where}: missing field(s) {', '.join(missing)}; each line needs {', '.join(JSONL_FIELDS)}")
        if mooncake is None:
            mooncake = MOONCAKE_FIELD in row
        elif (MOONCAKE_FIELD in row) != mooncake:
            raise OutletsError(
                f"{where}: {'has no' if mooncake else 'has'} {MOONCAKE_FIELD}, unlike line 1: the trace mixes Mooncake "
                "rows (timestamps in milliseconds) with plain rows (seconds); convert it to one format")
        try:
            timestamp = float(row["timestamp"]) * (MOONCAKE_SECONDS_PER_UNIT if mooncake else 1.0)
        except (TypeError, ValueError):
            unit = "milliseconds (Mooncake format)" if mooncake else "seconds"
            raise OutletsError(f"{where}: timestamp must be a number of {unit}, got {row['timestamp']!r}") from None
        _check_timestamp(where, "timestamp", timestamp, previous)
        previous = timestamp
        ids.append(str(row.get("id", len(ids))))
        times.append(timestamp)
        inputs.append(_parse_count(row["input_length"], where, "input_length", 1))
        outputs.append(_parse_count(row["output_length"], where, "output_length", 1))
    if len(set(ids)) != len(ids):
        raise OutletsError(f"trace {path}: ids are not unique; give each line its own id or drop the id field")
    return _build(os.path.basename(path).rsplit(".", 1)[0], ids, times, inputs, outputs, path)
