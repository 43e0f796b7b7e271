"""Calibration of predicted length quantiles: coverage, the PIT histogram, a split-conformal correction.

A quantile head is only useful to a scheduler if its q_tau really is exceeded 1 - tau of the time:
KV admission reserving q_0.9 retracts about one request in ten only if q_0.9 covers nine in ten.
Scored where the scheduler reads it: before the first token (static) and at 25/50/75% of decoding.

Censored responses (cut at the token limit) only bound their length from below: a censored
request whose bound already exceeds a quantile is known to be above it; one whose bound is below
is undetermined. Coverage is therefore a point among the determined requests with the interval
the undetermined ones leave (all above / all below).

What a scheduler meets is the *served* length: the server stops a request at its max_new_tokens
and the scheduler reads a quantile clipped there (``scheduling/kv_admission.py``), so a response
cut at the label set's cap ran exactly to it, and is covered by a quantile at or past that bound.
Served coverage counts every request that way, and is the upper end of the interval above (the
undetermined requests are exactly the censored ones at or under the quantile); it is the
scheduler's figure while the serving cap is the label set's generation cap (a larger cap lets
those requests run longer).

The split-conformal correction (Romano et al., conformalized quantile regression, one-sided per
level) shifts each quantile in z = log(1 + r) by the ceil((n + 1) tau)-th smallest calibration
score z_true - z_tau, the score of a censored request taken at its bound: it calibrates the served
length, where every score is known. Estimated on responses neither the draft nor the probes
trained on (``--calibration-features``), separately for the static prediction and for the dynamic
ones (pooled over ``DECODING_FRACTIONS``), and applied to the test split.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from specforge_outlets.evaluation.predictor_api import Prediction
from specforge_outlets.evaluation.requests import Request

# Shares of a response already decoded at which the dynamic quantiles are scored.
DECODING_FRACTIONS = (0.25, 0.5, 0.75)


@dataclass(frozen=True)
class Observations:
    """Quantile predictions at one point of decoding and what the requests really did there."""

    remaining: np.ndarray  # [N] true remaining tokens (the lower bound where censored)
    censored: np.ndarray  # [N] bool
    quantiles: np.ndarray  # [N, K] predicted remaining-token quantiles


def observations(requests: Sequence[Request], predictions: Sequence[Prediction],
                 fraction: Optional[float] = None) -> Observations:
    """Static (``fraction`` None: row 0, the whole length) or at ``fraction`` of each response decoded.

    Row k of ``dynamic_quantiles`` is read after k tokens, so the truth there is L - k; at a
    fraction f, k = floor(f L) (responses shorter than 1 / f tokens have no such point and are skipped).
    """
    remaining, censored, quantiles = [], [], []
    for request, prediction in zip(requests, predictions):
        assert prediction.dynamic_quantiles is not None, "a prediction without quantiles"
        k = 0 if fraction is None else math.floor(fraction * request.length)
        if fraction is not None and k < 1:
            continue
        remaining.append(request.length - k)
        censored.append(request.censored)
        quantiles.append(prediction.dynamic_quantiles[k])
    return Observations(np.asarray(remaining, np.float64), np.asarray(censored, bool),
                        np.asarray(quantiles, np.float64).reshape(len(remaining), -1))


def pooled(parts: Sequence[Observations]) -> Observations:
    return Observations(*(np.concatenate([getattr(p, name) for p in parts])
                          for name in ("remaining", "censored", "quantiles")))


def coverage(obs: Observations, levels: Sequence[float]) -> List[Dict[str, Any]]:
    """Per level: the share of requests at or below the quantile, among the determined ones, and its bounds."""
    rows = []
    for k, level in enumerate(levels):
        q = obs.quantiles[:, k]
        below = ~obs.censored & (obs.remaining <= q)  # covered
        above = (obs.remaining > q)  # not covered: finished above it, or censored with the bound above it
        undetermined = len(q) - int(below.sum()) - int(above.sum())
        determined = len(q) - undetermined
        rows.append({"level": level, "coverage": float(below.sum() / determined) if determined else float("nan"),
                     "lower": float(below.sum() / len(q)) if len(q) else float("nan"),
                     # the served coverage too: a censored request ran to its bound, so q at or past it covers it
                     "upper": float((below.sum() + undetermined) / len(q)) if len(q) else float("nan"),
                     "n": len(q), "undetermined": undetermined})
    return rows


def pit_histogram(obs: Observations, levels: Sequence[float]) -> Dict[str, List[float]]:
    """Shares of requests between consecutive quantiles (K + 1 bins) and the shares a calibrated head gives.

    The PIT of a request is where its length falls in its own predicted distribution; with
    quantiles at K levels it is known to a bin. A censored request counts only when its bound
    is above every quantile (then it is in the last bin); the others are left out.
    """
    finished = ~obs.censored
    in_last = obs.censored & (obs.remaining > obs.quantiles[:, -1])
    bins = (obs.remaining[:, None] > obs.quantiles).sum(1)  # 0 .. K
    counted = finished | in_last
    counts = np.bincount(bins[counted], minlength=len(levels) + 1).astype(np.float64)
    edges = [0.0, *levels, 1.0]
    return {"observed": (counts / max(counts.sum(), 1)).tolist(),
            "expected": [hi - lo for lo, hi in zip(edges, edges[1:])], "n": int(counts.sum())}


def conformal_shifts(obs: Observations, levels: Sequence[float]) -> List[float]:
    """Per level, the shift in z = log(1 + r) that makes the calibration's served coverage at least tau (a
    rank past the last score, at fewer than 1 / (1 - tau) - 1 requests, takes the largest)."""
    z_true = np.log1p(obs.remaining)  # a censored request's served length is its bound
    shifts = []
    for k, level in enumerate(levels):
        scores = np.sort(z_true - np.log1p(obs.quantiles[:, k]))
        rank = min(math.ceil((len(scores) + 1) * level), len(scores))  # 1-based
        shifts.append(float(scores[rank - 1]))
    return shifts


def shifted(prediction: Prediction, static_shifts: Sequence[float], dynamic_shifts: Sequence[float]) -> Prediction:
    """The prediction with its quantiles corrected (row 0 by the static shifts, the rest by the dynamic ones)."""
    z = np.log1p(prediction.dynamic_quantiles)
    z[:1] += np.asarray(static_shifts)[None, :]
    z[1:] += np.asarray(dynamic_shifts)[None, :]
    z = np.maximum.accumulate(z, axis=1)  # shifts may differ by level: keep the quantiles non-decreasing
    return Prediction(prediction.static, prediction.dynamic, np.expm1(z).clip(min=0.0))


def calibration_points(requests: Sequence[Request], predictions: Sequence[Prediction]) -> Dict[str, Observations]:
    """The scored points: ``static`` and each decoding fraction (``at_25`` ...)."""
    return {"static": observations(requests, predictions),
            **{f"at_{round(100 * f)}": observations(requests, predictions, f) for f in DECODING_FRACTIONS}}


def summary(requests: Sequence[Request], predictions: Sequence[Prediction], levels: Sequence[float]) -> Dict[str, Any]:
    """Coverage and PIT at every scored point."""
    return {point: {"coverage": coverage(obs, levels), "pit": pit_histogram(obs, levels)}
            for point, obs in calibration_points(requests, predictions).items()}


def calibrate(calibration_requests: Sequence[Request], calibration_predictions: Sequence[Prediction],
              levels: Sequence[float]) -> Dict[str, Any]:
    """Static and dynamic conformal shifts from the calibration split's predictions."""
    points = calibration_points(calibration_requests, calibration_predictions)
    dynamic = pooled([obs for name, obs in points.items() if name != "static"])
    return {"static": conformal_shifts(points["static"], levels), "dynamic": conformal_shifts(dynamic, levels)}
