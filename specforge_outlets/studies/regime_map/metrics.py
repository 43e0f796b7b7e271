"""A run's figures, over the whole trace and over its steady window.

The steady window leaves out the warm-up (the first ``WARMUP_SHARE`` of the arrival span, an empty cluster
filling) and the drain (the last ``DRAIN_SHARE``, whose requests meet no later arrivals): its requests are those
that arrived in between. A batch has no window (every request arrives at once): its figures are the whole
batch's, timed from the batch's submission, a prediction pass included.
"""

from __future__ import annotations

import math
from typing import Dict

import numpy as np

from specforge_outlets.serving.metrics import parse_goodput, summarize_requests
from specforge_outlets.simulation.cluster import ClusterConfig
from specforge_outlets.simulation.engine import SimulationResult
from specforge_outlets.studies.sharegpt_serving import DEFAULT_SLO

WARMUP_SHARE = 0.2  # of the arrival span, left out at the start of the steady window
DRAIN_SHARE = 0.2  # and at its end
SHORT_THRESHOLD = 800  # a short request has fewer output tokens (the method's threshold)
SLO = parse_goodput(DEFAULT_SLO)  # TTFT 5 s and TPOT 100 ms (the serving study's): goodput and attainment
WINDOW = (f"requests arriving after the first {WARMUP_SHARE:.0%} and before the last {DRAIN_SHARE:.0%} of the "
          "arrival span")


def steady_window(arrival_times: np.ndarray) -> np.ndarray:
    """The requests of the steady window (a mask)."""
    start, end = float(arrival_times.min()), float(arrival_times.max())
    span = end - start
    return (arrival_times >= start + WARMUP_SHARE * span) & (arrival_times <= end - DRAIN_SHARE * span)


def figures(arrivals: np.ndarray, first_tokens: np.ndarray, finishes: np.ndarray, output_lens: np.ndarray
            ) -> Dict[str, float]:
    """The figures users buy, of the requests given (seconds, tokens; TTFT as the client sees it)."""
    summary = summarize_requests(arrivals, first_tokens, finishes, output_lens, short_threshold=SHORT_THRESHOLD,
                                 slo=SLO)
    every, short, long = summary["all"], summary["short"], summary["long"]
    return {"requests": every["requests"], "ttft_mean_s": every["ttft_mean_s"], "ttft_p50_s": every["ttft_p50_s"],
            "ttft_p99_s": every["ttft_p99_s"], "e2e_mean_s": every["e2e_mean_s"], "e2e_p99_s": every["e2e_p99_s"],
            "short_p99_s": short["e2e_p99_s"], "long_p99_s": long["e2e_p99_s"],
            "goodput_rps": every["goodput_rps"], "slo_attainment": every["slo_attainment"],
            "throughput_tok_s": every["throughput_tok_s"],
            "makespan_s": float(finishes.max() - arrivals.min()) if len(arrivals) else math.nan}


def run_figures(result: SimulationResult, submitted: np.ndarray, batch: bool) -> Dict[str, dict]:
    """Whole-trace figures and, online, the steady window's; TTFT as SGLang reports it (the first decode batch on
    PD), timed from ``submitted`` (the arrival, or a batch's submission before its prediction pass)."""
    first_tokens = result.reported_first_token_times
    made = {"whole": figures(submitted, first_tokens, result.finish_times, result.output_lens)}
    if not batch:
        window = steady_window(submitted)
        made["steady"] = figures(submitted[window], first_tokens[window], result.finish_times[window],
                                 result.output_lens[window])
    return {name: {key: round(value, 4) if isinstance(value, float) else value for key, value in values.items()}
            for name, values in made.items()}


def prediction_pass_s(cluster: ClusterConfig, input_lens: np.ndarray) -> float:
    """Seconds of a prefill-only pass over a batch's prompts before its first admission (r̂₀ is the draft's read at
    the last prompt token): the prompts split evenly over the instances, prefilled in chunks of
    ``chunked_prefill_size``. The prompt's KV would stay in the prefix cache; the simulator has none and prefills
    each prompt again when the request is admitted, so the charge is an upper bound."""
    model = cluster.step_time_model()
    per_instance = float(np.sum(input_lens)) / cluster.instances
    full, rest = divmod(per_instance, cluster.chunked_prefill_size)
    return full * model.step_time(0, cluster.chunked_prefill_size) + (model.step_time(0, rest) if rest else 0.0)
