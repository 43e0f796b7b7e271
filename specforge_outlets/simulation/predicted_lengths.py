"""Predicted output lengths for the requests of a trace.

``none``: no predictions (every request counts with the scheduling prior). ``oracle``: the true
length. ``noisy``: the true length times a log-normal error, ``exp(N(0, sigma))``, median-unbiased,
a stand-in for measured errors. ``file``: per-request predictions from a JSONL with ``id`` and
``predicted_output_len``, joined by id when every trace id is in the file; otherwise, when the
file also gives the true length (``true_output_len`` or ``output_length``), errors are sampled
from the file's empirical distribution of ``log(predicted / true)`` within the trace request's
true-length bucket (equal-count buckets), so that a trace with only lengths gets realistic errors.
``file-dynamic``: the same file's ``trajectory`` per request (joined by id, every trace id needed):
the scheduler's prediction follows the predictor's latest estimate as tokens are generated, as in
the plugin's EAGLE-3 mode; its value at the prediction point is ``predicted_output_len``. A file
of several predictors (``outlets eval``'s ``predictions.jsonl.gz``) is read with the one to use
named (``file_predictor``, ``--file-predictor``): its r̂₀ for ``file``, its trajectory for ``file-dynamic``.

Distributions: besides its point, a request can carry quantiles of its total output
length at the scheduling config's ``quantile_levels`` (:func:`predicted_quantiles`). ``noisy``: a
log-normal centred on the noisy point with the noise's sigma (what the point's error says about the
true length), so the distribution keys can be studied without a file. ``file``: the file's static
quantiles (``quantile_levels`` and ``quantiles``; in ``outlets eval``'s record ``quantiles``
maps each predictor to ``static`` and ``dynamic``). ``file-dynamic``: re-read after each token like
the point trajectory (``quantile_trajectory``, the record's ``dynamic``: entry k, the remaining-length
quantiles at output token k + 1). ``oracle`` and ``none`` carry no quantiles: a request is then a point
mass at its point prediction (or the prior).
"""

from __future__ import annotations

import functools
import math
import os
from enum import Enum
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from specforge_outlets.evaluation.predictions_file import TRUE_LENGTH_FIELDS, quoted_row, read_predictions
from specforge_outlets.errors import OutletsError
from specforge_outlets.scheduling import LengthDistribution
from specforge_outlets.serving.trace import Trace

# Default spread of the noisy predictor: sigma = 0.5 puts the 16th-84th percentile of the error
# at x0.61 to x1.65 of the true length.
DEFAULT_NOISE_SIGMA = 0.5
# Equal-count true-length buckets of the empirical error distribution.
NUM_ERROR_BUCKETS = 8
# Smallest total-length quantile read from a file: a response has at least one token (files round
# quantiles to whole tokens, so a low quantile of a short response can read 0).
MIN_QUANTILE_TOKENS = 1.0


class PredictorKind(Enum):
    """Where the simulated predictions come from."""

    NONE = "none"
    ORACLE = "oracle"
    NOISY = "noisy"
    FILE = "file"
    FILE_DYNAMIC = "file-dynamic"


def predict_lengths(
    kind: PredictorKind,
    trace: Trace,
    seed: int,
    noise_sigma: float = DEFAULT_NOISE_SIGMA,
    predictions_path: Optional[str] = None,
    file_predictor: Optional[str] = None,
) -> List[Optional[float]]:
    """One predicted output length per trace request (``None``: no prediction)."""
    if kind is PredictorKind.NONE:
        return [None] * len(trace)
    true = trace.output_lens.astype(np.float64)
    rng = np.random.default_rng(seed)
    if kind is PredictorKind.ORACLE:
        return true.tolist()
    if kind is PredictorKind.NOISY:
        if not (noise_sigma >= 0 and math.isfinite(noise_sigma)):
            raise OutletsError(f"--noise-sigma must be a non-negative number, got {noise_sigma}")
        return (true * np.exp(rng.normal(0.0, noise_sigma, size=len(trace)))).tolist()
    if predictions_path is None:
        raise OutletsError(f"--predictor {kind.value} needs --predictions FILE (JSONL with id, predicted_output_len)")
    return _from_file(predictions_path, file_predictor, trace, rng)


def predicted_trajectories(kind: PredictorKind, trace: Trace, predictions_path: Optional[str],
                           file_predictor: Optional[str] = None) -> Optional[List[np.ndarray]]:
    """Per trace request its dynamic estimates (``file-dynamic``); None for the static predictors."""
    if kind is not PredictorKind.FILE_DYNAMIC:
        return None
    if predictions_path is None:
        raise OutletsError("--predictor file-dynamic needs --predictions FILE with a trajectory per request")
    by_id = {row.id: row.trajectory for row in read_predictions(predictions_path, predictor=file_predictor)}
    for request_id in trace.ids:
        if by_id.get(request_id) is None:
            whose = f" of --file-predictor {file_predictor!r}" if file_predictor else ""
            raise OutletsError(
                f"--predictions {predictions_path}: trace id {request_id!r} has no trajectory{whose}; file-dynamic "
                "replays each request's own estimates, so every trace id needs one (join on the same ids)"
            )
    return [np.asarray(by_id[request_id], dtype=np.float64) for request_id in trace.ids]


def _from_file(path: str, file_predictor: Optional[str], trace: Trace, rng: np.random.Generator) -> List[Optional[float]]:
    rows = read_predictions(path, predictor=file_predictor)
    by_id = {row.id: row for row in rows}
    missing = [request_id for request_id in trace.ids if request_id not in by_id]
    if not missing:
        _check_lengths_agree(path, trace, by_id)
        return [by_id[request_id].predicted_output_len for request_id in trace.ids]
    if len(missing) < len(trace):  # some ids match: a join gone wrong, not a lengths-only trace
        raise OutletsError(
            f"--predictions {path}: {len(missing)} of {len(trace)} trace ids are missing (first: {missing[0]!r}); "
            "a file joined by id needs every trace id, or none (then errors are sampled by true length)")
    known = [row for row in rows if row.true_output_len is not None]
    if not known:
        raise OutletsError(
            f"--predictions {path}: {len(missing)} trace id(s) missing (first: {missing[0]!r}) and no "
            f"{' or '.join(TRUE_LENGTH_FIELDS)} field to sample errors from; join on the same ids or add true lengths"
        )
    true_lens = np.array([row.true_output_len for row in known])
    predicted_lens = np.array([row.predicted_output_len for row in known])
    return with_measured_errors(true_lens, predicted_lens, trace.output_lens, rng).tolist()


def _check_lengths_agree(path: str, trace: Trace, by_id) -> None:
    """A joined row that gives a true length must give the trace's: else the file is for other requests."""
    for request_id, output_len in zip(trace.ids, trace.output_lens):
        true = by_id[request_id].true_output_len
        if true is not None and true != output_len:
            raise OutletsError(
                f"--predictions {path}: id {request_id!r} has {TRUE_LENGTH_FIELDS[0]} {true:g} but the trace's "
                f"output_length is {int(output_len)}; the file was made for other requests (or another cap)")


def with_measured_errors(
    true_lens: np.ndarray, predicted_lens: np.ndarray, target_lens: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Predictions for requests of known lengths ``target_lens``, with errors a predictor made on others.

    Predicted = target * exp(e), ``e = log(predicted / true)`` of a measured pair drawn from the same
    equal-count true-length bucket: a predictor's error depends on the length (it over-predicts short
    requests and under-predicts long ones), so a lengths-only trace gets that shape, not one spread.
    """
    log_errors = np.log(np.asarray(predicted_lens, np.float64) / np.asarray(true_lens, np.float64))
    order = np.argsort(true_lens, kind="stable")
    buckets = np.array_split(order, min(NUM_ERROR_BUCKETS, len(order)))
    upper_edges = np.array([true_lens[bucket[-1]] for bucket in buckets[:-1]])
    target = np.asarray(target_lens, np.float64)
    bucket_of = np.searchsorted(upper_edges, target, side="left")
    errors = np.empty(len(target))
    for index, bucket in enumerate(buckets):
        members = bucket_of == index
        errors[members] = log_errors[rng.choice(bucket, size=int(members.sum()))]
    return target * np.exp(errors)


# --- predicted distributions (quantiles) ------------------------------------------------------------
Quantiles = Tuple[float, ...]


class FileQuantiles:
    """One predictor's quantiles in a predictions file, by request id: levels, static totals, trajectories."""

    def __init__(self, levels: Optional[Tuple[float, ...]], static: Dict[str, Quantiles],
                 trajectories: Dict[str, Tuple[Quantiles, ...]]) -> None:
        self.levels = levels  # None: the file has no quantiles
        self.static = static
        self.trajectories = trajectories


def read_file_quantiles(path: str, file_predictor: Optional[str] = None) -> FileQuantiles:
    """The quantiles of a predictions file (of ``file_predictor`` in a file of several), checked;
    read once per version of the file (a study reads it for every predictor kind).

    Read from :class:`PredictionRow`'s ``quantile_levels``, ``quantiles`` and ``quantile_trajectory``
    (plain rows' fields, or ``outlets eval``'s record, whose ``quantile_levels`` is per row and whose
    ``quantiles`` maps each predictor to ``static`` (totals) and ``dynamic`` (remaining at each output token)).
    """
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError:
        stamp = None
    return _read_file_quantiles(path, file_predictor, stamp)


@functools.lru_cache(maxsize=4)
def _read_file_quantiles(path: str, file_predictor: Optional[str], _stamp: Optional[int]) -> FileQuantiles:
    """:func:`read_file_quantiles`, uncached (``_stamp``: the file's modification time, part of the cache key)."""
    rows = [(row.id, row.quantile_levels, row.quantiles, row.quantile_trajectory)
            for row in read_predictions(path, predictor=file_predictor)]
    levels: Optional[Tuple[float, ...]] = None
    static: Dict[str, Quantiles] = {}
    trajectories: Dict[str, Tuple[Quantiles, ...]] = {}
    for request_id, row_levels, totals, trajectory in rows:
        if row_levels is None and totals is None and trajectory is None:
            continue
        where = f"--predictions {path}: id {request_id!r}"
        row_levels = _checked_levels(row_levels, where)
        if levels is not None and row_levels != levels:
            raise OutletsError(f"{where}: quantile_levels {list(row_levels)} differ from an earlier row's {list(levels)}; "
                               "one set of levels per file")
        levels = row_levels
        if totals is not None:
            static[request_id] = _checked_quantiles(totals, len(levels), f"{where}: quantiles", MIN_QUANTILE_TOKENS)
        if trajectory is not None:
            if not isinstance(trajectory, (list, tuple)) or not trajectory:
                raise OutletsError(f"{where}: quantile_trajectory must be a non-empty list of quantile lists")
            trajectories[request_id] = tuple(_checked_quantiles(entry, len(levels), f"{where}: quantile_trajectory", 0.0)
                                             for entry in trajectory)
    return FileQuantiles(levels, static, trajectories)


def _checked_levels(levels, where: str) -> Tuple[float, ...]:
    """The row's levels by the core's rule (:class:`LengthDistribution`'s); a refusal quotes them cut short."""
    if levels is None:
        raise OutletsError(f"{where}: quantiles without quantile_levels; give the levels they are at "
                           "(e.g. [0.1, 0.5, 0.9]) or drop the quantiles")
    try:
        return LengthDistribution(tuple(levels), tuple(range(1, len(levels) + 1))).levels
    except (TypeError, ValueError):
        raise OutletsError(f"{where}: quantile_levels must be numbers strictly increasing inside (0, 1), got "
                           f"{quoted_row(levels)}; fix the row or drop its quantiles") from None


def _checked_quantiles(values, count: int, where: str, floor: float) -> Quantiles:
    """Quantiles as floats, floored at ``floor``; refused naming the field unless ``count`` non-decreasing numbers."""
    ok = isinstance(values, (list, tuple)) and len(values) == count and all(
        not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in values)
    if not ok or any(b < a for a, b in zip(values, values[1:])):
        raise OutletsError(f"{where} must be {count} non-decreasing non-negative numbers (one per level), got "
                           f"{quoted_row(values)}; fix the row or drop its quantiles")
    return tuple(max(float(v), floor) for v in values)


def predicted_quantiles(
    kind: PredictorKind, trace: Trace, predictions: Sequence[Optional[float]], levels: Sequence[float],
    noise_sigma: float = DEFAULT_NOISE_SIGMA, predictions_path: Optional[str] = None,
    file_predictor: Optional[str] = None,
) -> Optional[List[Optional[Quantiles]]]:
    """Per trace request its total-length quantiles at ``levels``; None: this predictor gives none.

    ``noisy``: ``point * exp(sigma * Phi^-1(p))`` around each request's noisy point (``predictions``).
    ``file`` and ``file-dynamic``: the file's static quantiles, joined by id (every trace id needs
    them once the file has any; its levels must be ``levels``); None when the file has none or is
    not joined by id (errors sampled by true length carry no quantiles).
    """
    if kind is PredictorKind.NOISY:
        return [None if point is None else LengthDistribution.log_normal(point, noise_sigma, tuple(levels)).quantiles
                for point in predictions]
    if kind not in (PredictorKind.FILE, PredictorKind.FILE_DYNAMIC) or predictions_path is None:
        return None
    found = read_file_quantiles(predictions_path, file_predictor)
    if found.levels is None or not found.static:
        return None
    if not any(request_id in found.static for request_id in trace.ids):
        return None  # a lengths-only trace: errors sampled by true length, no quantiles
    _check_levels(predictions_path, found.levels, levels)
    missing = [request_id for request_id in trace.ids if request_id not in found.static]
    if missing:
        raise OutletsError(f"--predictions {predictions_path}: trace id {missing[0]!r} has no quantiles "
                           f"({len(missing)} of {len(trace)} missing); every trace id needs them, or none")
    return [found.static[request_id] for request_id in trace.ids]


def predicted_quantile_trajectories(
    kind: PredictorKind, trace: Trace, levels: Sequence[float], predictions_path: Optional[str],
    file_predictor: Optional[str] = None,
) -> Optional[List[Tuple[Quantiles, ...]]]:
    """Per trace request its remaining-length quantiles at each output token (``file-dynamic``); None: static."""
    if kind is not PredictorKind.FILE_DYNAMIC or predictions_path is None:
        return None
    found = read_file_quantiles(predictions_path, file_predictor)
    if found.levels is None or not found.trajectories:
        return None
    _check_levels(predictions_path, found.levels, levels)
    missing = [request_id for request_id in trace.ids if request_id not in found.trajectories]
    if missing:
        raise OutletsError(f"--predictions {predictions_path}: trace id {missing[0]!r} has no quantile_trajectory "
                           f"({len(missing)} of {len(trace)} missing); file-dynamic replays each request's own "
                           "quantiles, so every trace id needs them")
    return [found.trajectories[request_id] for request_id in trace.ids]


def _check_levels(path: str, found: Tuple[float, ...], levels: Sequence[float]) -> None:
    if tuple(found) != tuple(float(level) for level in levels):
        raise OutletsError(f"--predictions {path}: quantile_levels {list(found)} differ from the scheduling "
                           f"config's quantile_levels {list(levels)}; simulate with the file's levels")


# --- the ladder's reference predictors -------------------------------------------------------------
# Rungs that bracket the learned predictors: what prediction is worth with no per-request information
# (a constant, the same values shuffled across requests) and with the most a predictor of the prompt
# alone could know (the per-prompt ceiling). A study places each learned predictor between them.


def constant_predictions(value: float, count: int) -> List[float]:
    """The same prediction for every request (e.g. the train split's median): a length scale, no ranking."""
    if not (value > 0 and math.isfinite(value)):
        raise OutletsError(f"a constant prediction must be a positive number of tokens, got {value}")
    return [float(value)] * count


def shuffled_predictions(predictions: Sequence[float], seed: int) -> List[float]:
    """A predictor's values permuted across the requests: the same distribution of predictions, so the same
    charges in aggregate, but no information about which request is long."""
    values = np.asarray(predictions, np.float64)
    return values[np.random.default_rng(seed).permutation(len(values))].tolist()


def mean_rescaled_predictions(predictions: Sequence[float], true_lengths: Sequence[float]) -> List[float]:
    """A predictor's values times mean(true) / mean(predicted): its ranking, at the workload's mean length.

    A predictor fitted in log space regresses long requests toward the median, so its mean is far
    below the mean length; the scale is what a ratio of finished lengths to their predictions converges
    to on a steady workload, so this bounds what an admission calibrating that way could gain.
    """
    values, true = np.asarray(predictions, np.float64), np.asarray(true_lengths, np.float64)
    assert values.shape == true.shape and values.mean() > 0, (values.shape, true.shape)
    return (values * (true.mean() / values.mean())).tolist()


def per_prompt_ceiling(samples: Sequence[Sequence[float]]) -> List[List[float]]:
    """Each sample of a prompt predicted by the mean length of the prompt's other samples.

    The target samples its answers, so a prompt has a distribution of lengths and a request is one
    draw: the mean of the other draws is what a predictor that knows the prompt perfectly, and nothing
    else, would say (up to the noise of a mean of few samples). ``samples``: per prompt, its lengths
    (at least two); the result has the same shape.
    """
    ceiling = []
    for lengths in samples:
        values = np.asarray(lengths, np.float64)
        if values.size < 2:
            raise OutletsError(f"the per-prompt ceiling needs two or more samples of each prompt, got {values.size}")
        ceiling.append(((values.sum() - values) / (values.size - 1)).tolist())
    return ceiling
