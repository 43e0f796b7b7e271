"""``sglang.benchmark.serving``'s result keys: written beside ours, and read back from a stock result file.

SGLang 0.5.23's ``sglang.benchmark.serving`` writes one JSON object per run (appended to its
``--output-file``, one line each) with its own names and units: milliseconds (``p99_ttft_ms``,
``median_e2e_latency_ms``), throughput in tokens or requests per second (``output_throughput``,
``request_throughput``) and, with ``--goodput``, ``request_goodput`` and ``slo_attainment``.
``sglang.bench_serving`` is its deprecated alias there (a ``FutureWarning``).
``sglang_result`` computes those keys from our client records the way its ``calculate_metrics`` and
``calculate_goodput`` do, so an ``outlets bench-serving`` summary row carries them beside ours:
over the **successful** requests only (ours count a failure as an infinite latency), TPOT over
outputs of more than one token, ITL pooled over every request's gaps, goodput with a one-token
output's TPOT taken as 0, input tokens as the server counted each prompt, and the peak of concurrent
requests over one-second buckets. ``row_from_sglang`` turns a stock result into a summary row, so that
``outlets compare-runs`` puts a plain ``sglang.benchmark.serving`` run beside ours.
"""

from __future__ import annotations

import json
import math
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from specforge_outlets.errors import OutletsError

LATENCIES = ("ttft", "tpot", "itl", "e2e_latency")  # SGLang's key stems, each in ms
STATISTICS = ("mean", "median", "std", "p90", "p95", "p99")
# SGLang's --goodput names -> the latency each bounds, in ms as its calculate_goodput observes it
GOODPUT_METRICS = ("ttft", "tpot", "e2el")
# keys a result line must have to be read as sglang.benchmark.serving's
REQUIRED = ("completed", "duration", "output_throughput", "median_e2e_latency_ms", "p99_e2e_latency_ms")
# Width of the time buckets SGLang counts concurrent requests in (its max_concurrent_requests).
CONCURRENCY_BUCKET_S = 1.0


def _statistics(stem: str, seconds: Sequence[float]) -> Dict[str, float]:
    """mean/median/std/p90/p95/p99 of ``seconds`` in ms under SGLang's names (NaN when empty)."""
    values = np.asarray(seconds, dtype=np.float64) * 1e3
    if not len(values):
        return {f"{name}_{stem}_ms": math.nan for name in STATISTICS}
    return {f"mean_{stem}_ms": float(values.mean()), f"median_{stem}_ms": float(np.median(values)),
            f"std_{stem}_ms": float(values.std()),
            **{f"p{q}_{stem}_ms": float(np.percentile(values, q)) for q in (90, 95, 99)}}


def sglang_result(records, duration_s: float, slo_s: Optional[Dict[str, float]] = None) -> Dict[str, Any]:
    """SGLang's result keys for one run of client records (``client.RequestRecord``).

    ``slo_s``: seconds per goodput name (``serving.metrics.parse_goodput``); adds ``goodput_slos_ms``,
    ``request_goodput``, ``slo_attainment`` and ``slo_attainment_by_metric`` as SGLang names them.
    """
    done = [record for record in records if record.success]
    ttfts = [record.ttft_s for record in done]
    e2e = [record.e2e_s for record in done]
    tpots = [(record.e2e_s - record.ttft_s) / (record.output_len - 1) for record in done if record.output_len > 1]
    itls = [gap for record in done for gap in record.itl_s]
    output_tokens = sum(record.output_len for record in done)
    input_tokens = _input_tokens(done)
    result: Dict[str, Any] = {
        "completed": len(done),
        "duration": duration_s,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(done) / duration_s,
        "input_throughput": input_tokens / duration_s,
        "output_throughput": output_tokens / duration_s,
        "total_throughput": (input_tokens + output_tokens) / duration_s,
        **_statistics("ttft", ttfts), **_statistics("tpot", tpots), **_statistics("itl", itls),
        **_statistics("e2e_latency", e2e),
        "concurrency": sum(e2e) / duration_s,
        "max_concurrent_requests": max_concurrent_requests(done),
    }
    if slo_s:
        result.update(_goodput(records, {name: seconds * 1e3 for name, seconds in slo_s.items()}, duration_s))
    return result


def _input_tokens(done):
    """Prompt tokens of the successful requests, as the server counted them (``meta_info.prompt_tokens``,
    else the token ids sent); NaN (written as null) when a request's count is unknown, never a partial sum."""
    lengths = [record.prompt_len for record in done]
    return math.nan if None in lengths else sum(lengths)


def max_concurrent_requests(done) -> int:
    """SGLang's peak concurrency: the most successful requests in flight during any one-second bucket
    from the first send (a request counts in every bucket from its send to its end)."""
    if not done:
        return 0
    start = min(record.sent_s for record in done)
    end = max(record.sent_s + record.e2e_s for record in done)
    buckets = np.zeros(int((end - start) // CONCURRENCY_BUCKET_S) + 1, dtype=np.int64)
    for record in done:
        first = int((record.sent_s - start) // CONCURRENCY_BUCKET_S)
        last = int((record.sent_s + record.e2e_s - start) // CONCURRENCY_BUCKET_S)
        buckets[first:last + 1] += 1
    return int(buckets.max())


def _goodput(records, slos_ms: Dict[str, float], duration_s: float) -> Dict[str, Any]:
    """SGLang's calculate_goodput: a request is good if it succeeded within every target."""
    good, met = 0, dict.fromkeys(slos_ms, 0)
    for record in records:
        if not record.success:
            continue
        tpot = (record.e2e_s - record.ttft_s) / (record.output_len - 1) if record.output_len > 1 else 0.0
        observed = {"ttft": record.ttft_s * 1e3, "tpot": tpot * 1e3, "e2el": record.e2e_s * 1e3}
        within = [name for name, target in slos_ms.items() if observed[name] <= target]
        for name in within:
            met[name] += 1
        good += len(within) == len(slos_ms)
    sent = max(len(records), 1)
    return {"goodput_slos_ms": slos_ms, "request_goodput": good / duration_s, "slo_attainment": good / sent,
            "slo_attainment_by_metric": {name: count / sent for name, count in met.items()}}


def read_sglang_results(path: str) -> List[Dict[str, Any]]:
    """The result lines of a ``sglang.benchmark.serving --output-file`` (one run per line), each checked."""
    results = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                result = json.loads(line)
            except json.JSONDecodeError as exc:
                raise OutletsError(f"{path}:{number}: not JSON ({exc}); give the file sglang.benchmark.serving "
                                   "--output-file wrote") from None
            missing = [key for key in REQUIRED if not isinstance(result, dict) or key not in result]
            if missing:
                raise OutletsError(f"{path}:{number}: no {', '.join(missing)}; not a sglang.benchmark.serving result")
            results.append(result)
    if not results:
        raise OutletsError(f"{path}: empty; give the file sglang.benchmark.serving --output-file wrote")
    return results


def row_from_sglang(result: Dict[str, Any], label: str) -> Dict[str, Any]:
    """A summary row (``serving/summary.py``) of a stock result: its keys kept, and ours for all requests
    derived from them (ms to s). SGLang keeps no per-request length class, so ``short`` and ``long``
    are empty (their cells read –); failures are known only from ``--output-details``' errors."""
    def seconds(key: str) -> float:
        value = result.get(key)
        return math.nan if value is None else float(value) / 1e3

    rate = result.get("request_rate")
    errors = result.get("errors")
    known = isinstance(errors, list)
    everything = {"requests": len(errors) if known else result["completed"],
                  "throughput_tok_s": result["output_throughput"],
                  "failed": sum(bool(error) for error in errors) if known else math.nan,
                  **{f"{ours}_{statistic}_s": seconds(f"{theirs}_{stem}_ms")
                     for ours, stem in (("e2e", "e2e_latency"), ("ttft", "ttft"), ("tpot", "tpot"), ("itl", "itl"))
                     for statistic, theirs in (("p50", "median"), ("p99", "p99"), ("mean", "mean"))}}
    if "request_goodput" in result:
        everything.update(goodput_rps=result["request_goodput"], slo_attainment=result.get("slo_attainment"))
    return {**result, "label": label, "offered_rps": float(rate) if isinstance(rate, (int, float)) else math.nan,
            "metrics": {"all": everything, "short": {}, "long": {}}}
