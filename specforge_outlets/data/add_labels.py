"""Post-pass: add ``remaining_length`` to feature files written by SpecForge's SGLang capture.

SpecForge 0.2.0's ``scripts/prepare_hidden_states.py`` writes ``rows_<a>-<b>/data_<i>.ckpt`` (or
``.ckpt.gz`` with ``--compress``), but ``i`` is not the conversation's line in the JSONL it read:
its ``build_eagle3_dataset`` shuffles the rows (``Dataset.shuffle(seed=42)``; with
``--num-samples N``, its first N), each data-parallel rank takes every R-th of them and drops its
last partial batch, and numbers its files from its own offset. Found by running its script
(``tests/test_specforge_capture.py``); ``specforge_file_rows`` replays it. The regenerated JSONL
given here must be the file given to SpecForge's ``--data-path`` (our ``outlets regenerate``
output, without rows dropped by its preprocessing). Labels come from the file's own loss mask
(SpecForge's tokenisation); the censoring flags from the row. Two checks catch a broken join: the
number of loss-mask spans must match the row's assistant turns, and a file whose last span was cut
by SpecForge's ``--max-length`` has that span censored.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Tuple

from specforge_outlets.data.features import read_feature_file, save_features
from specforge_outlets.data.generation import censoring_flags
from specforge_outlets.data.labels import remaining_length_labels, response_spans

_INDEX = re.compile(r"^data_(\d+)\.ckpt(?:\.gz)?$")
SPECFORGE_SHUFFLE_SEED = 42  # build_eagle3_dataset's default, which prepare_hidden_states.py keeps


class JoinError(Exception):
    """A feature file that cannot be matched with its conversation."""


def specforge_feature_files(directory: str) -> List[Tuple[int, str]]:
    """``(file index, path)`` of SpecForge's ``data_<i>.ckpt`` / ``.ckpt.gz`` files under ``directory``, sorted."""
    found = []
    for root, _, files in os.walk(directory):
        for name in files:
            match = _INDEX.search(name)
            if match:
                found.append((int(match.group(1)), os.path.join(root, name)))
    return sorted(found)


def specforge_row_order(count: int) -> List[int]:
    """The JSONL rows in the order SpecForge's ``build_eagle3_dataset`` gives its first ``count`` rows
    (``Dataset.shuffle(seed=42)``, replayed with datasets itself)."""
    from datasets import Dataset

    return list(Dataset.from_dict({"row": list(range(count))}).shuffle(seed=SPECFORGE_SHUFFLE_SEED)["row"])


def specforge_file_rows(rows_read: int, ranks: int = 1, batch_size: int = 32) -> Dict[int, List[int]]:
    """File index -> the JSONL row(s) SpecForge's script writes under that name, replaying it.

    ``rows_read``: the rows it read (its ``--num-samples``, else the JSONL's); ``ranks``: its
    data-parallel ranks (torchrun processes / ``--tp-size``); ``batch_size``: its ``--batch-size``.
    Each rank takes every ``ranks``-th item of the shuffled rows (torch's DistributedSampler, padded
    by repeating the first items), drops its last partial batch (its DataLoader's ``drop_last``) and
    numbers its files from ``rank * (rows_read // ranks)`` plus the remainder spread over the first
    ranks. Rows in a dropped batch get no file; a name two ranks both write lists two rows.
    """
    from torch.utils.data import DistributedSampler

    order = specforge_row_order(rows_read)
    per_rank, remainder = divmod(rows_read, ranks)
    files: Dict[int, List[int]] = {}
    for rank in range(ranks):
        start = rank * (per_rank + 1) if rank < remainder else rank * per_rank + remainder
        items = list(DistributedSampler(range(rows_read), num_replicas=ranks, rank=rank, shuffle=False))
        for offset, item in enumerate(items[: len(items) // batch_size * batch_size]):
            files.setdefault(start + offset, []).append(order[item])
    return files


def label_file(path: str, row: Dict[str, Any], max_length: int) -> Dict[str, int]:
    """Add labels to one file in place (atomically); returns counts for the summary."""
    data = read_feature_file(path)
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
