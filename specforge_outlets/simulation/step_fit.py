"""The simulator's step model fitted to a real SGLang server's own log (``outlets fit-step-time``).

Why: the datasheet model describes a GPU and a model; whoever checks the simulator against their own
server (this project: its KV-bound CPU servers) needs the step times that server takes. SGLang logs
a ``Decode batch`` line every ``decode_log_interval`` decode steps with the batch, the KV tokens held
and the decode tokens per second since the previous line, and one ``Prefill batch`` line per prefill
forward with its new tokens. Between two decode lines the server ran ``interval`` decode steps and
the prefill batches logged in between, so the seconds it took give one linear equation:

    seconds = (interval + prefills) x fixed_s + interval x batch x per_request_s
              + interval x kv x per_kv_token_s + new tokens x per_prefill_token_s

(batch and kv: the mean of the two lines'; seconds = decode tokens / throughput, with decode tokens
= interval x batch). Non-negative least squares over every interval gives
:meth:`StepTimeModel.fitted`'s coefficients. The first decode line of a log is dropped: its window
starts when the server did, idle time included. Logs of busy servers fit; an interval that spans
idle time (requests stopped, then came back) does not, and is dropped when it took more than
``IDLE_FACTOR`` times what the fit gives it (one refit).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Dict, Iterable, List

import numpy as np

from specforge_outlets.errors import OutletsError
from specforge_outlets.simulation.cluster import FITTED_STEP_TIME_KEYS

# SGLang's --decode-log-interval default: decode steps between two "Decode batch" lines
DEFAULT_DECODE_LOG_INTERVAL = 40
# an interval that took this many times its fitted time is taken to hold idle time, and refitted without
IDLE_FACTOR = 3.0
DECODE_LINE = re.compile(r"Decode batch[.,] #running-req: (\d+), #token: (\d+),.*?gen throughput \(token/s\): ([\d.]+)")
PREFILL_LINE = re.compile(r"Prefill batch[.,] #new-seq: \d+, #new-token: (\d+),")


@dataclass(frozen=True)
class Interval:
    """The work between two decode lines and the seconds it took."""

    decode_steps: int
    prefill_batches: int
    mean_batch: float
    mean_kv_tokens: float
    prefill_tokens: int
    seconds: float

    def features(self) -> List[float]:
        """Its multipliers of (fixed_s, per_request_s, per_kv_token_s, per_prefill_token_s)."""
        return [self.decode_steps + self.prefill_batches, self.decode_steps * self.mean_batch,
                self.decode_steps * self.mean_kv_tokens, float(self.prefill_tokens)]


def parse_intervals(lines: Iterable[str], decode_log_interval: int = DEFAULT_DECODE_LOG_INTERVAL) -> List[Interval]:
    """Every interval between consecutive decode lines of one server log (the first line only opens one)."""
    intervals, previous = [], None
    prefill_batches = prefill_tokens = 0
    for line in lines:
        prefill = PREFILL_LINE.search(line)
        if prefill:
            prefill_batches, prefill_tokens = prefill_batches + 1, prefill_tokens + int(prefill.group(1))
            continue
        decode = DECODE_LINE.search(line)
        if not decode:
            continue
        batch, kv, throughput = int(decode.group(1)), int(decode.group(2)), float(decode.group(3))
        if previous is not None and throughput > 0:
            mean_batch = (previous[0] + batch) / 2
            intervals.append(Interval(decode_log_interval, prefill_batches, mean_batch, (previous[1] + kv) / 2,
                                      prefill_tokens, decode_log_interval * mean_batch / throughput))
        previous, prefill_batches, prefill_tokens = (batch, kv), 0, 0
    return intervals


@dataclass(frozen=True)
class StepTimeFit:
    """Fitted coefficients and how well they explain the intervals they came from."""

    coefficients: Dict[str, float]  # StepTimeModel.fitted's keyword arguments
    intervals: int  # used in the fit
    dropped: int  # taken to hold idle time
    r_squared: float  # of the intervals' seconds
    median_abs_error: float  # relative, per interval

    def predict(self, intervals: List[Interval]) -> np.ndarray:
        """Seconds the fit gives each interval (held-out logs: how well it carries over)."""
        weights = np.array([self.coefficients[key] for key in FITTED_STEP_TIME_KEYS])
        return np.array([interval.features() for interval in intervals]) @ weights


def nnls(features: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Non-negative least squares, exactly, by trying every set of free coefficients (four here: 16 sets)."""
    best, best_error = np.zeros(features.shape[1]), float((target ** 2).sum())
    for free in itertools.product((False, True), repeat=features.shape[1]):
        columns = np.flatnonzero(free)
        if not len(columns):
            continue
        solution, *_ = np.linalg.lstsq(features[:, columns], target, rcond=None)
        if (solution < 0).any():
            continue
        weights = np.zeros(features.shape[1])
        weights[columns] = solution
        error = float(((features @ weights - target) ** 2).sum())
        if error < best_error:
            best, best_error = weights, error
    return best


def fit_step_time(intervals: List[Interval]) -> StepTimeFit:
    """Non-negative least squares of the intervals' seconds on their work, refitted once without idle ones."""
    if len(intervals) < len(FITTED_STEP_TIME_KEYS) * 3:
        raise OutletsError(f"{len(intervals)} decode intervals in the log(s): need at least "
                           f"{len(FITTED_STEP_TIME_KEYS) * 3} to fit {len(FITTED_STEP_TIME_KEYS)} coefficients; "
                           "log a longer busy stretch (SGLang logs one line per --decode-log-interval decode steps)")
    features = np.array([interval.features() for interval in intervals])
    seconds = np.array([interval.seconds for interval in intervals])
    # scale the columns so that NNLS is not steered by their units (steps against KV-token-steps)
    scale = np.maximum(features.max(axis=0), 1e-12)
    weights = nnls(features / scale, seconds)
    kept = seconds <= IDLE_FACTOR * np.maximum((features / scale) @ weights, 1e-12)
    weights = nnls(features[kept] / scale, seconds[kept])
    fitted = (features[kept] / scale) @ weights
    residual = seconds[kept] - fitted
    total = float(((seconds[kept] - seconds[kept].mean()) ** 2).sum())
    return StepTimeFit(
        coefficients={key: float(value) for key, value in zip(FITTED_STEP_TIME_KEYS, weights / scale)},
        intervals=int(kept.sum()), dropped=int((~kept).sum()),
        r_squared=1 - float((residual ** 2).sum()) / total if total > 0 else float("nan"),
        median_abs_error=float(np.median(np.abs(residual) / seconds[kept])))
