"""The ordering keys: shortest predicted remaining first with linear aging (SJF), and the tail-safe key.

One implementation, shared by the SGLang plugin and the simulator, so that what is simulated is
what is served. Everything here is a pure function of plain numbers: no torch, no SGLang.

Why two keys. SJF cuts mean latency, but under overload or with noisy predictions it can make the
P99 of a length class several times worse than FCFS (the longest of the "short" requests wait behind
an endless stream of shorter ones; docs/results.md). The tail-safe key keeps FCFS order inside two
predicted-length classes and lets the short class overtake a predicted-long request only within a
window that grows with that request's own wait, so that its delay stays within a bounded factor of
its FCFS delay and neither class's tail moves far from FCFS; how much of SJF's gain it keeps is set
by one fraction (docs/serving.md).

Aging bound (SJF). The key of a request that arrived at ``a`` with predicted remaining length ``R`` is
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

import itertools
import math
import operator
import struct
from array import array
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

# Output length assumed for a request that has no prediction (none yet, or the predictor
# failed), so that it is neither starved nor favoured. 256 tokens is near the mean output
# length of chat traces (ShareGPT, the Azure conversation trace).
DEFAULT_PRIOR_OUTPUT_LEN = 256.0

# Tokens of predicted remaining length that one second of waiting is worth. At 10 tokens/s a
# request predicted to need 800 more tokens can be overtaken only by requests that arrive within
# 80 s after it.
DEFAULT_AGING_TOKENS_PER_S = 10.0

# Predicted remaining length from which a request belongs to the long class of the tail-safe key;
# the short/long threshold of the method's latency breakdown (docs/simulation.md).
DEFAULT_LONG_OUTPUT_LEN = 800.0

# Hold-back of the tail-safe key: a predicted-long request that has waited W seconds can be
# overtaken by short-class requests that arrived less than this fraction of W after it. 0 is FCFS,
# 1 or more is strict priority of the short class. 0.05 is the largest hold-back of
# benchmarks/tail_safe_sweep.py whose short- and long-request P99 stayed within 5% of FCFS in every
# run (0.1 reached 1.06); no request starves below 20x overload.
DEFAULT_LONG_HOLDBACK = 0.05

# Retractions per request before KV pressure retracts others first: a request retracted this often
# is kept while any other running request can go, so it cannot be retracted over and over.
DEFAULT_MAX_RETRACTIONS = 2

# Floor of the predicted remaining length: a request that has already generated more tokens
# than predicted is taken to be about to finish, not to have negative work left.
MIN_PREDICTED_REMAINING = 1.0


@dataclass(frozen=True)
class SchedulingConfig:
    """Settings of the ordering key and of least-predicted-work routing."""

    prior_output_len: float = DEFAULT_PRIOR_OUTPUT_LEN
    aging_tokens_per_s: float = DEFAULT_AGING_TOKENS_PER_S  # SJF
    long_output_len: float = DEFAULT_LONG_OUTPUT_LEN  # tail-safe
    long_holdback: float = DEFAULT_LONG_HOLDBACK  # tail-safe
    max_retractions: int = DEFAULT_MAX_RETRACTIONS  # retraction order

    def __post_init__(self) -> None:
        if not (self.prior_output_len > 0 and math.isfinite(self.prior_output_len)):
            raise ValueError(f"prior_output_len must be a positive number, got {self.prior_output_len}")
        if not (self.aging_tokens_per_s >= 0 and math.isfinite(self.aging_tokens_per_s)):
            raise ValueError(f"aging_tokens_per_s must be >= 0, got {self.aging_tokens_per_s}")
        if not (self.long_output_len > 0 and math.isfinite(self.long_output_len)):
            raise ValueError(f"long_output_len must be a positive number, got {self.long_output_len}")
        if not (self.long_holdback >= 0 and math.isfinite(self.long_holdback)):
            raise ValueError(f"long_holdback must be >= 0, got {self.long_holdback}")
        if isinstance(self.max_retractions, bool) or not isinstance(self.max_retractions, int) or self.max_retractions < 1:
            raise ValueError(f"max_retractions must be a positive integer, got {self.max_retractions!r}")


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


def retraction_order_key(
    predicted_output_len: Optional[float], num_generated_tokens: int, arrival_time: float, retractions: int,
    config: SchedulingConfig,
) -> Tuple[bool, float, float]:
    """Ascending = most worth keeping under KV pressure; retract from the end.

    Last (retracted first): requests retracted fewer than ``max_retractions`` times, the longest
    predicted remaining first (it frees the most cache for the longest), of two equal ones the later
    arrival (it has waited and generated less). Requests at the limit are retracted only when no
    other is left, which bounds retractions per request while anything else is running.
    """
    remaining = predicted_remaining(predicted_output_len, num_generated_tokens, config.prior_output_len)
    return retractions < config.max_retractions, remaining, arrival_time


def is_predicted_long(
    predicted_output_len: Optional[float], num_generated_tokens: int, config: SchedulingConfig
) -> bool:
    """Whether a request belongs to the long class of the tail-safe key (the prior if unknown)."""
    remaining = predicted_remaining(predicted_output_len, num_generated_tokens, config.prior_output_len)
    return remaining >= config.long_output_len


def tail_safe_sort_key(
    predicted_long: bool, arrival_time: float, head_of_line_age_s: float, config: SchedulingConfig
) -> Tuple[float, float]:
    """Ascending sort key: arrival time, predicted-long requests pushed back by a share of the queue's age.

    ``head_of_line_age_s`` is the wait so far of the oldest request in the queue, the same for every
    request when a queue is ordered. Whenever a predicted-long request is compared with a later
    short-class request it is the oldest of the two class heads, so the push-back is a fraction of
    its own wait: see :func:`holdback_window_s`.
    """
    holdback = config.long_holdback * head_of_line_age_s if predicted_long else 0.0
    return arrival_time + holdback, arrival_time


# Bits of a tail-safe merge key below its time: 2 for the tie class, then the rank in the long class.
_RANK_BITS = 32
_TIME_SHIFT = _RANK_BITS + 2


def _time_ordinals(times: Sequence[float]) -> List[int]:
    """Integers in the order of the floats, equal for equal floats: their IEEE-754 bit patterns, signed."""
    ordinals = array("q", array("d", times).tobytes())  # non-negative floats: ascending as their floats
    if not ordinals or min(ordinals) >= 0:
        return list(ordinals)
    return list(map(_signed_ordinal, ordinals))


def _signed_ordinal(bits: int) -> int:
    """An IEEE-754 bit pattern read as an int64, made to order as its float.

    A negative float (sign bit set) reads as -2**63 + magnitude; -0.0 becomes 0, as +0.0."""
    return bits if bits >= 0 else -(bits + 2 ** 63)


def short_merge_key(arrival_time: float) -> int:
    """:func:`tail_safe_long_merge_keys`' counterpart for a short-class request: its arrival time, tie class 1."""
    # one float: struct, not _time_ordinals' two arrays (computed once per request entering the queue)
    ordinal = _signed_ordinal(int.from_bytes(struct.pack("<d", arrival_time), "little", signed=True))
    return (ordinal << _TIME_SHIFT) | (1 << _RANK_BITS)


def tail_safe_long_merge_keys(long_arrivals: Sequence[float], now: float, config: SchedulingConfig) -> List[int]:
    """Integer keys of predicted-long requests (given in arrival order) that merge them with the short class.

    :class:`~specforge_outlets.scheduling.request_queue.TailSafeRequestQueue` admits the long head
    (arrived at ``a``, waited ``now - a``: it is the older head whenever this matters) before a
    short head arrived at ``s`` iff ``tail_safe_sort_key`` says ``(T, a) < (s, s)``, with threshold
    ``T = a + f * (now - a)``. A long request is admitted only after the long ones that arrived
    before it, so it goes ahead of a short one iff some ``(T, a)`` up to it in arrival order does:
    its effective ``(T, a)`` is the running maximum. Sorting every request by one integer then
    gives the queue's order: the time (``T``, or a short request's ``s``) in the high bits; at an
    equal time a short request (class 1) goes after a held-back long one (class 0) and before one
    not held back (``T == a``, class 2); long requests keep their arrival rank in the low bits, and
    equal short keys keep list order in a stable sort. One integer instead of a tuple, because the
    waiting list is re-sorted by these every scheduling round and integers compare fastest.
    """
    holdback = config.long_holdback
    assert len(long_arrivals) < 2 ** _RANK_BITS
    # the same arithmetic as tail_safe_sort_key: arrival + long_holdback * age
    thresholds = [arrival + holdback * (now - arrival) for arrival in long_arrivals]
    if all(map(operator.le, thresholds, itertools.islice(thresholds, 1, None))):
        # the common case (f < 1: T grows with a): each (T, a) is its own running maximum
        arrivals = long_arrivals
    else:
        running = list(itertools.accumulate(zip(thresholds, long_arrivals), max))
        thresholds, arrivals = [threshold for threshold, _ in running], [arrival for _, arrival in running]
    return [(time << _TIME_SHIFT) | ((0 if threshold > arrival else 2) << _RANK_BITS) | rank
            for rank, (time, threshold, arrival) in enumerate(zip(_time_ordinals(thresholds), thresholds, arrivals))]


def holdback_window_s(waited_s: float, config: SchedulingConfig) -> float:
    """Seconds after its arrival within which requests may overtake a predicted-long request that waited this long.

    The bound of the tail-safe key. Compared with FCFS, a predicted-long request that waits W also
    waits for the short-class requests that arrived within ``f * W`` after it (``f`` =
    ``long_holdback``). If those arrive at ``rho_s`` times the rate the instance serves them, that is
    ``f * W * rho_s`` seconds more, so ``W <= W_fcfs / (1 - f * rho_s)``: at the default 0.05, x1.05 at
    saturation and x1.11 at 2x overload. Starvation needs ``rho_s >= 1 / f`` (20x overload of the
    short class at the default); strict priority (``f >= 1``) starves at any overload.
    """
    return config.long_holdback * waited_s
