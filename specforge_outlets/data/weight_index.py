"""SpecForge reads the frozen target head through ``*.index.json``; give single-file targets one.

``save_pretrained`` writes an index only for sharded checkpoints, yet SpecForge's ``TargetHead``
requires one. The index is part of the Hugging Face layout, so transformers loads the directory
exactly as before.
"""

from __future__ import annotations

import glob
import json
import os
import sys
from typing import Dict, Optional

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


def read_index(directory: str) -> Optional[Dict[str, str]]:
    """Tensor name -> file from the directory's ``*.index.json``; None when it has none."""
    indexes = sorted(glob.glob(os.path.join(directory, "*.index.json")))
    if not indexes:
        return None
    with open(indexes[0], encoding="utf-8") as f:
        return json.load(f)["weight_map"]


def read_weight_map(directory: str) -> Dict[str, str]:
    """Tensor name -> file: the index when there is one, else the keys of every ``*.safetensors``."""
    weight_map = read_index(directory)
    if weight_map is not None:
        return weight_map
    weight_map = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.safetensors"))):
        with safe_open(path, framework="pt") as f:
            weight_map.update({key: os.path.basename(path) for key in f.keys()})
    return weight_map


if __name__ == "__main__":
    print(write_weight_index(sys.argv[1]))
