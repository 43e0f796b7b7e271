"""A cluster's capacity, measured in the simulator by a short bisection.

Capacity: the highest offered rate (Poisson arrivals of the label set's samples, seed 0) at which SGLang's default
serves output tokens within ``CAPACITY_TOLERANCE`` of the rate they are offered at, both over the steady window
(``metrics.steady_window``): the tokens the window's arrivals ask for, against the tokens the cluster made in that
time (each request's output spread evenly from its first token to its last). That share is not exactly 1 even
where nothing queues (the window's own draw of lengths, the cluster still filling with long requests), so it is
taken relative to the same trace's share at ``REFERENCE_LOAD`` of the hint, where nothing queues: the same draws
at every rate, so their offset cancels.
"""

from __future__ import annotations

from typing import Callable, Dict, List

import numpy as np

from specforge_outlets.simulation.engine import SimulationResult
from specforge_outlets.studies.regime_map.metrics import steady_window

CAPACITY_TOLERANCE = 0.02  # served output throughput at least 98% of offered
CAPACITY_STEPS = 6  # bisection steps after the bracket: about 1.5% of the hint
BRACKET = (0.5, 1.5)  # the first bracket, as multiples of the cluster's hint
REFERENCE_LOAD = 0.25  # of the hint: the share there is the trace's own, nothing queueing


def served_share(result: SimulationResult) -> float:
    """Output tokens made during the steady window over the tokens its arrivals ask for."""
    arrivals = result.arrival_times
    window = steady_window(arrivals)
    start, end = float(arrivals[window].min()), float(arrivals[window].max())
    first, last, lengths = result.first_token_times, result.finish_times, result.output_lens.astype(np.float64)
    overlap = np.clip(np.minimum(last, end) - np.maximum(first, start), 0.0, None)
    duration = last - first
    made = np.where(duration > 0, lengths * overlap / np.where(duration > 0, duration, 1.0),
                    lengths * ((first >= start) & (first <= end)))
    return float(made.sum() / lengths[window].sum())


def bisect_capacity(share_at: Callable[[float], float], hint: float) -> Dict[str, object]:
    """The highest rate whose ``share_at`` is within tolerance of the reference's; every probe recorded."""
    reference = share_at(REFERENCE_LOAD * hint)
    probes: List[Dict[str, float]] = [{"rate_rps": round(REFERENCE_LOAD * hint, 3), "served_share": round(reference, 4)}]

    def holds(rate: float) -> bool:
        share = share_at(rate)
        probes.append({"rate_rps": round(rate, 3), "served_share": round(share, 4)})
        return share >= reference * (1.0 - CAPACITY_TOLERANCE)

    low, high = BRACKET[0] * hint, BRACKET[1] * hint
    while not holds(low):
        low, high = low / 2, low
    while holds(high):
        low, high = high, high * 2
    for _ in range(CAPACITY_STEPS):
        middle = (low + high) / 2
        low, high = (middle, high) if holds(middle) else (low, middle)
    return {"capacity_rps": round(low, 3), "reference_rps": probes[0]["rate_rps"], "probes": probes}
