"""A request's predicted output length as a distribution: quantiles at fixed levels, and what schedulers read from it.

A point prediction of the output length is a noisy stand-in for a wide, heavy-tailed distribution
(the same prompt, sampled again, answers at very different lengths). A predictor that
gives quantiles of the length at a few levels lets a scheduler order by the expected remaining
length, by a tail-aware key, by the Gittins rank (the optimal order for mean response time when
each job's distribution is known), by the KV memory a job will hold, and reserve KV up to a chosen
quantile instead of mean x (1 + kv_margin).

Everything here is pure Python (no numpy, no torch): the SGLang plugin and the simulator share it.

Shape between and beyond the given levels. The quantile function of ``z = log(1 + L)`` is taken
piecewise linear in the normal score ``Phi^-1(p)`` through the given levels, and continued beyond
the outer levels along the outer segments. If ``1 + L`` is log-normal, ``z = mu + sigma *
Phi^-1(p)`` is linear in the normal score, so any two levels of it reproduce it exactly, at every
level and in the tails; with more levels the shape can bend (skew, heavier tails) between them. The
extrapolation keeps the outer segments' slopes, so the tails are log-normal-like, no heavier.

The distribution is used through ``NUM_ATOMS`` equally weighted atoms at ``p = (i + 0.5) /
NUM_ATOMS``, computed once per object. Every reading is conditioned on survival: after ``g``
generated tokens the remaining length is ``R = L - g`` given ``L > g`` (the atoms above ``g``),
floored at ``MIN_PREDICTED_REMAINING`` as the point keys are; if no atom exceeds ``g`` the request
is taken to be about to finish (``R = MIN_PREDICTED_REMAINING``).
"""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Dict, List, Optional, Sequence, Tuple

# Floor of the predicted remaining length: a request that has already generated more tokens
# than predicted is taken to be about to finish, not to have negative work left.
MIN_PREDICTED_REMAINING = 1.0

# Levels at which predictors give the quantiles of a request's output length (at least 0.1, 0.5,
# 0.9, which the evaluation's coverage reads; the quartiles shape the body).
DEFAULT_QUANTILE_LEVELS = (0.1, 0.25, 0.5, 0.75, 0.9)

# Equally weighted atoms a distribution is discretised into, at p = (i + 0.5) / NUM_ATOMS. 100
# puts atom boundaries on every 1% of probability, so the upper 10% (CVaR_0.9) and every level
# on a 0.05 grid are whole atoms; the outermost atoms sit at p = 0.005 and 0.995 (2.58 normal
# scores out). A key reads them in O(NUM_ATOMS), a few tens of microseconds in Python.
NUM_ATOMS = 100

_STANDARD_NORMAL = NormalDist()
# normal scores of the atoms' probabilities, ascending
_ATOM_SCORES = tuple(_STANDARD_NORMAL.inv_cdf((i + 0.5) / NUM_ATOMS) for i in range(NUM_ATOMS))


@functools.lru_cache(maxsize=64)
def _atom_weights(levels: Tuple[float, ...]) -> Tuple[Tuple[int, float], ...]:
    """Per atom ``(k, w)``: its log-length is ``z[k] + w * (z[k + 1] - z[k])`` of the levels' log-lengths.

    ``w`` lies outside [0, 1] beyond the outer levels (the outer segments extended). One level: ``(0, 0)``.
    """
    if len(levels) == 1:
        return tuple((0, 0.0) for _ in _ATOM_SCORES)
    scores = [_STANDARD_NORMAL.inv_cdf(level) for level in levels]
    weights = []
    for score in _ATOM_SCORES:
        k = min(max(bisect.bisect_right(scores, score) - 1, 0), len(scores) - 2)
        weights.append((k, (score - scores[k]) / (scores[k + 1] - scores[k])))
    return tuple(weights)


def _is_number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


@dataclass(frozen=True)
class LengthDistribution:
    """Quantiles of a request's TOTAL output length in tokens at ``levels``, optionally capped at ``cap``.

    A re-prediction made after ``t`` generated tokens that predicts remaining-length quantiles
    ``r_q`` is stored as total quantiles ``t + r_q`` (:meth:`from_remaining`). ``levels`` strictly
    increase inside (0, 1); ``quantiles`` (one per level) are positive and non-decreasing; ``cap``
    (e.g. max_new_tokens) bounds every atom. One level is a point mass at its quantile.
    """

    levels: Tuple[float, ...]
    quantiles: Tuple[float, ...]
    cap: Optional[float] = None
    # ascending atoms of the total length (computed once; not part of equality)
    atoms: Tuple[float, ...] = field(init=False, repr=False, compare=False)
    _conditioned: Dict[float, List[float]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        levels, quantiles = tuple(self.levels), tuple(self.quantiles)
        if not levels or not all(_is_number(level) and 0.0 < level < 1.0 for level in levels):
            raise ValueError(f"levels must be a non-empty sequence of numbers strictly between 0 and 1, got {levels!r}")
        if any(b <= a for a, b in zip(levels, levels[1:])):
            raise ValueError(f"levels must be strictly increasing, got {levels!r}")
        if len(quantiles) != len(levels):
            raise ValueError(f"quantiles must give one value per level ({len(levels)}), got {len(quantiles)}: "
                             f"{quantiles!r}")
        if not all(_is_number(value) and value > 0 for value in quantiles):
            raise ValueError(f"quantiles must be positive finite token counts, got {quantiles!r}")
        if any(b < a for a, b in zip(quantiles, quantiles[1:])):
            raise ValueError(f"quantiles must be non-decreasing with the levels, got {quantiles!r}")
        if self.cap is not None and not (_is_number(self.cap) and self.cap > 0):
            raise ValueError(f"cap must be None or a positive number of tokens, got {self.cap!r}")
        levels = tuple(float(level) for level in levels)
        quantiles = tuple(float(value) for value in quantiles)
        object.__setattr__(self, "levels", levels)
        object.__setattr__(self, "quantiles", quantiles)
        logs = [math.log1p(value) for value in quantiles]
        if len(logs) == 1:
            atoms = [quantiles[0]] * NUM_ATOMS
        else:
            atoms = [max(math.expm1(logs[k] + w * (logs[k + 1] - logs[k])), 0.0)
                     for k, w in _atom_weights(levels)]
        if self.cap is not None:
            atoms = [min(atom, self.cap) for atom in atoms]
        object.__setattr__(self, "atoms", tuple(atoms))
        object.__setattr__(self, "_conditioned", {})

    # --- construction -------------------------------------------------------------------------
    @classmethod
    def point(cls, total: float, cap: Optional[float] = None) -> "LengthDistribution":
        """A point mass: what a point prediction (or the prior) is, read as a distribution.

        A total at or below 0 (a predictor may say 0) is kept just above it: it survives no
        generated token, so every reading is the floor, as :func:`~specforge_outlets.scheduling.
        keys.predicted_remaining` gives for it.
        """
        return cls((0.5,), (max(float(total), 1e-9),), cap)

    @classmethod
    def from_remaining(cls, levels: Sequence[float], remaining: Sequence[float], num_generated: int,
                       cap: Optional[float] = None) -> "LengthDistribution":
        """A re-prediction after ``num_generated`` tokens of remaining-length quantiles, stored as totals."""
        return cls(tuple(levels), tuple(num_generated + value for value in remaining), cap)

    @classmethod
    def log_normal(cls, median: float, sigma: float, levels: Sequence[float] = DEFAULT_QUANTILE_LEVELS,
                   cap: Optional[float] = None) -> "LengthDistribution":
        """``median * exp(sigma * Phi^-1(p))`` at ``levels``: a point prediction with a log-normal error of ``sigma``."""
        if not (_is_number(sigma) and sigma >= 0):
            raise ValueError(f"sigma must be a non-negative number, got {sigma!r}")
        return cls(tuple(levels), tuple(median * math.exp(sigma * _STANDARD_NORMAL.inv_cdf(p)) for p in levels), cap)

    # --- the unconditioned quantile function --------------------------------------------------
    def quantile(self, p: float) -> float:
        """The total length's p-quantile of the interpolated (continuous) distribution, capped."""
        if not (_is_number(p) and 0.0 < p < 1.0):
            raise ValueError(f"p must be strictly between 0 and 1, got {p!r}")
        if len(self.levels) == 1:
            value = self.quantiles[0]
        else:
            scores = [_STANDARD_NORMAL.inv_cdf(level) for level in self.levels]
            score = _STANDARD_NORMAL.inv_cdf(p)
            k = min(max(bisect.bisect_right(scores, score) - 1, 0), len(scores) - 2)
            low, high = math.log1p(self.quantiles[k]), math.log1p(self.quantiles[k + 1])
            value = max(math.expm1(low + (score - scores[k]) / (scores[k + 1] - scores[k]) * (high - low)), 0.0)
        return value if self.cap is None else min(value, self.cap)

    # --- readings conditioned on survival -----------------------------------------------------
    def remaining_atoms(self, num_generated: float) -> List[float]:
        """Ascending equally weighted atoms of the remaining length given it exceeds ``num_generated``."""
        cached = self._conditioned.get(num_generated)
        if cached is not None:
            return cached
        atoms = self.atoms
        first = bisect.bisect_right(atoms, num_generated)
        if first == len(atoms):
            remaining = [MIN_PREDICTED_REMAINING]
        else:
            remaining = [max(atom - num_generated, MIN_PREDICTED_REMAINING) for atom in atoms[first:]]
        if len(self._conditioned) >= _MAX_CONDITIONED:
            self._conditioned.clear()
        self._conditioned[num_generated] = remaining
        return remaining

    def mean_remaining(self, num_generated: float = 0) -> float:
        """E[R] given survival."""
        return mean_of(self.remaining_atoms(num_generated))

    def quantile_remaining(self, p: float, num_generated: float = 0) -> float:
        """The p-quantile of R given survival (linear between the atoms' midpoints).

        Read off the surviving suffix of the atoms in place, O(log n): KV admission asks it for
        every running request at every new token count, where building the conditioned atoms
        (``remaining_atoms``) would cost O(n) each time.
        """
        if not (_is_number(p) and 0.0 <= p <= 1.0):
            raise ValueError(f"p must be between 0 and 1, got {p!r}")
        atoms = self.atoms
        first = bisect.bisect_right(atoms, num_generated)
        count = len(atoms) - first
        if count == 0:
            return MIN_PREDICTED_REMAINING
        position = min(max(p * count - 0.5, 0.0), count - 1.0)
        low = int(position)
        high = min(low + 1, count - 1)
        below, above = (max(atoms[first + index] - num_generated, MIN_PREDICTED_REMAINING) for index in (low, high))
        return below + (position - low) * (above - below)

    def cvar_remaining(self, alpha: float, num_generated: float = 0) -> float:
        """CVaR_alpha of R given survival: the mean of its upper 1 - alpha tail."""
        return cvar_of(self.remaining_atoms(num_generated), alpha)

    def gittins_rank(self, num_generated: float = 0) -> float:
        """The inverse Gittins index of R given survival (ascending = serve first): :func:`gittins_rank_of`."""
        return gittins_rank_of(self.remaining_atoms(num_generated))

    def kv_footprint(self, prompt_len: float, num_generated: float = 0) -> float:
        """E[(prompt_len + g + R / 2) * R]: KV token-steps the request will hold while it decodes.

        Where decode is bound by KV memory (long prompts fill it), a job's cost is the cache it
        holds over its decode time, not its output alone: it holds ``prompt_len + g`` tokens now and
        grows by one per step, so ``R`` more steps hold ``(prompt_len + g) R + R^2 / 2`` token-steps.
        """
        base = float(prompt_len) + float(num_generated)
        remaining = self.remaining_atoms(num_generated)
        return sum((base + r / 2.0) * r for r in remaining) / len(remaining)


# Survival points a distribution keeps its conditioned atoms for (keys read a few: 0 or 1 generated
# in a queue, the current count while it runs); beyond it the memo starts over.
_MAX_CONDITIONED = 8


# --- pure helpers on ascending, equally weighted atoms ------------------------------------------
def mean_of(values: Sequence[float]) -> float:
    """The mean of equally weighted atoms."""
    return math.fsum(values) / len(values)


def quantile_of(values: Sequence[float], p: float) -> float:
    """The p-quantile of ascending equally weighted atoms: atom i stands at p = (i + 0.5) / n, linear between."""
    if not (_is_number(p) and 0.0 <= p <= 1.0):
        raise ValueError(f"p must be between 0 and 1, got {p!r}")
    position = min(max(p * len(values) - 0.5, 0.0), len(values) - 1.0)
    low = int(position)
    if low == len(values) - 1:
        return values[low]
    return values[low] + (position - low) * (values[low + 1] - values[low])


def cvar_of(values: Sequence[float], alpha: float) -> float:
    """The mean of the upper 1 - alpha of ascending equally weighted atoms (a partial atom at the edge)."""
    if not (_is_number(alpha) and 0.0 <= alpha < 1.0):
        raise ValueError(f"alpha must be in [0, 1), got {alpha!r}")
    count = len(values)
    tail = (1.0 - alpha) * count  # atoms' worth of mass in the tail
    whole = min(int(math.floor(tail + 1e-9)), count)
    total = math.fsum(values[count - whole:]) if whole else 0.0
    part = tail - whole
    if part > 1e-9 and whole < count:
        total += part * values[count - whole - 1]
    return total / tail


def gittins_rank_of(values: Sequence[float]) -> float:
    """min over thresholds D of E[min(R, D)] / P(R <= D), for R uniform on ascending atoms.

    The Gittins index of a job whose remaining size R has a known distribution is the best
    completion rate it offers, sup_D P(R <= D) / E[min(R, D)]: serve for up to D more, finish
    with probability P(R <= D) at expected cost E[min(R, D)]. Serving the job of highest index (of
    lowest rank, the inverse) minimises mean response time in the M/G/1 queue when the
    distributions are known (Gittins; Scully, Harchol-Balter et al., SOAP, 2018). A deterministic
    job ranks at its length; a job likely to be short ranks near its short outcome even if its
    mean is long, so it goes before a job of the same mean that cannot finish early. The minimum
    lies at an atom (between atoms the numerator grows and the probability does not), so this
    scans them with running sums: O(n).
    """
    count = len(values)
    best = math.inf
    below = 0.0  # sum of the atoms up to and including the candidate
    for index, threshold in enumerate(values):
        below += threshold
        rank = (below + (count - index - 1) * threshold) / (index + 1)
        if rank < best:
            best = rank
    return best
