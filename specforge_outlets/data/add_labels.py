"""Post-pass: add ``remaining_length`` to feature files written by SpecForge's SGLang capture.

SpecForge's ``scripts/prepare_hidden_states.py`` writes ``rows_<a>-<b>/data_<i>.ckpt`` where ``i``
is the position of the conversation in the JSONL it read. The join therefore assumes that the
regenerated JSONL given here is that same file, in the same order (SpecForge run with
``--data-path`` on our ``outlets regenerate`` output, without rows dropped by its preprocessing).
Labels come from the file's own loss mask (SpecForge's tokenisation); the censoring flags from the
row. Two checks catch a broken join: the number of loss-mask spans must match the row's assistant
turns, and a file whose last span was cut by SpecForge's ``--max-length`` has that span censored.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Tuple

from specforge_outlets.data.features import FEATURE_SUFFIX, save_features
from specforge_outlets.data.generation import censoring_flags
from specforge_outlets.data.labels import remaining_length_labels, response_spans

_INDEX = re.compile(r"data_(\d+)\.ckpt$")


class JoinError(Exception):
    """A feature file that cannot be matched with its conversation."""


def specforge_feature_files(directory: str) -> List[Tuple[int, str]]:
    """``(row index, path)`` of SpecForge's ``data_<i>.ckpt`` files under ``directory``, sorted."""
    found = []
    for root, _, files in os.walk(directory):
        for name in files:
            match = _INDEX.search(name)
            if match and name.endswith(FEATURE_SUFFIX):
                found.append((int(match.group(1)), os.path.join(root, name)))
    return sorted(found)


def label_file(path: str, row: Dict[str, Any], max_length: int) -> Dict[str, int]:
    """Add labels to one file in place (atomically); returns counts for the summary."""
    import torch

    data = torch.load(path, map_location="cpu", weights_only=True)
    loss_mask = data["loss_mask"].reshape(-1)
    data["input_ids"] = data["input_ids"].reshape(-1)
    data["loss_mask"] = loss_mask
    spans = response_spans(loss_mask)
    flags = censoring_flags(row)
    if len(spans) > len(flags) or (len(spans) < len(flags) and len(loss_mask) < max_length):
        raise JoinError(
            f"{len(spans)} loss-mask spans but row {row.get('id')!r} has {len(flags)} assistant turns; "
            "the feature files were not captured from this JSONL in this order"
        )
    flags = flags[: len(spans)]
    if spans and len(loss_mask) >= max_length and spans[-1][1] == len(loss_mask):
        flags[-1] = True  # cut by SpecForge's --max-length: its true length is unknown
    data["remaining_length"] = remaining_length_labels(loss_mask, flags)
    save_features(path, data)
    return {"spans": len(spans), "censored_spans": sum(flags), "labelled_tokens": int((data["remaining_length"] > 0).sum())}
