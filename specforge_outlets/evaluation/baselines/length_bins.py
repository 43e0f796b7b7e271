"""Length as a distribution over log-spaced bins: the output of the EGTP and ESTP heads.

Both papers predict a distribution over length bins and read the prediction as its expectation;
they do not fix the edges for a 2,048-token cap, so the bins here split ``z = log(1 + L)`` evenly
between ``z(1)`` and ``z(cap)``: ``NUM_BINS`` bins, each the same ratio of lengths wide, so a
200-token answer is resolved as finely, relatively, as a 20-token one. A length past the cap
falls in the last bin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

NUM_BINS = 20  # EGTP's bin count
# Width of the Gaussian soft label, in bins: the neighbouring bins share a true length's mass, so
# a prediction one bin off is not scored as wrong as one ten bins off (EGTP's soft labels).
SOFT_LABEL_BINS = 1.0


@dataclass(frozen=True)
class LengthBins:
    """``NUM_BINS`` bins of ``z = log(1 + L)`` from 1 token to ``cap``."""

    cap: int
    count: int = NUM_BINS

    def __post_init__(self) -> None:
        assert self.cap > 1 and self.count >= 2, self

    @property
    def width(self) -> float:
        return (math.log1p(self.cap) - math.log1p(1)) / self.count

    def centres(self) -> torch.Tensor:
        """[K] the bins' centres in z."""
        return math.log1p(1) + self.width * (torch.arange(self.count, dtype=torch.float32) + 0.5)

    def index(self, z: torch.Tensor) -> torch.Tensor:
        """[N] z -> [N] bin index (clamped to the first and last bin)."""
        return ((z.float() - math.log1p(1)) / self.width).floor().long().clamp(0, self.count - 1)

    def soft_labels(self, z: torch.Tensor) -> torch.Tensor:
        """[N] z -> [N, K] Gaussian weights over the centres, each row summing to 1."""
        distance = (z.float()[:, None] - self.centres()[None, :]) / (SOFT_LABEL_BINS * self.width)
        return torch.softmax(-0.5 * distance**2, dim=-1)

    def expected_z(self, logits: torch.Tensor) -> torch.Tensor:
        """[N, K] logits -> [N] the distribution's mean z."""
        return torch.softmax(logits.float(), dim=-1) @ self.centres()

    def expected_tokens(self, logits: torch.Tensor) -> torch.Tensor:
        """[N, K] logits -> [N] the expected length in tokens (the centres' lengths, weighted)."""
        return torch.softmax(logits.float(), dim=-1) @ torch.expm1(self.centres())
