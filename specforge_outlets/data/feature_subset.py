"""A seeded subset of a captured feature directory, for learning curves.

The method's scaling claim is that the length head improves with more training responses; to
measure it, the same pipeline trains on 250, 500, 1,000 and all responses. A subset is a directory
of symbolic links to the chosen feature files with a manifest that lists only them, so training and
evaluation read it like any capture output and nothing is copied.
"""

from __future__ import annotations

import os
import random

from specforge_outlets.data.manifest import MANIFEST, read_manifest, write_manifest
from specforge_outlets.data.features import FEATURE_SUFFIX
from specforge_outlets.errors import OutletsError


def subset_features(source: str, destination: str, count: int, seed: int = 0) -> str:
    """Link ``count`` of the feature files of ``source`` (drawn with ``seed``) into ``destination``.

    The draw is nested: with the same seed, the files of a smaller subset are among those of a
    larger one, so the points of a learning curve differ only by the data added.
    """
    manifest = read_manifest(source)
    if not manifest:
        raise OutletsError(f"subset of {source}: it has no {MANIFEST} (written by `outlets capture`)")
    files = [entry for entry in manifest["files"] if entry["file"].endswith(FEATURE_SUFFIX)]
    if not 0 < count <= len(files):
        raise OutletsError(f"subset of {count} from {source}: it has {len(files)} feature files")
    order = list(range(len(files)))
    random.Random(seed).shuffle(order)
    chosen = [files[i] for i in sorted(order[:count])]
    if os.path.isdir(destination) and os.listdir(destination):
        raise OutletsError(f"{destination} is not empty; remove it or choose another directory")
    os.makedirs(destination, exist_ok=True)
    for entry in chosen:
        os.symlink(os.path.abspath(os.path.join(source, entry["file"])), os.path.join(destination, entry["file"]))
    source_input = manifest.get("input")
    if source_input and not os.path.isabs(source_input):
        source_input = os.path.abspath(source_input if os.path.exists(source_input) else os.path.join(source, source_input))
    subset = {**manifest, "input": source_input, "files": chosen, "subset_of": os.path.abspath(source),
              "subset_seed": seed}
    write_manifest(destination, subset)
    return destination
