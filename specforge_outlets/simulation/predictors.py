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
"""

from __future__ import annotations

import math
from enum import Enum
from typing import List, Optional

import numpy as np

from specforge_outlets.evaluation.predictions_file import TRUE_LENGTH_FIELDS, read_predictions
from specforge_outlets.errors import OutletsError
from specforge_outlets.serving.trace import Trace

# Default spread of the noisy predictor: sigma = 0.5 puts the 16th-84th percentile of the error
# at x0.61 to x1.65 of the true length.
DEFAULT_NOISE_SIGMA = 0.5
# Equal-count true-length buckets of the empirical error distribution.
NUM_ERROR_BUCKETS = 8


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
