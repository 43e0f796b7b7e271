"""The columns ``outlets compare-runs`` can print, by SGLang's result keys.

A column is a key of ``sglang.benchmark.serving``'s result (SGLang 0.5.23: milliseconds,
``p99_ttft_ms``; throughput per second, ``output_throughput``; with ``--goodput``,
``request_goodput`` and ``slo_attainment``), or one SGLang lacks, named the same way: a length
class's latency (``short_p99_e2e_latency_ms``), the offered load (``offered_rps``) and failures
(``failed``).

Where a column's value comes from:

- SGLang's keys are read from the row when it has them (``outlets bench-serving`` writes them beside
  ours, ``sglang_result.py``; a stock result file is nothing else); a row without them (``outlets
  simulate``) derives them from its all-requests metrics (``serving/metrics.py``, seconds). They mean
  what SGLang means: over the successful requests (the simulator has no failed ones).
- A class's keys are read from its metrics, where a failed request is an infinite latency (``inf``).
  SGLang keeps no length classes: its rows read ``–`` there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from specforge_outlets.errors import OutletsError
from specforge_outlets.serving.metrics import metric_value

MS_PER_S = 1e3
# SGLang's latency stems -> ours, and SGLang's statistics -> ours (serving/metrics.py's key parts).
LATENCY_STEMS = {"e2e_latency": "e2e", "ttft": "ttft", "tpot": "tpot", "itl": "itl"}
STATISTICS = {"mean": "mean", "median": "p50", "p99": "p99"}
LENGTH_CLASSES = ("short", "long")
# Goodput keys: SGLang's name -> ours (per class), as rates or shares; not milliseconds.
GOODPUT = {"request_goodput": "goodput_rps", "slo_attainment": "slo_attainment"}


@dataclass(frozen=True)
class CompareKey:
    """One column: its key, the format of its cells and where a row keeps its value."""

    name: str
    fmt: str
    metrics_class: Optional[str]  # None: the row itself ("offered_rps")
    ours: Optional[str]  # our metric key it derives from; None: SGLang's result only
    scale: float = 1.0  # ours -> this column's unit
    sglang: bool = False  # a key of SGLang's result: read from the row first
    missing: float = math.nan  # the value when the row lacks it

    def value(self, row: Dict) -> float:
        """This column's number for a summary row (NaN when the run did not record it)."""
        if self.sglang and self.name in row:
            return metric_value(row[self.name])
        source = row if self.metrics_class is None else row["metrics"].get(self.metrics_class, {})
        if self.ours is None or self.ours not in source:
            return self.missing
        return metric_value(source[self.ours]) * self.scale


def _latency_keys(prefix: str, metrics_class: str, sglang: bool) -> List[CompareKey]:
    return [CompareKey(f"{prefix}{statistic}_{stem}_ms", "{:.1f}", metrics_class, f"{ours}_{ours_statistic}_s",
                       MS_PER_S, sglang)
            for stem, ours in LATENCY_STEMS.items() for statistic, ours_statistic in STATISTICS.items()]


def _keys() -> Dict[str, CompareKey]:
    keys = [
        CompareKey("offered_rps", "{:.2f}", None, "offered_rps"),
        CompareKey("completed", "{:.0f}", "all", None, sglang=True),
        CompareKey("request_throughput", "{:.2f}", "all", None, sglang=True),
        CompareKey("input_throughput", "{:.0f}", "all", None, sglang=True),
        CompareKey("output_throughput", "{:.0f}", "all", "throughput_tok_s", sglang=True),
        CompareKey("total_throughput", "{:.0f}", "all", None, sglang=True),
        CompareKey("max_concurrent_requests", "{:.0f}", "all", None, sglang=True),
        *_latency_keys("", "all", sglang=True),
        *(CompareKey(name, "{:.2f}", "all", ours, sglang=True) for name, ours in GOODPUT.items()),
        # summaries written before failures were counted lack it: the simulator never fails
        CompareKey("failed", "{:.0f}", "all", "failed", missing=0.0),
    ]
    for cls in LENGTH_CLASSES:
        keys += _latency_keys(f"{cls}_", cls, sglang=False)
        keys += [CompareKey(f"{cls}_{name}", "{:.2f}", cls, ours) for name, ours in GOODPUT.items()]
    return {key.name: key for key in keys}


KEYS = _keys()
# The columns printed without --metrics: load, throughput, the latencies the method moves (short
# requests' e2e, at the long ones' expense), the first token, goodput and failures.
DEFAULT_METRICS = ("offered_rps", "output_throughput", "median_e2e_latency_ms", "p99_e2e_latency_ms",
                   "short_median_e2e_latency_ms", "short_p99_e2e_latency_ms", "long_p99_e2e_latency_ms",
                   "p99_ttft_ms", "request_goodput", "slo_attainment", "failed")


def parse_metrics(text: Optional[str]) -> List[CompareKey]:
    """``--metrics a,b,c`` -> the columns, in that order; an unknown key lists the valid ones."""
    names: Sequence[str] = DEFAULT_METRICS if text is None else [name.strip() for name in text.split(",")]
    unknown = [name for name in names if name not in KEYS]
    if unknown:
        raise OutletsError(f"--metrics: unknown key {', '.join(repr(name) for name in unknown)}; "
                           f"valid keys: {', '.join(KEYS)}")
    return [KEYS[name] for name in names]
