"""SpecForge reads the frozen target head through ``*.index.json``; give single-file targets one.

``save_pretrained`` writes an index only for sharded checkpoints, yet SpecForge's ``TargetHead``
requires one. The index is part of the Hugging Face layout, so transformers loads the directory
exactly as before.
"""

from __future__ import annotations

import json
import os
import sys

from safetensors import safe_open

INDEX_FILE = "model.safetensors.index.json"
WEIGHTS_FILE = "model.safetensors"


def write_weight_index(directory: str) -> str:
    """Write ``model.safetensors.index.json`` for a single-file checkpoint; returns its path."""
    weights = os.path.join(directory, WEIGHTS_FILE)
    with safe_open(weights, framework="pt") as f:
        keys = sorted(f.keys())
    index = {"metadata": {"total_size": os.path.getsize(weights)}, "weight_map": {k: WEIGHTS_FILE for k in keys}}
    path = os.path.join(directory, INDEX_FILE)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(index, f, indent=2)
    os.replace(tmp, path)
    return path


if __name__ == "__main__":
    print(write_weight_index(sys.argv[1]))
