"""Serving metrics of one run, for all requests and for short and long ones.

One schema for simulated runs (``outlets simulate``) and measured ones (``outlets bench-serving``),
so that both compare side by side (``outlets compare-runs``). The computation takes plain per-request
arrays; the simulator feeds it a simulation result (``simulation.study.summarize``), the benchmark
client-side records.

Throughput is output tokens of successful requests over the makespan (first arrival to last finish
or failure); a class's throughput is its own output tokens over that same makespan.

Failed requests (a real server that dropped the connection, timed out or returned an error) stay in
the latency statistics with an **infinite** latency: leaving them out would make a server that drops
its slowest requests look fast. So a class's P99 is ``inf`` as soon as about 1% of it failed, and its
mean is ``inf`` when any request failed; ``failed`` counts them. A failed request's TTFT is infinite
only if it never produced a first token. In JSON, ``inf`` is written as the string ``"inf"`` and an
undefined value (an empty class) as ``null`` (``strict_json.json_safe``, :func:`metric_value`).

Queueing delay is reported only when it is known (the simulator); a client cannot observe it, so
``queue_*`` keys are absent from measured runs.

Inter-token latency (``itl_*``) pools the gaps between consecutive tokens of every request of a
class, as ``sglang.benchmark.serving`` does; it is given as weighted gaps (a value and how often it
occurs), because the simulator knows them per decode segment, not per token. Its percentiles are
the smallest gap with at least that share of the weight at or below it.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Iterable, Optional, Sequence, Tuple

import numpy as np

# Requests with fewer output tokens than this are "short" (the method's threshold).
DEFAULT_SHORT_THRESHOLD = 800
CLASSES = ("all", "short", "long")


# Latencies an SLO can bound, by sglang.benchmark.serving's --goodput names (``ttft:MS tpot:MS e2el:MS``);
# ``e2e``, this project's earlier name for ``e2el``, is still read. SLO name -> the latency it bounds.
SLO_LATENCIES = {"ttft": "ttft", "tpot": "tpot", "e2el": "e2e"}
SLO_METRICS = tuple(SLO_LATENCIES)
SLO_ALIASES = {"e2e": "e2el"}


def parse_goodput(items: Optional[Sequence[str]], flag: str = "--goodput") -> Dict[str, float]:
    """``["ttft:500", "e2el:9000"]`` (milliseconds) -> ``{"ttft": 0.5, "e2el": 9.0}`` (seconds)."""
    slo: Dict[str, float] = {}
    for item in items or ():
        name, _, value = str(item).partition(":")
        name = SLO_ALIASES.get(name, name)
        try:
            milliseconds = float(value)
        except ValueError:
            milliseconds = math.nan
        if name not in SLO_METRICS or not (milliseconds > 0 and math.isfinite(milliseconds)):
            from specforge_outlets.errors import OutletsError

            raise OutletsError(f"{flag} {item!r}: expected METRIC:MILLISECONDS with METRIC one of "
                               f"{', '.join(SLO_METRICS)} and a positive number, e.g. {flag} ttft:500 tpot:50")
        slo[name] = milliseconds / 1e3
    return slo


def summarize_requests(
    arrival_times: np.ndarray,
    first_token_times: np.ndarray,
    finish_times: np.ndarray,
    output_lens: np.ndarray,
    *,
    class_lens: Optional[np.ndarray] = None,
    queue_delays: Optional[np.ndarray] = None,
    waits: Optional[Dict[str, np.ndarray]] = None,
    success: Optional[np.ndarray] = None,
    short_threshold: int = DEFAULT_SHORT_THRESHOLD,
    slo: Optional[Dict[str, float]] = None,
    token_gaps: Optional[Callable[[np.ndarray], Tuple[np.ndarray, np.ndarray]]] = None,
) -> Dict[str, Dict[str, float]]:
    """Metrics per class from per-request arrays (seconds on one clock, tokens).

    ``finish_times`` of a failed request is when the failure was seen (it bounds the makespan);
    ``first_token_times`` is NaN for a request that never produced a token. ``output_lens`` counts
    generated tokens (only successful requests add to throughput). ``class_lens`` decides short or
    long (default ``output_lens``; the benchmark passes the expected length for failed requests).
    ``success`` defaults to all true; ``queue_delays`` to unknown (no ``queue_*`` keys). ``waits``
    (name -> seconds per request, e.g. the simulator's prefill queue, KV transfer and decode queue)
    adds ``<name>_p50_s``, ``_p99_s`` and ``_mean_s`` each. ``slo``
    (seconds per metric of :data:`SLO_METRICS`) adds ``slo_attainment`` (share of requests that
    succeeded within every target; a one-token output meets any TPOT target) and ``goodput_rps``
    (those requests per second of makespan). ``token_gaps`` maps a mask of requests to their
    inter-token gaps, ``(seconds, weights)``, and adds ``itl_p50_s``, ``itl_p99_s`` and ``itl_mean_s``.
    """
    arrival = np.asarray(arrival_times, dtype=np.float64)
    count = len(arrival)
    first_token = np.asarray(first_token_times, dtype=np.float64)
    finish = np.asarray(finish_times, dtype=np.float64)
    outputs = np.asarray(output_lens, dtype=np.float64)
    ok = np.ones(count, dtype=bool) if success is None else np.asarray(success, dtype=bool)
    lengths = outputs if class_lens is None else np.asarray(class_lens, dtype=np.float64)
    makespan = float(np.max(finish) - np.min(arrival)) if count else 0.0

    e2e = np.where(ok, finish - arrival, np.inf)
    ttft = first_token - arrival
    ttft = np.where(np.isnan(ttft), np.inf, ttft)  # never produced a token
    # Time per output token after the first, as sglang.benchmark.serving reports it; undefined (NaN, left out
    # of its statistics) for one-token outputs, infinite for a failed request.
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(ok, np.where(outputs > 1, (e2e - ttft) / (outputs - 1), np.nan), np.inf)
    latencies = {"e2e": e2e, "ttft": ttft, "tpot": tpot}
    if queue_delays is not None:
        latencies["queue"] = np.asarray(queue_delays, dtype=np.float64)
    for name, values in (waits or {}).items():
        latencies[name] = np.asarray(values, dtype=np.float64)

    short = lengths < short_threshold
    masks = {"all": np.ones(count, dtype=bool), "short": short, "long": ~short}
    summary = {name: class_metrics(mask, ok, outputs, latencies, makespan) for name, mask in masks.items()}
    if token_gaps is not None:
        for name, mask in masks.items():
            gaps, weights = token_gaps(mask)
            for label, q in (("p50", 50), ("p99", 99)):
                summary[name][f"itl_{label}_s"] = weighted_percentile(gaps, weights, q)
            total = float(np.sum(weights))
            summary[name]["itl_mean_s"] = float(np.dot(gaps, weights)) / total if total > 0 else math.nan
    if slo:
        good = ok.copy()
        for name, target in slo.items():
            latency = latencies[SLO_LATENCIES[SLO_ALIASES.get(name, name)]]
            good &= ~(latency > target)  # NaN (no TPOT) does not break a target
        for name, mask in masks.items():
            selected = int(mask.sum())
            summary[name]["slo_attainment"] = float(good[mask].sum()) / selected if selected else math.nan
            summary[name]["goodput_rps"] = float(good[mask].sum()) / makespan if makespan > 0 else 0.0
    return summary


def class_metrics(mask: np.ndarray, success: np.ndarray, output_lens: np.ndarray,
                  latencies: Dict[str, np.ndarray], makespan: float) -> Dict[str, float]:
    """Count, failures, throughput, and P50/P99/mean of each latency over the requests in ``mask``."""
    count = int(mask.sum())
    tokens = float(output_lens[mask & success].sum())
    metrics: Dict[str, float] = {
        "requests": count,
        "failed": int((mask & ~success).sum()),
        "throughput_tok_s": tokens / makespan if makespan > 0 else 0.0,
    }
    for name, values in latencies.items():
        selected = values[mask]
        selected = selected[~np.isnan(selected)]  # TPOT of one-token outputs
        for label, q in (("p50", 50), ("p99", 99)):
            metrics[f"{name}_{label}_s"] = percentile(selected, q)
        metrics[f"{name}_mean_s"] = float(selected.mean()) if len(selected) else math.nan
    if "queue" in latencies:
        metrics["queue_max_s"] = float(latencies["queue"][mask].max()) if count else math.nan
    return metrics


def percentile(values: np.ndarray, q: float) -> float:
    """Linear-interpolated percentile (numpy's default) that stays defined with infinite values.

    ``np.percentile`` interpolates ``a + (b - a) * t``: NaN between two infinities, and NaN for
    ``t == 0`` next to an infinity. Here a percentile that touches an infinite neighbour with a
    non-zero weight is ``inf``, and an exact rank returns that value.
    """
    if len(values) == 0:
        return math.nan
    if np.isfinite(values).all():
        return float(np.percentile(values, q))
    ordered = np.sort(values)
    position = q / 100.0 * (len(ordered) - 1)
    low = int(math.floor(position))
    high = min(low + 1, len(ordered) - 1)
    weight = position - low
    a, b = float(ordered[low]), float(ordered[high])
    if weight == 0.0 or a == b:
        return a
    if math.isinf(b) or math.isinf(a):
        return math.inf
    return a + (b - a) * weight


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The smallest value with at least ``q`` percent of the total weight at or below it (NaN if none)."""
    values, weights = np.asarray(values, np.float64), np.asarray(weights, np.float64)
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    if not len(values):
        return math.nan
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order])
    rank = int(np.searchsorted(cumulative, q / 100.0 * cumulative[-1], side="left"))
    return float(values[order][min(rank, len(values) - 1)])


def metric_value(value: Any) -> float:
    """A metric read back from summary.json: numbers, ``"inf"``, ``null`` (NaN), or Python's Infinity/NaN."""
    return math.nan if value is None else float(value)  # float() also reads "inf", "-inf", "nan"


def format_metric(value: Any, fmt: str = "{:.2f}") -> str:
    """Markdown cell: ``inf`` for an infinite latency (failed requests), ``–`` when undefined."""
    number = metric_value(value)
    if math.isnan(number):
        return "–"
    if math.isinf(number):
        return "inf"
    return fmt.format(number)


def pipe_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A markdown table of already formatted cells (the summaries and comparisons share this layout)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)
