"""Serving metrics of one run, for all requests and for short and long ones.

The same schema is meant for real runs (``outlets bench-serving``), so that a simulated and a
measured run compare side by side. Throughput is output tokens over the makespan (first arrival to
last finish); a class's throughput is its own output tokens over that same makespan.
"""

from __future__ import annotations

from typing import Dict

import numpy as np

from specforge_outlets.simulation.engine import SimulationResult

# Requests with fewer output tokens than this are "short" (the method's threshold).
DEFAULT_SHORT_THRESHOLD = 800


def summarize(result: SimulationResult, short_threshold: int = DEFAULT_SHORT_THRESHOLD) -> Dict[str, Dict[str, float]]:
    """Metrics per class: ``all``, ``short`` (< threshold output tokens) and ``long``."""
    makespan = float(np.max(result.finish_times) - np.min(result.arrival_times))
    short = result.output_lens < short_threshold
    classes = {"all": np.ones_like(short), "short": short, "long": ~short}
    return {name: _class_metrics(result, mask, makespan) for name, mask in classes.items()}


def _class_metrics(result: SimulationResult, mask: np.ndarray, makespan: float) -> Dict[str, float]:
    count = int(mask.sum())
    metrics: Dict[str, float] = {
        "requests": count,
        "throughput_tok_s": float(result.output_lens[mask].sum() / makespan) if makespan > 0 else 0.0,
    }
    latencies = {
        "e2e": result.finish_times - result.arrival_times,
        "ttft": result.first_token_times - result.arrival_times,
        "queue": result.queue_delays,
    }
    for name, values in latencies.items():
        selected = values[mask]
        for label, percentile in (("p50", 50), ("p99", 99)):
            metrics[f"{name}_{label}_s"] = float(np.percentile(selected, percentile)) if count else float("nan")
        metrics[f"{name}_mean_s"] = float(selected.mean()) if count else float("nan")
    metrics["queue_max_s"] = float(result.queue_delays[mask].max()) if count else float("nan")
    return metrics
