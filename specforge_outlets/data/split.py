"""Deterministic subsampling and 4:1 train/test split.

A seeded ``random.Random`` shuffle of row positions (Mersenne Twister; stable across runs,
platforms and Python versions, and free of ``hash()`` randomisation) picks the test rows; both
splits keep the input order.
"""

from __future__ import annotations

import random
from typing import List, Sequence, Tuple, TypeVar

T = TypeVar("T")


def split_rows(rows: Sequence[T], seed: int = 0, test_fraction: float = 0.2) -> Tuple[List[T], List[T]]:
    positions = list(range(len(rows)))
    random.Random(seed).shuffle(positions)
    test = set(positions[: int(len(rows) * test_fraction)])
    train = [row for index, row in enumerate(rows) if index not in test]
    return train, [row for index, row in enumerate(rows) if index in test]


def sample_rows(rows: Sequence[T], count: int, seed: int = 0) -> List[T]:
    """``count`` rows drawn with a seeded ``random.Random``, in input order."""
    chosen = set(random.Random(seed).sample(range(len(rows)), count))
    return [row for index, row in enumerate(rows) if index in chosen]
