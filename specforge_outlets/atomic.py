"""Writing a file so that readers see the old version or the whole new one, never a half-written file.

Every file that crosses stages (capture manifest, predictions, serving summaries) is written
here: to a temporary name in the same directory, flushed to disk, then renamed into place.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from typing import Iterator


def write_text_atomic(path: str, text: str) -> str:
    """Write ``text`` to ``path`` atomically; return ``path``."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    return path


def partial_path(path: str) -> str:
    """Where :func:`directory_replaced` writes ``path`` until it is complete."""
    return path.rstrip("/") + ".partial"


@contextmanager
def directory_replaced(path: str) -> Iterator[str]:
    """A scratch path beside ``path`` (``path.partial``, absent on entry) that replaces ``path`` when the block
    ends without an error: an interrupted writer leaves the old directory, never half a new one."""
    partial = partial_path(path)
    shutil.rmtree(partial, ignore_errors=True)
    yield partial
    shutil.rmtree(path, ignore_errors=True)
    os.replace(partial, path)
