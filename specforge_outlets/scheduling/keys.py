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

Longest-predicted-first (:func:`longest_first_sort_key`) is the opposite order, for the makespan of an offline
batch rather than latency: the predicted stragglers start first. The ranked tail-safe order
(``tail-safe-ranks``, :mod:`.prediction_ranks`) is the tail-safe key with its long class read from the ranks of
recent predictions instead of the fixed ``long_output_len``.

Aging bound (SJF). The key of a request that arrived at ``a`` with predicted remaining length ``R`` is
``R + rate * a`` (``rate`` = aging tokens per second). Subtracting ``rate * now`` from every key
gives "remaining length minus credit for time waited"; the term is common to all requests, so the
order never changes while they wait and a heap can hold the keys. Because every key is at least
``MIN_PREDICTED_REMAINING + rate * a``, a request that arrives more than
``(R - MIN_PREDICTED_REMAINING) / rate`` seconds after it can never be ordered ahead of it
(:func:`aging_window_s`). A waiting request is therefore overtaken only by requests that arrive
within a bounded window, and waits at most as long as it would under FCFS had it arrived that
window later. With ``rate = 0`` the key is plain SJF and there is no bound.

Distributions. A request may also carry ``predicted_output_quantiles``, quantiles of its
total output length at ``SchedulingConfig.quantile_levels`` (:mod:`.length_distribution`). The SJF
key can then order by what that distribution says (``order_key``: its mean remaining length, a
risk-adjusted mean + beta x CVaR_0.9, the Gittins rank, or the KV footprint of the decode), and the
tail-safe class can be set by an upper quantile (``long_class_quantile``). A request without
quantiles is a point mass at its point prediction (or the prior), so with the defaults (``point``,
no quantile) every key is what it was.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import struct
from array import array
from dataclasses import dataclass
from enum import Enum
from typing import List, Optional, Sequence, Tuple

# MIN_PREDICTED_REMAINING lives with the distributions (the lower module) and is re-exported here
from specforge_outlets.scheduling.length_distribution import (
    DEFAULT_QUANTILE_LEVELS,
    MIN_PREDICTED_REMAINING,
    LengthDistribution,
)

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

# tail-safe-ranks: the share of recent predictions that forms the long class. 0.2, the top fifth: few enough that the
# hold-back touches a minority of requests, many enough to hold a trace's stragglers; not tuned (issue 45's map sets
# defaults). A window needs 1 / share predictions (5) before any request is long.
DEFAULT_LONG_CLASS_SHARE = 0.2

# tail-safe-ranks: how many recent predictions the long-class threshold is read from. 1000 is about 25 s of arrivals
# at 40 rps per instance: long enough that one burst of long prompts does not move the threshold much, short enough
# that it follows a change of traffic within a minute.
DEFAULT_RANK_WINDOW = 1000

# Retractions per request before KV pressure retracts others first: a request retracted this often
# is kept while any other running request can go, so it cannot be retracted over and over.
DEFAULT_MAX_RETRACTIONS = 2

# Weight of the tail term of the risk order key, E[R] + beta * CVaR_0.9[R] (TIE, Zheng et al.
# 2026, order by E + beta x CVaR_0.9). TIE raises beta with the queue's length; here it is fixed,
# because the SJF queue computes a waiting request's key once (a heap, and the plugin's cached keys)
# and a key that moved with the queue would re-sort every request every round. 1.0 weighs the
# expected length and the tail's mean alike.
DEFAULT_RISK_BETA = 1.0

# Tail of the risk key: CVaR at this level is the mean of the upper 10% of the remaining length.
RISK_TAIL_LEVEL = 0.9

# KV context (tokens) that converts the kv-footprint key, E[(prompt + g + R/2) R] in token-steps, into
# tokens of output at that context, the unit the aging rate is in: a footprint key divided by it
# ages by aging_tokens_per_s per second as the other keys do. 1024 is about a chat request's prompt
# plus half its output; for long-context traces set it near their mean context, or aging weighs less.
DEFAULT_FOOTPRINT_CONTEXT_TOKENS = 1024.0

# Distributions a process keeps built for the keys (a request's quantiles are the same tuple for
# every key it gets while waiting); about 5 kB each.
DISTRIBUTION_CACHE_SIZE = 4096


class OrderKey(str, Enum):
    """What the SJF queue orders by, smaller first (each plus aging)."""

    POINT = "point"  # the point prediction's remaining length (the method's SJF)
    MEAN = "mean"  # E[R] of the predicted distribution
    RISK = "risk"  # E[R] + risk_beta * CVaR_0.9[R] (TIE)
    GITTINS = "gittins"  # the inverse Gittins index of R: optimal mean response time for known distributions
    KV_FOOTPRINT = "kv-footprint"  # E[(prompt + g + R/2) R] / footprint_context_tokens: KV held over the decode


@dataclass(frozen=True)
class SchedulingConfig:
    """Settings of the ordering key and of least-predicted-work routing."""

    prior_output_len: float = DEFAULT_PRIOR_OUTPUT_LEN
    aging_tokens_per_s: float = DEFAULT_AGING_TOKENS_PER_S  # SJF
    long_output_len: float = DEFAULT_LONG_OUTPUT_LEN  # tail-safe
    long_holdback: float = DEFAULT_LONG_HOLDBACK  # tail-safe
    max_retractions: int = DEFAULT_MAX_RETRACTIONS  # retraction order
    order_key: OrderKey = OrderKey.POINT  # SJF: what it orders by
    risk_beta: float = DEFAULT_RISK_BETA  # SJF with order_key risk
    footprint_context_tokens: float = DEFAULT_FOOTPRINT_CONTEXT_TOKENS  # SJF with order_key kv-footprint
    # tail-safe: None, the long class by the point prediction; a level q, by the q-quantile of the remaining length
    long_class_quantile: Optional[float] = None
    # levels of a request's predicted_output_quantiles (total-length tokens, one per level)
    quantile_levels: Tuple[float, ...] = DEFAULT_QUANTILE_LEVELS
    long_class_share: float = DEFAULT_LONG_CLASS_SHARE  # tail-safe-ranks: top share of recent predictions = long
    rank_window: int = DEFAULT_RANK_WINDOW  # tail-safe-ranks: recent predictions the share is read from

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
        try:
            object.__setattr__(self, "order_key", OrderKey(self.order_key))
        except ValueError:
            raise ValueError(f"order_key must be one of {', '.join(key.value for key in OrderKey)}, "
                             f"got {self.order_key!r}") from None
        if not (self.risk_beta >= 0 and math.isfinite(self.risk_beta)):
            raise ValueError(f"risk_beta must be >= 0, got {self.risk_beta}")
        if not (self.footprint_context_tokens > 0 and math.isfinite(self.footprint_context_tokens)):
            raise ValueError(f"footprint_context_tokens must be a positive number, got {self.footprint_context_tokens}")
        if self.long_class_quantile is not None and not (0 < self.long_class_quantile < 1):
            raise ValueError(f"long_class_quantile must be None or strictly between 0 and 1, "
                             f"got {self.long_class_quantile!r}")
        levels = tuple(self.quantile_levels)
        try:
            LengthDistribution(levels, tuple(range(1, len(levels) + 1)))
        except ValueError as error:
            raise ValueError(f"quantile_levels: {error}") from None
        object.__setattr__(self, "quantile_levels", tuple(float(level) for level in levels))
        if not 0 < self.long_class_share < 1:
            raise ValueError(f"long_class_share must be strictly between 0 and 1, got {self.long_class_share!r}")
        if isinstance(self.rank_window, bool) or not isinstance(self.rank_window, int) or self.rank_window < 1:
            raise ValueError(f"rank_window must be a positive integer, got {self.rank_window!r}")

    @property
    def uses_distribution(self) -> bool:
        """Whether the keys read a request's predicted distribution, not only its point prediction."""
        return self.order_key is not OrderKey.POINT or self.long_class_quantile is not None


def predicted_remaining(
    predicted_output_len: Optional[float], num_generated_tokens: int, prior_output_len: float
) -> float:
    """Predicted total output length minus tokens generated so far, floored; the prior if unknown."""
    total = prior_output_len if predicted_output_len is None else predicted_output_len
    return max(total - num_generated_tokens, MIN_PREDICTED_REMAINING)


@functools.lru_cache(maxsize=DISTRIBUTION_CACHE_SIZE)
def _distribution(levels: Tuple[float, ...], quantiles: Tuple[float, ...]) -> LengthDistribution:
    return LengthDistribution(levels, quantiles)


@functools.lru_cache(maxsize=DISTRIBUTION_CACHE_SIZE)
def _point_distribution(total: float) -> LengthDistribution:
    return LengthDistribution.point(total)


def request_distribution(
    predicted_output_len: Optional[float], predicted_output_quantiles: Optional[Sequence[float]],
    config: SchedulingConfig,
) -> LengthDistribution:
    """A request's predicted total-length distribution: its quantiles at ``config.quantile_levels``;
    without them a point mass at its point prediction; without that at the prior (as the point keys)."""
    if predicted_output_quantiles is not None:
        return _distribution(config.quantile_levels, tuple(predicted_output_quantiles))
    total = config.prior_output_len if predicted_output_len is None else predicted_output_len
    return _point_distribution(float(total))


def distribution_order_value(
    distribution: LengthDistribution, num_generated_tokens: int, prompt_len: float, config: SchedulingConfig
) -> float:
    """The SJF key's size term under ``config.order_key`` (not POINT), before aging."""
    key = config.order_key
    if key is OrderKey.MEAN:
        return distribution.mean_remaining(num_generated_tokens)
    if key is OrderKey.RISK:
        return (distribution.mean_remaining(num_generated_tokens)
                + config.risk_beta * distribution.cvar_remaining(RISK_TAIL_LEVEL, num_generated_tokens))
    if key is OrderKey.GITTINS:
        return distribution.gittins_rank(num_generated_tokens)
    if key is OrderKey.KV_FOOTPRINT:
        return distribution.kv_footprint(prompt_len, num_generated_tokens) / config.footprint_context_tokens
    raise ValueError(f"order key {key!r} reads no distribution")


def sjf_sort_key(
    predicted_output_len: Optional[float],
    num_generated_tokens: int,
    arrival_time: float,
    config: SchedulingConfig,
    predicted_output_quantiles: Optional[Sequence[float]] = None,
    prompt_len: float = 0.0,
) -> Tuple[float, float]:
    """Ascending sort key: aged predicted remaining length, ties by arrival (earlier first).

    With ``config.order_key`` other than ``point`` the size term is read from the request's
    distribution (:func:`request_distribution`: its quantiles, else a point mass at its point
    prediction or the prior) and aged the same way; ``prompt_len`` is read by ``kv-footprint`` only.
    For a point mass ``mean`` and ``gittins`` equal ``point``; ``risk`` is (1 + beta) x it, so its
    aging is 1 / (1 + beta) as strong; the aging bound of :func:`aging_window_s` is the point key's.
    """
    if config.order_key is OrderKey.POINT:
        remaining = predicted_remaining(predicted_output_len, num_generated_tokens, config.prior_output_len)
    else:
        distribution = request_distribution(predicted_output_len, predicted_output_quantiles, config)
        remaining = distribution_order_value(distribution, num_generated_tokens, prompt_len, config)
    return remaining + config.aging_tokens_per_s * arrival_time, arrival_time


def longest_first_sort_key(
    predicted_output_len: Optional[float], num_generated_tokens: int, arrival_time: float, config: SchedulingConfig
) -> Tuple[float, float]:
    """Ascending sort key of longest-predicted-first: the longest predicted remaining length first, ties by arrival.

    For the makespan of an offline batch: a straggler started last sets the end, so the requests predicted to
    run longest start first (LPT scheduling). No aging: in a finite batch every request is served anyway.
    """
    return -predicted_remaining(predicted_output_len, num_generated_tokens, config.prior_output_len), arrival_time


def aging_window_s(remaining_tokens: float, config: SchedulingConfig) -> float:
    """Seconds after a request's arrival beyond which no later arrival can be ordered ahead of it, for a request
    of ``remaining_tokens`` predicted remaining output tokens (:func:`predicted_remaining`)."""
    if config.aging_tokens_per_s == 0:
        return math.inf
    return max(remaining_tokens - MIN_PREDICTED_REMAINING, 0.0) / config.aging_tokens_per_s


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
    predicted_output_len: Optional[float], num_generated_tokens: int, config: SchedulingConfig,
    predicted_output_quantiles: Optional[Sequence[float]] = None,
) -> bool:
    """Whether a request belongs to the long class of the tail-safe key (the prior if unknown).

    With ``config.long_class_quantile`` q set, by the q-quantile of its remaining length (tail-safe
    by an upper quantile: a request that may well run long waits in the long class); a request
    without quantiles is a point mass at its point prediction, which gives the point rule.
    """
    if config.long_class_quantile is None:
        remaining = predicted_remaining(predicted_output_len, num_generated_tokens, config.prior_output_len)
    else:
        distribution = request_distribution(predicted_output_len, predicted_output_quantiles, config)
        remaining = distribution.quantile_remaining(config.long_class_quantile, num_generated_tokens)
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
