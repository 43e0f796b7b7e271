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
- 95% bootstrap interval of a mean over requests: requests resampled with replacement, a fixed
  seed, so a report is reproducible and the interval says how much the test set alone moves it.
- Spearman rank correlation of ``r_hat_0`` with ``L``: a scheduler only needs the order right.
- calibration: predicted against true quantiles, and the share at or above a long threshold; the
  slope of log r_hat_0 on log L (1: the predictions spread as the lengths do, 0: a constant), and
  the share of long requests (L >= 800) predicted in the long bucket (r_hat_0 > 500).
- sampling-noise floor: each sample's length predicted by the median of the same prompt's other
  samples, the error no prompt-level predictor can beat.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

SHORT_MAX = 200  # short: L < 200 tokens
LONG_MIN = 500  # long: L > 500 tokens
NUM_PROGRESS_BINS = 10
BUCKETS = ("short", "medium", "long")
BOOTSTRAP_RESAMPLES = 1000
CONFIDENCE = 0.95
SHARE_THRESHOLD = 800  # tokens: "long" for the calibration share
QUANTILE_LEVELS = tuple(round(0.05 * k, 2) for k in range(1, 20))  # 5%, 10%, ..., 95%


def static_abs_errors(true_lengths: Sequence[float], predicted: Sequence[float]) -> np.ndarray:
    """``|L - r_hat_0|`` per request (what the bootstrap resamples)."""
    true, pred = np.asarray(true_lengths, np.float64), np.asarray(predicted, np.float64)
    assert true.shape == pred.shape and true.size > 0, (true.shape, pred.shape)
    return np.abs(true - pred)


def static_mae(true_lengths: Sequence[float], predicted: Sequence[float]) -> float:
    return float(static_abs_errors(true_lengths, predicted).mean())


def dynamic_abs_errors(length: int, predicted_remaining: Sequence[float]) -> np.ndarray:
    """``|(L - t) - r_hat_t|`` for ``t = 0 .. L-1``."""
    pred = np.asarray(predicted_remaining, np.float64)
    assert pred.shape == (length,), f"need {length} dynamic predictions, got {pred.shape}"
    return np.abs((length - np.arange(length)) - pred)


def dynamic_request_errors(true_lengths: Sequence[int], dynamic: Sequence[Sequence[float]]) -> np.ndarray:
    """``(1/L) sum_t |(L - t) - r_hat_t|`` per request (what the bootstrap resamples)."""
    assert len(true_lengths) == len(dynamic) and len(true_lengths) > 0
    return np.array([dynamic_abs_errors(int(L), d).mean() for L, d in zip(true_lengths, dynamic)])


def dynamic_mae(true_lengths: Sequence[int], dynamic: Sequence[Sequence[float]]) -> float:
    return float(dynamic_request_errors(true_lengths, dynamic).mean())


def bootstrap_interval(
    per_request: Sequence[float], *, seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES, confidence: float = CONFIDENCE
) -> Tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``per_request`` (requests resampled, seeded)."""
    values = np.asarray(per_request, np.float64)
    assert values.ndim == 1 and values.size > 0, values.shape
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(resamples, values.size))].mean(1)
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


def ranks(values: Sequence[float]) -> np.ndarray:
    """1-based ranks, ties sharing their average rank (as Spearman's coefficient needs)."""
    unique, inverse, counts = np.unique(np.asarray(values, np.float64), return_inverse=True, return_counts=True)
    return (np.cumsum(counts) - (counts - 1) / 2)[inverse.reshape(-1)]


def spearman(x: Sequence[float], y: Sequence[float]) -> Optional[float]:
    """Spearman rank correlation; ``None`` when either side is constant (no order to compare)."""
    rx, ry = ranks(x), ranks(y)
    assert rx.shape == ry.shape and rx.size > 0, (rx.shape, ry.shape)
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


def calibration(
    true_lengths: Sequence[float], predicted: Sequence[float], *,
    levels: Sequence[float] = QUANTILE_LEVELS, threshold: float = SHARE_THRESHOLD,
) -> Dict[str, object]:
    """Predicted against true quantiles of the length, and the share at or above ``threshold``.

    A predictor can have a fair MAE and still never predict a long response; the quantiles and the
    long share show whether its predictions have the spread of the true lengths.
    """
    true, pred = np.asarray(true_lengths, np.float64), np.asarray(predicted, np.float64)
    assert true.shape == pred.shape and true.size > 0, (true.shape, pred.shape)
    return {
        "levels": [float(level) for level in levels],
        "true_quantiles": np.quantile(true, levels).tolist(),
        "predicted_quantiles": np.quantile(pred, levels).tolist(),
        "threshold": threshold,
        "true_share_at_or_above": float((true >= threshold).mean()),
        "predicted_share_at_or_above": float((pred >= threshold).mean()),
    }


def log_slope(true_lengths: Sequence[float], predicted: Sequence[float]) -> float:
    """Least-squares slope of log r_hat_0 on log L: how much of the lengths' spread the predictions follow.

    A predictor that regresses every request to the median has a fair MAE and a slope near 0, and then
    a scheduler cannot tell a long request from a short one.
    """
    true, pred = np.log(np.asarray(true_lengths, np.float64)), np.log(np.asarray(predicted, np.float64))
    assert true.shape == pred.shape and true.size > 1, (true.shape, pred.shape)
    centred = true - true.mean()
    return float(centred @ (pred - pred.mean()) / (centred @ centred))


def long_predicted_long(true_lengths: Sequence[float], predicted: Sequence[float], *,
                        threshold: float = SHARE_THRESHOLD, predicted_min: float = LONG_MIN) -> Optional[float]:
    """Share of the requests at or above ``threshold`` tokens whose r_hat_0 lies in the long bucket (None: none).

    Censored responses belong here (cut at the cap, they are at least that long).
    """
    true, pred = np.asarray(true_lengths, np.float64), np.asarray(predicted, np.float64)
    assert true.shape == pred.shape, (true.shape, pred.shape)
    long = true >= threshold
    return float((pred[long] > predicted_min).mean()) if long.any() else None


def long_auc(true_lengths: Sequence[float], predicted: Sequence[float], *,
             threshold: float = SHARE_THRESHOLD) -> Optional[float]:
    """The chance that a request of ``threshold``+ tokens gets a larger r_hat_0 than a shorter one (ties: half;
    None without both kinds): how well rules "long if r_hat_0 > x" separate them, averaged over every x, whatever
    the predictor's scale. A censored response counts as long: its cap (the label set's 2,048) is past the
    threshold."""
    true, pred = np.asarray(true_lengths, np.float64), np.asarray(predicted, np.float64)
    assert true.shape == pred.shape, (true.shape, pred.shape)
    long = true >= threshold
    if long.all() or not long.any():
        return None
    n_long, n_short = int(long.sum()), int((~long).sum())  # Mann-Whitney U of the long ones over n_long x n_short
    return float((ranks(pred)[long].sum() - n_long * (n_long + 1) / 2) / (n_long * n_short))


def noise_floor_errors(samples: Mapping[str, Sequence[float]]) -> Dict[str, float]:
    """Per prompt: the mean over its samples of ``|L_s - median(other samples)|``.

    Prompts with fewer than two samples have nothing to predict from and are left out. Averaging
    within a prompt first makes every prompt weigh the same, like every request in the MAE.
    """
    out = {}
    for key, lengths in samples.items():
        lengths = np.asarray(lengths, np.float64)
        if lengths.size < 2:
            continue
        others = [np.delete(lengths, i) for i in range(lengths.size)]
        out[key] = float(np.mean([abs(L - np.median(rest)) for L, rest in zip(lengths, others)]))
    return out


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
