"""KV admission by predicted length: how many output tokens of KV cache to hold for a request.

Serving engines size a request's KV reservation from ``max_new_tokens`` (SGLang: all of it for a
new request, ``new_token_ratio`` of what is left for a running one), although most outputs are far
shorter, so fewer requests run at once than fit. With a length prediction the reservation can be
the predicted remaining length plus a safety margin; a request that outgrows it is caught by the
engine's retraction (longest predicted remaining first, :func:`retraction_order_key`). Read by
``kv_admission predicted`` (:class:`~specforge_outlets.scheduling.kv_admission.PredictedChargeAdmission`),
which the simulator and the SGLang plugin (``--outlets-kv-admission predicted --outlets-kv-margin M``) run.

With a predicted distribution the reservation can instead be a chosen quantile of the remaining
length (:func:`quantile_output_budget`; the simulator's ``kv_admission: quantile``): a margin on the
mean is the same share for a request the predictor is sure of as for one it is not, a quantile
reserves more for the uncertain ones, whose tails cause the retractions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

from specforge_outlets.scheduling.keys import SchedulingConfig, predicted_remaining
from specforge_outlets.scheduling.length_distribution import LengthDistribution

# kv_margin: share of the predicted remaining length reserved on top of it. In the simulator (Azure
# conversation and heavy-tailed outputs, exact to doubled-error predictions) 0.2 retracted 1 request in
# 48 FCFS and tail-safe runs and gave up to 1% more throughput than 0.5
# (benchmarks/tail_safe_sweep.py --kv-admission predicted --kv-margin M regenerates the comparison).
DEFAULT_KV_MARGIN = 0.2

# kv_quantile: the quantile of the predicted remaining length reserved by quantile admission (and the
# peak's per-request end): the upper decile, so that about one request in ten outgrows its reservation
# if the quantiles are calibrated (the retraction then catches it), the q90 coverage the evaluation reports.
DEFAULT_KV_QUANTILE = 0.9


@dataclass(frozen=True)
class Knob:
    """A number a KV admission rule reads beside its name (each strategy lists its own in ``knobs``).

    The plugin's flag ``--outlets-<name>`` and the simulator's cluster field ``<name>`` are the same
    knob, with this one default and this one check (``kv_admission.kv_knob_values``)."""

    name: str  # the cluster field and the plugin setting; the flag is --outlets- and the name with dashes
    default: float
    valid: Callable[[float], bool]
    expected: str  # what a valid value is, as a refusal says it: "give <expected>"

    def parse(self, raw: Any) -> float:
        """``raw`` (a number, or text as environment variables and YAML carry it) if valid, else ValueError."""
        try:
            value = float(raw) if not isinstance(raw, bool) else math.nan
        except (TypeError, ValueError):
            value = math.nan
        if not self.valid(value):
            raise ValueError(f"give {self.expected}")
        return value


KV_MARGIN = Knob("kv_margin", DEFAULT_KV_MARGIN, lambda value: math.isfinite(value) and value >= 0, "a number >= 0")
KV_QUANTILE = Knob("kv_quantile", DEFAULT_KV_QUANTILE, lambda value: 0.0 < value < 1.0,
                   "a level strictly between 0 and 1, e.g. 0.9")
KNOBS = (KV_MARGIN, KV_QUANTILE)


def predicted_output_budget(
    predicted_output_len: Optional[float], num_generated_tokens: int, kv_margin: float, cap: int,
    config: SchedulingConfig,
) -> int:
    """Output tokens of KV to hold for a request from now on: predicted remaining x (1 + kv_margin), at most ``cap``."""
    remaining = predicted_remaining(predicted_output_len, num_generated_tokens, config.prior_output_len)
    return min(cap, math.ceil(remaining * (1.0 + kv_margin)))


def quantile_output_budget(distribution: LengthDistribution, num_generated: int, kv_quantile: float, cap: int) -> int:
    """Output tokens of KV to hold from now on: the ``kv_quantile``-quantile of the remaining length given
    ``num_generated`` tokens so far (:meth:`LengthDistribution.quantile_remaining`), rounded up, at most ``cap``."""
    return min(cap, math.ceil(distribution.quantile_remaining(kv_quantile, num_generated)))
