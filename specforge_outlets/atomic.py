"""Writing a file so that readers see the old version or the whole new one, never a half-written file.

Every file that crosses stages (capture manifest, predictions, serving summaries) is written
here: to a temporary name in the same directory, flushed to disk, then renamed into place.
"""

from __future__ import annotations

import os


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
