"""The capture manifest (``manifest.json`` beside the feature files): one writer and one reader for every stage.

``outlets capture`` writes it; training's preflight, the learning-curve subsets and ``outlets eval``
read it (the fusion layers the features were captured at, the regenerated JSONL they came from,
one entry per feature file). Written atomically: a stage that stops half-way leaves no manifest
that names files which are not there.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict

from specforge_outlets.atomic import write_text_atomic
from specforge_outlets.errors import OutletsError

MANIFEST = "manifest.json"
LABELS_SUMMARY = "labels_summary.json"  # `outlets capture --add-labels` writes it in place of a manifest


def manifest_path(directory: str) -> str:
    return os.path.join(directory, MANIFEST)


def write_manifest(directory: str, manifest: Dict[str, Any]) -> str:
    """Write ``directory/manifest.json`` under a temporary name, then rename it into place."""
    return write_text_atomic(manifest_path(directory), json.dumps(manifest, indent=2))


def read_manifest(directory: str) -> Dict[str, Any]:
    """The manifest of a feature directory; {} if it has none (features written by other tools)."""
    path = manifest_path(directory)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as handle:
            manifest = json.load(handle)
    except (OSError, json.JSONDecodeError) as exc:
        raise OutletsError(f"{path}: not readable JSON ({exc}); re-run `outlets capture`") from exc
    if not isinstance(manifest, dict):
        raise OutletsError(f"{path}: expected a JSON object, got {type(manifest).__name__}; re-run `outlets capture`")
    return manifest
