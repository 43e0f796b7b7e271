"""The ordering key: predicted remaining length, shortest first, with linear aging.

One implementation, shared by the SGLang plugin and the simulator, so that what is simulated is
what is served. Everything here is a pure function of plain numbers: no torch, no SGLang.

Aging bound. The key of a request that arrived at ``a`` with predicted remaining length ``R`` is
``R + rate * a`` (``rate`` = aging tokens per second). Subtracting ``rate * now`` from every key
gives "remaining length minus credit for time waited"; the term is common to all requests, so the
order never changes while they wait and a heap can hold the keys. Because every key is at least
``MIN_PREDICTED_REMAINING + rate * a``, a request that arrives more than
``(R - MIN_PREDICTED_REMAINING) / rate`` seconds after it can never be ordered ahead of it
(:func:`aging_window_s`). A waiting request is therefore overtaken only by requests that arrive
within a bounded window, and waits at most as long as it would under FCFS had it arrived that
window later. With ``rate = 0`` the key is plain SJF and there is no bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

# Output length assumed for a request that has no prediction (none yet, or the predictor
# failed), so that it is neither starved nor favoured. 256 tokens is near the mean output
# length of chat traces (ShareGPT, the Azure conversation trace).
DEFAULT_PRIOR_OUTPUT_LEN = 256.0

# Tokens of predicted remaining length that one second of waiting is worth. At 10 tokens/s a
# request predicted to need 800 more tokens can be overtaken only by requests that arrive within
# 80 s after it.
DEFAULT_AGING_TOKENS_PER_S = 10.0

# Floor of the predicted remaining length: a request that has already generated more tokens
# than predicted is taken to be about to finish, not to have negative work left.
MIN_PREDICTED_REMAINING = 1.0


@dataclass(frozen=True)
class SchedulingConfig:
    """Settings of the ordering key and of least-predicted-work routing."""

    prior_output_len: float = DEFAULT_PRIOR_OUTPUT_LEN
    aging_tokens_per_s: float = DEFAULT_AGING_TOKENS_PER_S

    def __post_init__(self) -> None:
        if not (self.prior_output_len > 0 and math.isfinite(self.prior_output_len)):
            raise ValueError(f"prior_output_len must be a positive number, got {self.prior_output_len}")
        if not (self.aging_tokens_per_s >= 0 and math.isfinite(self.aging_tokens_per_s)):
            raise ValueError(f"aging_tokens_per_s must be >= 0, got {self.aging_tokens_per_s}")


def predicted_remaining(
    predicted_output_len: Optional[float], num_generated_tokens: int, prior_output_len: float
) -> float:
    """Predicted total output length minus tokens generated so far, floored; the prior if unknown."""
    total = prior_output_len if predicted_output_len is None else predicted_output_len
    return max(total - num_generated_tokens, MIN_PREDICTED_REMAINING)


def sjf_sort_key(
    predicted_output_len: Optional[float],
    num_generated_tokens: int,
    arrival_time: float,
    config: SchedulingConfig,
) -> Tuple[float, float]:
    """Ascending sort key: aged predicted remaining length, ties by arrival (earlier first)."""
    remaining = predicted_remaining(predicted_output_len, num_generated_tokens, config.prior_output_len)
    return remaining + config.aging_tokens_per_s * arrival_time, arrival_time


def aging_window_s(predicted_remaining_tokens: float, config: SchedulingConfig) -> float:
    """Seconds after a request's arrival beyond which no later arrival can be ordered ahead of it."""
    if config.aging_tokens_per_s == 0:
        return math.inf
    return max(predicted_remaining_tokens - MIN_PREDICTED_REMAINING, 0.0) / config.aging_tokens_per_s
