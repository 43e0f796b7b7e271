"""JSONL reading that names bad lines, and an append-only writer that survives crashes.

:func:`iter_jsonl` reads gzip-compressed files too (``outlets eval``'s ``predictions.jsonl.gz``),
told apart by their first bytes rather than their name.

Regeneration runs for hours against servers that fail; its output is append-only with one
complete row per line, flushed and synced as soon as the row is done. A crash can at worst leave
one partial last line, which :func:`recover_jsonl` cuts off before a resumed run appends to it.
"""

from __future__ import annotations

import gzip
import json
import os
from typing import IO, Any, Dict, Iterator, List, Optional, Tuple

from specforge_outlets.atomic import write_text_atomic


# The first two bytes of a gzip file (RFC 1952).
GZIP_MAGIC = b"\x1f\x8b"


class BadLine(Exception):
    """A line that is not a JSON object; the message says which line and why."""


def _open_text(path: str) -> IO[str]:
    """``path`` opened for reading as UTF-8 text, decompressed if it is a gzip file."""
    with open(path, "rb") as handle:
        compressed = handle.read(len(GZIP_MAGIC)) == GZIP_MAGIC
    return gzip.open(path, "rt", encoding="utf-8") if compressed else open(path, "r", encoding="utf-8")


def iter_jsonl(path: str) -> Iterator[Tuple[int, Any]]:
    """Yield ``(line_number, object_or_BadLine)`` for each non-blank line (1-based numbers) of a plain
    or gzip-compressed file; a cut or corrupt gzip file raises ``OSError`` or ``EOFError`` as it is read."""
    with _open_text(path) as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                yield number, BadLine(f"{path}:{number}: malformed JSON ({exc.msg} at column {exc.colno})")
                continue
            if not isinstance(value, dict):
                yield number, BadLine(f"{path}:{number}: expected a JSON object, got {type(value).__name__}")
                continue
            yield number, value


def write_jsonl(path: str, rows: List[Dict[str, Any]]) -> None:
    """Write a whole file atomically (temporary name, then rename)."""
    write_text_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def recover_jsonl(path: str) -> List[Dict[str, Any]]:
    """Read the complete rows of an append-only file and cut off a partial last line, if any."""
    if not os.path.exists(path):
        return []
    rows: List[Dict[str, Any]] = []
    good_bytes = 0
    with open(path, "rb") as handle:
        for raw in handle:
            try:
                if not raw.endswith(b"\n"):
                    raise ValueError("no newline: the writer was interrupted")
                row = json.loads(raw)
            except ValueError:
                break
            rows.append(row)
            good_bytes += len(raw)
    if good_bytes != os.path.getsize(path):
        print(f"{path}: dropping an incomplete last line left by an interrupted run")
        with open(path, "r+b") as handle:
            handle.truncate(good_bytes)
    return rows


class AppendWriter:
    """One JSON object per line, each written whole, flushed and fsynced before returning."""

    def __init__(self, path: str) -> None:
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        self.path = path
        self._handle = open(path, "a", encoding="utf-8")

    def write(self, row: Dict[str, Any]) -> None:
        self._handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> "AppendWriter":
        return self

    def __exit__(self, *exc: Optional[BaseException]) -> None:
        self.close()
