"""Deterministic subsampling and 4:1 train/test split, by prompt group.

A seeded ``random.Random`` shuffle of row positions (Mersenne Twister; stable across runs,
platforms and Python versions, and free of ``hash()`` randomisation) picks the test rows; both
splits keep the input order. With ``groups`` (``data/prompt_groups.py``), every row then follows
the split of its group's first row, so no group straddles the split and a row outside any
multi-row group keeps the split it had without grouping (a label set made before grouping is
re-split by moving only the rows of straddling groups).
"""

from __future__ import annotations

import random
from typing import List, Optional, Sequence, Tuple, TypeVar

T = TypeVar("T")


def split_rows(rows: Sequence[T], seed: int = 0, test_fraction: float = 0.2,
               groups: Optional[Sequence[int]] = None) -> Tuple[List[T], List[T]]:
    """``groups[i]`` is row ``i``'s group, named by the position of its first row."""
    positions = list(range(len(rows)))
    random.Random(seed).shuffle(positions)
    test = set(positions[: int(len(rows) * test_fraction)])
    if groups is not None:
        assert len(groups) == len(rows) and all(g <= i for i, g in enumerate(groups)), "a group is named by its first row"
        test = {i for i, group in enumerate(groups) if group in test}
    train = [row for index, row in enumerate(rows) if index not in test]
    return train, [row for index, row in enumerate(rows) if index in test]


def sample_rows(rows: Sequence[T], count: int, seed: int = 0) -> List[T]:
    """``count`` rows drawn with a seeded ``random.Random``, in input order."""
    chosen = set(random.Random(seed).sample(range(len(rows)), count))
    return [row for index, row in enumerate(rows) if index in chosen]
