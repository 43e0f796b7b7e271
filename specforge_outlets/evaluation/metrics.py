"""Length-prediction metrics over requests (one request = one labelled assistant response span).

For a response of ``L`` tokens, ``r_hat_t`` is the prediction of the remaining length made after
``t`` response tokens have been generated (``t = 0 .. L-1``); the true remaining length is
``L - t``, so ``r_hat_0`` predicts the whole length (the *static* prediction).

- static MAE  = mean over requests of ``|L - r_hat_0|``
- dynamic MAE = mean over requests of ``(1/L) sum_t |(L - t) - r_hat_t|``
- MAE by decoding progress: each position falls in decile ``floor(10 t / L)`` of ``t / L``; a
  request's error in a decile is the mean over its positions there, and the decile's MAE is the
  mean over the requests that have positions in it (so long responses do not dominate).
- MAE by true-length bucket: short ``L < short_max``, long ``L > long_min``, medium otherwise.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np

SHORT_MAX = 200  # short: L < 200 tokens
LONG_MIN = 500  # long: L > 500 tokens
NUM_PROGRESS_BINS = 10
BUCKETS = ("short", "medium", "long")


def static_mae(true_lengths: Sequence[float], predicted: Sequence[float]) -> float:
    true, pred = np.asarray(true_lengths, np.float64), np.asarray(predicted, np.float64)
    assert true.shape == pred.shape and true.size > 0, (true.shape, pred.shape)
    return float(np.abs(true - pred).mean())


def dynamic_abs_errors(length: int, predicted_remaining: Sequence[float]) -> np.ndarray:
    """``|(L - t) - r_hat_t|`` for ``t = 0 .. L-1``."""
    pred = np.asarray(predicted_remaining, np.float64)
    assert pred.shape == (length,), f"need {length} dynamic predictions, got {pred.shape}"
    return np.abs((length - np.arange(length)) - pred)


def dynamic_mae(true_lengths: Sequence[int], dynamic: Sequence[Sequence[float]]) -> float:
    assert len(true_lengths) == len(dynamic) and len(true_lengths) > 0
    return float(np.mean([dynamic_abs_errors(int(L), d).mean() for L, d in zip(true_lengths, dynamic)]))


def mae_by_progress(
    true_lengths: Sequence[int], dynamic: Sequence[Sequence[float]], bins: int = NUM_PROGRESS_BINS
) -> List[Optional[float]]:
    """One MAE per progress bin of ``t / L`` (``None`` where no request has a position)."""
    per_bin: List[List[float]] = [[] for _ in range(bins)]
    for L, pred in zip(true_lengths, dynamic):
        L = int(L)
        errors = dynamic_abs_errors(L, pred)
        which = (bins * np.arange(L)) // L
        for index in np.unique(which):
            per_bin[int(index)].append(float(errors[which == index].mean()))
    return [float(np.mean(values)) if values else None for values in per_bin]


def length_bucket(length: int, short_max: int = SHORT_MAX, long_min: int = LONG_MIN) -> str:
    if length < short_max:
        return "short"
    if length > long_min:
        return "long"
    return "medium"


def mae_by_length_bucket(
    true_lengths: Sequence[int],
    static: Sequence[float],
    dynamic: Optional[Sequence[Sequence[float]]] = None,
    short_max: int = SHORT_MAX,
    long_min: int = LONG_MIN,
) -> Dict[str, Dict[str, Optional[float]]]:
    """``{bucket: {n_requests, static_mae, dynamic_mae}}`` for short / medium / long."""
    result: Dict[str, Dict[str, Optional[float]]] = {}
    buckets = [length_bucket(int(L), short_max, long_min) for L in true_lengths]
    for bucket in BUCKETS:
        members = [i for i, b in enumerate(buckets) if b == bucket]
        entry: Dict[str, Optional[float]] = {"n_requests": len(members), "static_mae": None, "dynamic_mae": None}
        if members:
            entry["static_mae"] = static_mae([true_lengths[i] for i in members], [static[i] for i in members])
            if dynamic is not None:
                entry["dynamic_mae"] = dynamic_mae([true_lengths[i] for i in members], [dynamic[i] for i in members])
        result[bucket] = entry
    return result


def countdown(static_prediction: float, length: int) -> np.ndarray:
    """Dynamic predictions from a static one, the way a scheduler uses it: ``max(r_hat_0 - t, 1)``."""
    return np.maximum(float(static_prediction) - np.arange(length), 1.0)
