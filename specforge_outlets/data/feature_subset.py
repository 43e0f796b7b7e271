"""Subsets of a captured feature directory: seeded ones for learning curves, a validation split by prompt group.

The method's scaling claim is that the length head improves with more training responses; to
measure it, the same pipeline trains on 250, 500, 1,000 and all responses. Stopping and model
selection need responses that no draft trains on, held out by prompt group so that a twin of a
validation prompt is not in training either. A subset is a directory of symbolic links to the
chosen feature files with a manifest that lists only them, so training and evaluation read it like
any capture output and nothing is copied.
"""

from __future__ import annotations

import os
import random
from typing import Any, Dict, List, Tuple

from specforge_outlets.data.manifest import MANIFEST, read_manifest, write_manifest
from specforge_outlets.data.features import FEATURE_SUFFIX
from specforge_outlets.errors import OutletsError


def _files(source: str) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    manifest = read_manifest(source)
    if not manifest:
        raise OutletsError(f"subset of {source}: it has no {MANIFEST} (written by `outlets capture`)")
    return manifest, [entry for entry in manifest["files"] if entry["file"].endswith(FEATURE_SUFFIX)]


def _link(source: str, manifest: Dict[str, Any], chosen: List[Dict[str, Any]], destination: str,
          **provenance: Any) -> str:
    if os.path.isdir(destination) and os.listdir(destination):
        raise OutletsError(f"{destination} is not empty; remove it or choose another directory")
    os.makedirs(destination, exist_ok=True)
    for entry in chosen:
        os.symlink(os.path.abspath(os.path.join(source, entry["file"])), os.path.join(destination, entry["file"]))
    source_input = manifest.get("input")
    if source_input and not os.path.isabs(source_input):
        source_input = os.path.abspath(source_input if os.path.exists(source_input) else os.path.join(source, source_input))
    write_manifest(destination, {**manifest, "input": source_input, "files": chosen,
                                 "subset_of": os.path.abspath(source), **provenance})
    return destination


def subset_features(source: str, destination: str, count: int, seed: int = 0) -> str:
    """Link ``count`` of the feature files of ``source`` (drawn with ``seed``) into ``destination``.

    The draw is nested: with the same seed, the files of a smaller subset are among those of a
    larger one, so the points of a learning curve differ only by the data added.
    """
    manifest, files = _files(source)
    if not 0 < count <= len(files):
        raise OutletsError(f"subset of {count} from {source}: it has {len(files)} feature files")
    order = list(range(len(files)))
    random.Random(seed).shuffle(order)
    return _link(source, manifest, [files[i] for i in sorted(order[:count])], destination, subset_seed=seed)


def split_validation(source: str, train_destination: str, validation_destination: str, share: float,
                     seed: int = 0) -> Tuple[str, str]:
    """Hold out a seeded ``share`` of the prompt groups of ``source`` as validation; link both parts.

    The groups come from the prompts of the regenerated JSONL the manifest names
    (``data/prompt_groups.py``), so no group straddles the two parts.
    """
    from specforge_outlets.data.jsonl import BadLine, iter_jsonl
    from specforge_outlets.data.prepare_command import prompt_text
    from specforge_outlets.data.prompt_groups import prompt_groups

    assert 0 < share < 1, share
    manifest, files = _files(source)
    rows_path = manifest.get("input")
    if not rows_path or not os.path.isfile(rows_path):
        raise OutletsError(f"{source}/{MANIFEST}: its 'input' ({rows_path}) is not a readable file; a validation "
                           "split by prompt group needs the prompts: capture from the regenerated JSONL")
    texts = {str(row["id"]): prompt_text(row) for _, row in iter_jsonl(rows_path) if not isinstance(row, BadLine)}
    missing = [entry["id"] for entry in files if str(entry["id"]) not in texts]
    if missing:
        raise OutletsError(f"{source}: feature file of id {missing[0]} has no row in {rows_path}")
    groups = prompt_groups([texts[str(entry["id"])] for entry in files])
    names = sorted(set(groups))
    random.Random(seed).shuffle(names)
    held = set(names[: max(1, round(share * len(names)))])
    train = [entry for entry, group in zip(files, groups) if group not in held]
    validation = [entry for entry, group in zip(files, groups) if group in held]
    return (_link(source, manifest, train, train_destination, validation_share=share, split_seed=seed, part="train"),
            _link(source, manifest, validation, validation_destination, validation_share=share, split_seed=seed,
                  part="validation"))
