"""The arrival processes of the map, each a function of a generator, a mean rate and a count (times in s, first at 0).

Poisson is the steady reference. Bursts above capacity are where a queue forms and drains, so an order can
matter below capacity on average; a real trace's own timing carries its own bursts; a batch arrives at once.
"""

from __future__ import annotations

import numpy as np

from specforge_outlets.serving.trace import load_trace, poisson_arrival_times
from specforge_outlets.studies.committed_data import AZURE_CONV_TRACE, shared

BURST_PERIOD_S = 30.0  # a burst starts every this many seconds
BURST_S = 10.0  # and lasts this long (the last BURST_S of each period: the trace opens quiet)
BURST_LOAD = 1.5  # the burst's rate as a multiple of capacity: above it, a queue forms, and drains between bursts


def burst_rates(mean_rps: float, capacity_rps: float) -> tuple:
    """(quiet, burst) rates whose time average over a period is ``mean_rps``."""
    burst = BURST_LOAD * capacity_rps
    quiet = (mean_rps * BURST_PERIOD_S - burst * BURST_S) / (BURST_PERIOD_S - BURST_S)
    if quiet <= 0:
        raise ValueError(f"a mean of {mean_rps:g} rps cannot hold bursts of {burst:g} rps for {BURST_S:g} s every "
                         f"{BURST_PERIOD_S:g} s")
    return quiet, burst


def poisson_burst_arrival_times(rng: np.random.Generator, mean_rps: float, capacity_rps: float,
                                count: int) -> np.ndarray:
    """A Poisson process whose rate is ``burst_rates``' quiet rate, and the burst rate for the last ``BURST_S`` of
    every ``BURST_PERIOD_S`` (drawn by thinning a Poisson process at the burst rate)."""
    quiet, burst = burst_rates(mean_rps, capacity_rps)
    times = np.empty(0)
    start = 0.0
    while len(times) < count:
        candidates = start + np.cumsum(rng.exponential(1.0 / burst, size=2 * count))
        in_burst = np.mod(candidates, BURST_PERIOD_S) >= BURST_PERIOD_S - BURST_S
        kept = candidates[in_burst | (rng.random(len(candidates)) < quiet / burst)]
        times, start = np.concatenate([times, kept]), float(candidates[-1])
    times = times[:count]
    return times - times[0]


def recorded_arrival_times(mean_rps: float, count: int, seed: int) -> np.ndarray:
    """Azure's conversation trace's own timing (../shared, read only when present): the seed's own window of
    ``count`` arrivals, scaled to ``mean_rps``."""
    whole = load_trace(shared(AZURE_CONV_TRACE, "the recorded-timing regime")).arrival_times
    if (seed + 1) * count > len(whole):
        raise SystemExit(f"{AZURE_CONV_TRACE} holds {len(whole)} arrivals: {seed + 1} windows of {count} do not fit")
    times = whole[seed * count:(seed + 1) * count]
    times = times - times[0]
    return times * (len(times) / times[-1]) / mean_rps


# name -> (generator, mean rate, capacity, count, seed) -> arrival times
ARRIVALS = {
    "poisson": lambda rng, rate, capacity, count, seed: poisson_arrival_times(rng, rate, count),
    "poisson-burst": lambda rng, rate, capacity, count, seed: poisson_burst_arrival_times(rng, rate, capacity, count),
    "recorded (azure-conv)": lambda rng, rate, capacity, count, seed: recorded_arrival_times(rate, count, seed),
    "batch": lambda rng, rate, capacity, count, seed: np.zeros(count),  # every request at once
}
