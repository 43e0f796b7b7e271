"""Scores that keep the censored responses: the long tail a length predictor exists to recognise.

A response cut by the token limit ``c`` has no true length, only a lower bound (``L >= c``).
Dropping those responses scores every predictor on a test set without its longest requests (15%
of SmolLM2's ShareGPT answers); the scores here keep them:

- Harrell's concordance index (Harrell et al. 1982, the standard for right-censored data): over
  the pairs whose order is known (the shorter one finished: a finished response is shorter than a
  longer finished one, and than any censored one whose bound it does not exceed), the share that
  the predictor orders the same way, ties in the prediction counting one half.
- MAE as a lower bound: a censored response's error is ``max(0, c - r_hat_0)``, the least it can
  be whatever its true length; dynamically, ``max(0, (c - t) - r_hat_t)`` at each ``t < c``.
- how many censored responses the predictor places above its own 90th percentile: "says long".
- Spearman with censored lengths at the bound (ties at the cap).

Every request is a row of ``CensoredRequests``; the paired bootstrap of ``paired_differences``
resamples requests once for all predictors, so an interval of a difference from the reference
predictor is about the predictors, not about which requests the test set happened to draw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence

import numpy as np

from specforge_outlets.evaluation import metrics

# The predictor's own quantile above which a prediction "says long".
SAYS_LONG_QUANTILE = 0.9


@dataclass(frozen=True)
class CensoredRequests:
    """Per request: the true length (or, when censored, its lower bound) and whether it was censored."""

    lengths: np.ndarray  # [N] tokens
    censored: np.ndarray  # [N] bool

    @classmethod
    def of(cls, lengths: Sequence[float], censored: Sequence[bool]) -> "CensoredRequests":
        lengths_, censored_ = np.asarray(lengths, np.float64), np.asarray(censored, bool)
        assert lengths_.shape == censored_.shape and lengths_.ndim == 1 and lengths_.size > 0
        return cls(lengths_, censored_)

    def comparable(self) -> np.ndarray:
        """``[N, N]``: True where request i is known to be shorter than request j."""
        length, censored = self.lengths, self.censored
        finished = ~censored[:, None]
        shorter_finished = (length[:, None] < length[None, :]) & ~censored[None, :]
        below_bound = (length[:, None] <= length[None, :]) & censored[None, :]
        return finished & (shorter_finished | below_bound)


def concordance(requests: CensoredRequests, predicted: Sequence[float]) -> np.ndarray:
    """``[N, N]``: 1 where the prediction orders a comparable pair right, 0.5 on a tie, else 0."""
    pred = np.asarray(predicted, np.float64)
    assert pred.shape == requests.lengths.shape
    agree = (pred[:, None] < pred[None, :]) + 0.5 * (pred[:, None] == pred[None, :])
    return requests.comparable() * agree


def c_index(requests: CensoredRequests, predicted: Sequence[float]) -> Optional[float]:
    """None when no pair has a known order (every length tied, or every request censored)."""
    comparable = requests.comparable()
    if not comparable.any():
        return None
    return float(concordance(requests, predicted).sum() / comparable.sum())


def static_error_bounds(requests: CensoredRequests, predicted: Sequence[float]) -> np.ndarray:
    """``|L - r_hat_0|`` for finished requests, ``max(0, c - r_hat_0)`` for censored ones."""
    pred = np.asarray(predicted, np.float64)
    return np.where(requests.censored, np.maximum(requests.lengths - pred, 0.0), np.abs(requests.lengths - pred))


def dynamic_error_bounds(requests: CensoredRequests, dynamic: Sequence[Sequence[float]]) -> np.ndarray:
    """Per request, the mean over ``t < L`` (or ``t < c``) of the error, bounded below as above."""
    out = np.empty(requests.lengths.size)
    for index, (length, censored, pred) in enumerate(zip(requests.lengths, requests.censored, dynamic)):
        pred = np.asarray(pred, np.float64)
        assert pred.shape == (int(length),), f"need {int(length)} dynamic predictions, got {pred.shape}"
        remaining = length - np.arange(int(length))
        out[index] = (np.maximum(remaining - pred, 0.0) if censored else np.abs(remaining - pred)).mean()
    return out


def censored_said_long(requests: CensoredRequests, predicted: Sequence[float]) -> Optional[float]:
    """Share of the censored requests predicted above the predictor's own 90th percentile."""
    if not requests.censored.any():
        return None
    pred = np.asarray(predicted, np.float64)
    return float((pred[requests.censored] > np.quantile(pred, SAYS_LONG_QUANTILE)).mean())


def paired_differences(
    requests: CensoredRequests, static: Mapping[str, Sequence[float]], dynamic_errors: Mapping[str, Sequence[float]],
    reference: str, *, seed: int = 0, resamples: int = metrics.BOOTSTRAP_RESAMPLES,
    confidence: float = metrics.CONFIDENCE,
) -> Dict[str, Dict[str, Dict[str, float]]]:
    """``{predictor: {metric: {difference, low, high}}}``: each predictor minus ``reference``.

    Metrics: Spearman and static MAE of the finished requests, C-index and static and dynamic MAE
    (lower bounds) of all of them. Requests are resampled with replacement once per resample for
    every predictor (a paired percentile bootstrap); the C-index of a resample weighs each pair by
    the product of its requests' counts, so it needs no N x N matrix per resample.
    """
    assert reference in static, f"reference predictor {reference} has no predictions"
    rng = np.random.default_rng(seed)
    n = requests.lengths.size
    # Row 0 is the test set itself (every request once): the point estimate; the others are resamples.
    counts = np.stack([np.ones(n, np.int64)] + [np.bincount(rng.integers(0, n, n), minlength=n)
                                                for _ in range(resamples)]).astype(np.float64)
    finished = ~requests.censored
    comparable = requests.comparable().astype(np.float64)
    pairs = np.einsum("ri,ij,rj->r", counts, comparable, counts)
    pairs[pairs == 0] = np.nan  # a resample without an ordered pair has no C-index
    finished_counts = counts[:, finished].sum(1)
    finished_counts[finished_counts == 0] = np.nan  # a resample of censored requests only has no exact MAE

    def per_resample(name: str) -> Dict[str, np.ndarray]:
        pred = np.asarray(static[name], np.float64)
        static_bounds = static_error_bounds(requests, pred)
        exact = np.abs(requests.lengths - pred)
        return {
            "c_index": np.einsum("ri,ij,rj->r", counts, concordance(requests, pred), counts) / pairs,
            "static_mae_censored": counts @ static_bounds / counts.sum(1),
            "dynamic_mae_censored": counts @ np.asarray(dynamic_errors[name], np.float64) / counts.sum(1),
            "static_mae": counts[:, finished] @ exact[finished] / finished_counts,
            "spearman": np.array([_weighted_spearman(pred[finished], requests.lengths[finished], w[finished])
                                  for w in counts]),
        }

    base = per_resample(reference)
    tail = 100 * (1 - confidence) / 2
    out: Dict[str, Dict[str, Optional[Dict[str, float]]]] = {}
    for name in static:
        if name == reference:
            continue
        out[name] = {}
        for metric, values in per_resample(name).items():
            difference = values - base[metric]
            resampled = difference[1:][np.isfinite(difference[1:])]
            if not np.isfinite(difference[0]) or resampled.size == 0:  # a constant predictor has no Spearman
                out[name][metric] = None
                continue
            low, high = np.percentile(resampled, [tail, 100 - tail])
            out[name][metric] = {"difference": float(difference[0]), "low": float(low), "high": float(high)}
    return out


def _weighted_spearman(x: np.ndarray, y: np.ndarray, weights: np.ndarray) -> float:
    """Spearman of a resample given as counts: the rows repeated ``weights`` times, ties averaged."""
    keep = weights > 0
    if keep.sum() < 2:  # fewer than two distinct requests have no rank order
        return np.nan
    x_, y_ = np.repeat(x[keep], weights[keep].astype(int)), np.repeat(y[keep], weights[keep].astype(int))
    value = metrics.spearman(x_, y_)
    return np.nan if value is None else value


def censored_scores(requests: CensoredRequests, static: Sequence[float], dynamic_errors: Sequence[float],
                    *, seed: int = 0) -> Dict[str, object]:
    """One predictor's censoring-aware row: C-index, the MAE bounds with intervals, Spearman at the cap."""
    static_bounds = static_error_bounds(requests, static)
    dynamic_bounds = np.asarray(dynamic_errors, np.float64)
    return {
        "n_requests": int(requests.lengths.size),
        "n_censored": int(requests.censored.sum()),
        "c_index": c_index(requests, static),
        "static_mae_lower_bound": float(static_bounds.mean()),
        "static_mae_lower_bound_ci": metrics.bootstrap_interval(static_bounds, seed=seed),
        "dynamic_mae_lower_bound": float(dynamic_bounds.mean()),
        "dynamic_mae_lower_bound_ci": metrics.bootstrap_interval(dynamic_bounds, seed=seed),
        "spearman_censored_at_cap": metrics.spearman(static, requests.lengths),
        "censored_said_long": censored_said_long(requests, static),
    }


def interval_text(entry: Optional[Mapping[str, float]], digits: int = 3) -> str:
    """``+d [low, high]``, bold where the interval excludes zero; "–" where there is no difference."""
    if entry is None:
        return "–"
    text = f"{entry['difference']:+.{digits}f} [{entry['low']:+.{digits}f}, {entry['high']:+.{digits}f}]"
    return f"**{text}**" if entry["low"] > 0 or entry["high"] < 0 else text
