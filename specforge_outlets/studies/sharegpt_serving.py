"""Serving study on real length distributions with learned predictions, against SGLang's own policies.

Workloads (``--workloads``):

- ``sharegpt-smollm2``, the method's own set-up: the label set's test split
  (``benchmarks/data/sharegpt-smollm2/``: 595 first-turn prompts answered by SmolLM2-135M-Instruct,
  92 cut at 2,048 tokens) with its evaluation's per-request predictions (``eval/predictions.jsonl.gz``:
  static r̂₀ and, for OUTLETS and the probes, the estimate at every output token). Requests are
  resampled with replacement into Poisson traces; a drawn request keeps its lengths and every
  predictor's values.
- ``sharegpt-chatgpt``: ShareGPT with the original ChatGPT answers' lengths (sarathi-serve's
  statistics in ../shared, 12% at or above 800 tokens; its prompts include the earlier turns) with
  Poisson arrivals; each predictor's values carry the errors it made on the label set at a similar
  true length (``with_measured_errors``).
- ``azure-conv``: the Azure conversation trace in ../shared, its recorded arrivals scaled to each
  rate, predictions as for ``sharegpt-chatgpt``. The control: almost no request is long.

Stages, each resumable per workload (its output is kept and skipped; delete it to run again):

1. ``workload``: each label-set test request's chat-prompt length (SmolLM2's tokenizer on the
   first turn, read from ../shared/data/prompts/, never copied) next to its output length, written
   to ``benchmarks/data/sharegpt-smollm2/serving/requests.jsonl`` (committed: lengths only).
2. ``simulate``: per cluster, KV admission and rate, SGLang's policies (``PEER_RUNS``) and
   least-predicted-work routing with the plugin's ``sjf`` and ``tail-safe`` orders, the predictor
   varied: none (the prior), the best static baseline (``bert``), OUTLETS r̂₀ (what the method
   deploys), on the method's workload also OUTLETS r̂ₜ (re-read after every token, as the plugin's
   EAGLE-3 mode does) and ``probe-mid`` r̂ₜ (a probe on the target's hidden states), and the oracle.
   Clusters: the method's 1 prefill + 3 decode (``recipes/cluster-h100-1p3d.yaml``) and 4 colocated
   instances (``recipes/cluster-h100-colocated.yaml``, predicting at prefill, as the draft does). KV
   admission: by prediction with ``--kv-capacity`` tokens per instance, so that the cache binds; or
   the full ``max_new_tokens`` reservation in the GPU's own cache, where predictions act through
   routing and the queue order only. Writes ``simulate-<workload>.json``.
3. ``breakdown``: where the queue forms. Four GPUs split 1P+3D, 2P+2D and 3P+1D (full reservation),
   SGLang's round robin + FCFS and least-predicted-work + SJF with OUTLETS r̂₀: the mean and P99 wait
   for a prefill instance, in the KV transfer and for a decode slot. Writes ``breakdown-<workload>.json``.
4. ``report``: ``report.md`` (every run: P99s, TTFT, TPOT, ITL, goodput); ``plot``:
   ``docs/figures/serving-study-<workload>-policies.png`` and ``-predictors.png``.

    .venv/bin/python benchmarks/serving_study_sharegpt.py    # ../shared needed once per workload
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from specforge_outlets.studies.committed_data import (
    AZURE_CONV_TRACE,
    LABEL_SET,
    SHAREGPT_CHATGPT_LENGTHS,
    REPO,
    SHAREGPT_PROMPTS,
    read_eval_record,
    shared,
)
from specforge_outlets.atomic import write_text_atomic
from specforge_outlets.demo.stages import written
from specforge_outlets.data.jsonl import write_jsonl
from specforge_outlets.scheduling import SchedulingConfig
from specforge_outlets.serving.metrics import parse_goodput
from specforge_outlets.serving.trace import (
    Trace,
    load_lengths,
    load_trace,
    poisson_arrival_times,
    synthetic_poisson,
)
from specforge_outlets.simulation.cluster import KVAdmission, PredictionPoint, load_cluster_config
from specforge_outlets.simulation.engine import Policy, Simulation
from specforge_outlets.simulation.predicted_lengths import with_measured_errors
from specforge_outlets.simulation.sglang_peers import queue_policy, routing_policy
from specforge_outlets.simulation.study import summarize

REQUESTS = os.path.join(LABEL_SET, "serving", "requests.jsonl")
CLUSTERS = {"1P+3D": "cluster-h100-1p3d.yaml", "colocated x4": "cluster-h100-colocated.yaml"}
# KV admission: by prediction in a cache small enough to bind, or SGLang's full max_new_tokens
# reservation in the GPU's cache (predictions then act through routing and order only)
ADMISSIONS = {"KV by prediction": KVAdmission.PREDICTED, "KV full reservation": KVAdmission.MAX_NEW_TOKENS}
MAX_NEW_TOKENS = 2048  # the label set's generation limit: a cut response ran this long
# (label, routing, queue, predictor) of SGLang's own policies, which need no prediction: its DP
# balancing (round_robin, total_tokens, total_requests = the core's least-requests) with FCFS, and its
# length-aware orders with round robin. lof sorts by max_new_tokens, which every request sets to the
# same cap, so it ties and serves FCFS (sglang_peers.py).
PEER_RUNS = [
    ("round-robin + fcfs", "round-robin", "fcfs", "none"),
    ("total-tokens + fcfs", "total-tokens", "fcfs", "none"),
    ("least-requests + fcfs", "least-requests", "fcfs", "none"),
    ("round-robin + lof", "round-robin", "lof", "none"),
    ("round-robin + shortest-prefill-first", "round-robin", "shortest-prefill-first", "none"),
    ("round-robin + hrrn", "round-robin", "hrrn", "none"),
]
# SLO targets of the goodput columns (as sglang.bench_serving --goodput): an interactive chat's
DEFAULT_SLO = ["ttft:5000", "tpot:100"]


# -- 1. workload ------------------------------------------------------------------------------------


def workload(args) -> None:
    if written(REQUESTS):
        return
    prompts_path = shared(SHAREGPT_PROMPTS, "the workload stage (prompt lengths, measured once, then committed)")
    from transformers import AutoTokenizer

    from specforge_outlets.data.chat_tokens import generation_prompt_ids
    from specforge_outlets.data.targets import ensure_smollm2

    tokenizer = AutoTokenizer.from_pretrained(str(ensure_smollm2()))
    prompts = {}
    with open(prompts_path) as handle:
        for line in handle:
            row = json.loads(line)
            prompts[row["id"]] = row["prompt"]
    rows = []
    for row in read_eval_record():
        ids = generation_prompt_ids(tokenizer, [{"role": "user", "content": prompts[row["id"]]}])
        rows.append({"id": row["id"], "input_length": len(ids), "output_length": int(row["true_output_len"]),
                     "censored": bool(row["censored"])})
    write_jsonl(REQUESTS, rows)
    print(f"wrote {REQUESTS} ({len(rows)} requests)")


# -- 2. simulate ------------------------------------------------------------------------------------


class Workload:
    """Requests at a rate, and every predictor's values for them."""

    name: str
    predictors: Tuple[str, ...]
    rates_rps: Tuple[float, ...]  # default loads: from well below to past saturation of both clusters

    def trace(self, rate_rps: float, count: int, seed: int) -> Trace:
        raise NotImplementedError

    def predictions(self, predictor: str, trace: Trace, seed: int) -> tuple:
        """(static predictions, trajectories or None) of ``predictor`` for the trace's requests."""
        if predictor == "none":
            return [None] * len(trace), None
        if predictor == "oracle":
            return trace.output_lens.astype(np.float64).tolist(), None
        return self.learned(predictor, trace, seed)

    def learned(self, predictor: str, trace: Trace, seed: int) -> tuple:
        """:meth:`predictions` of a learned predictor (one of ``predictors`` but none and the oracle)."""
        raise NotImplementedError


class LabelSetWorkload(Workload):
    """The method's own set-up: the label set's test requests with each predictor's measured values.

    Requests are resampled with replacement into a Poisson trace; a drawn request keeps its prompt
    length, output length, every predictor's r̂₀ and, for OUTLETS and the probes, r̂ₜ at every token.
    """

    name = "sharegpt-smollm2"
    predictors = ("none", "bert", "outlets r0", "outlets rt", "probe-mid rt", "oracle")
    rates_rps = (10.0, 20.0, 30.0, 40.0, 60.0, 80.0)

    def __init__(self, record: Optional[str] = None) -> None:
        """``record``: another ``outlets eval`` record of the same test requests (default: the committed one)."""
        with open(REQUESTS) as handle:
            requests = {row["id"]: row for row in map(json.loads, handle)}
        self.rows = read_eval_record(record) if record else read_eval_record()
        if record:  # another record may hold test requests the committed lengths do not: only the joined ones
            joined = [row for row in self.rows if row["id"] in requests]
            print(f"{record}: {len(joined)} of {len(self.rows)} requests have a prompt length in {REQUESTS}; "
                  "the others are left out", file=sys.stderr)
            self.rows = joined
        self.row_of = {row["id"]: index for index, row in enumerate(self.rows)}
        self.input_lens = np.array([requests[row["id"]]["input_length"] for row in self.rows])
        self.output_lens = np.array([int(row["true_output_len"]) for row in self.rows])

    def trace(self, rate_rps: float, count: int, seed: int) -> Trace:
        rng = np.random.default_rng(seed)
        drawn = rng.integers(0, len(self.rows), size=count)
        return Trace(f"{self.name}-{rate_rps:g}rps", [f"{self.rows[i]['id']}#{n}" for n, i in enumerate(drawn)],
                     poisson_arrival_times(rng, rate_rps, count), self.input_lens[drawn], self.output_lens[drawn])

    def learned(self, predictor: str, trace: Trace, seed: int) -> tuple:
        drawn = [self.row_of[request_id.rsplit("#", 1)[0]] for request_id in trace.ids]
        name, dynamic = predictor.split(" ")[0], predictor.endswith(" rt")
        static = [float(self.rows[i]["static"][name]) for i in drawn]
        if not dynamic:
            return static, None
        trajectories = [np.asarray(self.rows[i]["dynamic"][name], dtype=np.float64) for i in drawn]
        return [float(t[0]) for t in trajectories], trajectories


class LengthsWorkload(Workload):
    """Lengths from another source, each predictor's values with the errors it made on the label set.

    A lengths-only source has no predictions, so each request gets the true length times an error
    drawn from the same predictor's measured errors at a similar true length on the label set
    (``with_measured_errors``: it under-predicts long requests as OUTLETS does). Static r̂₀ only: a
    trajectory belongs to one response and does not carry over to another length.
    """

    predictors = ("none", "bert", "outlets r0", "oracle")

    def __init__(self, name: str, shared_file: str, recorded_arrivals: bool, rates_rps: Tuple[float, ...]) -> None:
        path = shared(shared_file, f"the {name} workload")
        self.name, self.rates_rps, self.recorded_arrivals = name, rates_rps, recorded_arrivals
        self.lengths = load_trace(path) if recorded_arrivals else load_lengths(path)
        rows = read_eval_record()
        self.measured_true = np.array([float(row["true_output_len"]) for row in rows])
        self.measured = {name: np.array([float(row["static"][name]) for row in rows]) for name in ("bert", "outlets")}

    def trace(self, rate_rps: float, count: int, seed: int) -> Trace:
        if not self.recorded_arrivals:  # Poisson arrivals, (prompt, output) pairs resampled
            return synthetic_poisson(self.lengths, rate_rps, count, seed)
        head = self.lengths.head(count)  # the recorded arrival pattern, bursts included, scaled to the rate
        return head.scaled(rate_rps / head.offered_rps)

    def learned(self, predictor: str, trace: Trace, seed: int) -> tuple:
        name = predictor.split(" ")[0]
        rng = np.random.default_rng([seed, self.predictors.index(predictor)])
        return with_measured_errors(self.measured_true, self.measured[name], trace.output_lens, rng).tolist(), None


def workloads() -> Dict[str, Callable[[], Workload]]:
    return {
        LabelSetWorkload.name: LabelSetWorkload,
        # ShareGPT with the original ChatGPT answers' lengths (12% at or above 800 tokens); its
        # prompts include the earlier turns of each conversation (mean 2,340 tokens)
        "sharegpt-chatgpt": lambda: LengthsWorkload(
            "sharegpt-chatgpt", SHAREGPT_CHATGPT_LENGTHS,
            recorded_arrivals=False, rates_rps=(4.0, 8.0, 12.0, 16.0, 20.0, 24.0)),
        # the control: almost no long outputs (99.8% under 800 tokens), so no order should move it
        "azure-conv": lambda: LengthsWorkload(
            "azure-conv", AZURE_CONV_TRACE,
            recorded_arrivals=True, rates_rps=(5.0, 10.0, 20.0, 30.0, 40.0, 60.0)),
    }


def run_one(work: Workload, trace: Trace, cluster, routing: str, queue: str, predictor: str, seed: int,
            cache: Dict[str, tuple]):
    """One simulated run of a policy with a predictor's values (``cache``: the trace's, by predictor)."""
    if predictor not in cache:
        cache[predictor] = work.predictions(predictor, trace, seed)
    predictions, trajectories = cache[predictor]
    policy = Policy(routing_policy(routing), queue_policy(queue))
    return Simulation(trace, predictions, cluster, policy, SchedulingConfig(), trajectories).run()


def runs_of(work: Workload) -> List[tuple]:
    """(label, routing, queue, predictor) of every run: SGLang's policies, then OUTLETS' with each predictor."""
    return PEER_RUNS + [(f"least-predicted-work + {queue} | {predictor}", "least-predicted-work", queue, predictor)
                        for queue in ("sjf", "tail-safe") for predictor in work.predictors]


def cluster_for(name: str, admission: KVAdmission, kv_capacity: int):
    config = load_cluster_config(os.path.join(REPO, "recipes", CLUSTERS[name]))
    return dataclasses.replace(config, kv_admission=admission, max_new_tokens=MAX_NEW_TOKENS,
                               kv_capacity_tokens=kv_capacity if admission is KVAdmission.PREDICTED else None,
                               predict_at=PredictionPoint.PREFILL)


def result_path(args, name: str, stage: str) -> str:
    return os.path.join(args.output, f"{stage}-{name}.json")


def pending(args, stage: str):
    """(name, output path, workload, rates) of each chosen workload whose ``stage`` output is not written yet."""
    for name in args.workloads:
        path = result_path(args, name, stage)
        if not written(path):
            work = workloads()[name]()
            yield name, path, work, args.rates or work.rates_rps


def simulate(args) -> None:
    slo = parse_goodput(args.slo)
    for name, path, work, rates in pending(args, "simulate"):
        rows = []
        for cluster_name, admission_name in itertools.product(CLUSTERS, ADMISSIONS):
            cluster = cluster_for(cluster_name, ADMISSIONS[admission_name], args.kv_capacity)
            setup = f"{cluster_name}, {admission_name}"
            for rate in rates:
                trace = work.trace(rate, args.requests, args.seed)
                cache: Dict[str, tuple] = {}
                for label, routing, queue, predictor in runs_of(work):
                    started = time.perf_counter()
                    result = run_one(work, trace, cluster, routing, queue, predictor, args.seed, cache)
                    metrics = summarize(result, args.short_threshold, slo)
                    rows.append({"setup": setup, "kv_capacity_tokens": cluster.kv_capacity(), "rate_rps": rate,
                                 "run": label, "routing": routing, "queue": queue, "predictor": predictor,
                                 "metrics": metrics, "retractions": int(result.retractions.sum()),
                                 "sim_wall_s": time.perf_counter() - started})
                    print(f"{name} {setup:34s} {rate:5g} rps  {label:48s} short P99 "
                          f"{metrics['short']['e2e_p99_s']:7.2f} s  all P99 {metrics['all']['e2e_p99_s']:7.2f} s  "
                          f"thr {metrics['all']['throughput_tok_s']:7.0f}  retractions {rows[-1]['retractions']}",
                          flush=True)
        result = {"command": "python benchmarks/serving_study_sharegpt.py " + " ".join(sys.argv[1:]),
                  "workload": name, "requests": args.requests, "rates_rps": list(rates),
                  "kv_capacity_tokens": args.kv_capacity, "max_new_tokens": MAX_NEW_TOKENS,
                  "short_threshold": args.short_threshold, "slo_s": slo, "seed": args.seed,
                  "scheduling": dataclasses.asdict(SchedulingConfig()), "rows": rows}
        write_text_atomic(path, json.dumps(result, indent=1))


# -- 3. where the queue forms -----------------------------------------------------------------------

SPLITS = (1, 2, 3)  # prefill instances of four GPUs; the rest decode
BREAKDOWN_RUNS = [("round-robin + fcfs", "round-robin", "fcfs", "none"),
                  ("least-predicted-work + sjf | outlets r0", "least-predicted-work", "sjf", "outlets r0")]
WAITS = ("prefill_queue", "transfer", "decode_queue")


def breakdown(args) -> None:
    for name, path, work, rates in pending(args, "breakdown"):
        base = cluster_for("1P+3D", KVAdmission.MAX_NEW_TOKENS, args.kv_capacity)
        rows = []
        for prefill in SPLITS:
            cluster = dataclasses.replace(base, prefill_instances=prefill, decode_instances=4 - prefill)
            for rate in rates:
                trace = work.trace(rate, args.requests, args.seed)
                cache: Dict[str, tuple] = {}
                for label, routing, queue, predictor in BREAKDOWN_RUNS:
                    metrics = summarize(run_one(work, trace, cluster, routing, queue, predictor, args.seed, cache),
                                        args.short_threshold)
                    rows.append({"split": f"{prefill}P+{4 - prefill}D", "rate_rps": rate, "run": label,
                                 "metrics": metrics})
                    waits = "  ".join(f"{wait} {metrics['all'][wait + '_mean_s']:6.2f}/"
                                      f"{metrics['all'][wait + '_p99_s']:6.2f}" for wait in WAITS)
                    print(f"{name} {prefill}P+{4 - prefill}D {rate:5g} rps {label:42s} {waits}  short P99 "
                          f"{metrics['short']['e2e_p99_s']:7.2f}", flush=True)
        write_text_atomic(path, json.dumps({"workload": name, "requests": args.requests, "rates_rps": list(rates),
                                            "rows": rows}, indent=1))


# -- 4. report and plot -----------------------------------------------------------------------------


def stage_results(args, stage: str) -> List[dict]:
    """The stage's results of the chosen workloads that exist."""
    results = []
    for name in args.workloads:
        path = result_path(args, name, stage)
        if os.path.exists(path):
            with open(path) as handle:
                results.append(json.load(handle))
    return results


# The plugin's default when the study ran (--schedule-policy outlets: tail-safe, KV admission by the charge,
# predicted, where the setup has it; SGLang's own admission is the default now) with the deployed predictor, and
# what it is measured against: SGLang's default.
DEFAULT_RUN = "least-predicted-work + tail-safe | outlets r0"
BASELINE_RUN = "round-robin + fcfs"
# The controlled study: the order fixed, the predictor varied; the share of the oracle's gain.
SHARE_PREDICTORS = ("bert", "outlets r0", "outlets rt", "probe-mid rt")
MIN_ORACLE_GAIN = 0.1  # of no prediction's short P99: below it the share is not reported


def metric_of(result: dict, setup: str, rate: float, run: str) -> dict:
    return next(row["metrics"] for row in result["rows"]
                if row["setup"] == setup and row["rate_rps"] == rate and row["run"] == run)


def default_table(result: dict) -> List[str]:
    """The default against SGLang's round robin + FCFS at every load: short P99, long P99, throughput ratios."""
    rates = result["rates_rps"]
    lines = [f"## {result['workload']}: the default ({DEFAULT_RUN}) against {BASELINE_RUN}", "",
             "short P99 / long P99 / throughput, each as a ratio to the baseline's", "",
             "| setup | " + " | ".join(f"{rate:g} rps" for rate in rates) + " |",
             "|---|" + "---:|" * len(rates)]
    for setup in dict.fromkeys(row["setup"] for row in result["rows"]):
        cells = []
        for rate in rates:
            ours, base = metric_of(result, setup, rate, DEFAULT_RUN), metric_of(result, setup, rate, BASELINE_RUN)
            cells.append(" / ".join(f"{ours[c][key] / base[c][key]:.2f}" for c, key in
                                    (("short", "e2e_p99_s"), ("long", "e2e_p99_s"), ("all", "throughput_tok_s"))))
        lines.append(f"| {setup} | " + " | ".join(cells) + " |")
    return lines + [""]


def oracle_share_table(result: dict) -> List[str]:
    """Per setup and load, the share of the oracle's short-P99 gain over no prediction that each predictor realises."""
    predictors = [p for p in SHARE_PREDICTORS if p in workloads_predictors(result)]
    lines = [f"## {result['workload']}: share of the oracle's gain in short P99, (none - p) / (none - oracle)", "",
             "| setup | queue | requests/s | none s | oracle s | " + " | ".join(predictors) + " |",
             "|---|---|---:|---:|---:|" + "---:|" * len(predictors)]
    for setup in dict.fromkeys(row["setup"] for row in result["rows"]):
        for queue in ("sjf", "tail-safe"):
            for rate in result["rates_rps"]:
                p99 = {p: metric_of(result, setup, rate, f"least-predicted-work + {queue} | {p}")["short"]["e2e_p99_s"]
                       for p in ("none", "oracle", *predictors)}
                gain = p99["none"] - p99["oracle"]
                # a share of a gain within the noise says nothing: only where the oracle gains 10% or more
                shares = [f"{(p99['none'] - p99[p]) / gain:.0%}" if gain >= MIN_ORACLE_GAIN * p99["none"] else "-"
                          for p in predictors]
                lines.append(f"| {setup} | {queue} | {rate:g} | {p99['none']:.1f} | {p99['oracle']:.1f} | "
                             + " | ".join(shares) + " |")
    return lines + [""]


def report(args) -> None:
    lines, simulated = [], stage_results(args, "simulate")
    for result in simulated:
        lines += default_table(result) + oracle_share_table(result)
    for result in simulated:
        lines += study_tables(result)
    for result in stage_results(args, "breakdown"):
        lines += breakdown_table(result)
    path = os.path.join(args.output, "report.md")
    write_text_atomic(path, "\n".join(lines) + "\n")
    print(f"wrote {path}")


def escaped(label: str) -> str:
    """A run label as a markdown table cell (its ``|`` would split the cell)."""
    return label.replace("|", "\\|")


def breakdown_table(result: dict) -> List[str]:
    lines = [f"## {result['workload']}: where the queue forms (four GPUs, full reservation)", "",
             "Mean / P99 seconds per request: waiting for a prefill instance, in the KV transfer, waiting for "
             "a decode slot; and short requests' P99 end-to-end latency.", "",
             "| split | requests/s | run | prefill queue | transfer | decode queue | short P99 e2e |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for row in result["rows"]:
        m = row["metrics"]["all"]
        waits = " | ".join(f"{m[name + '_mean_s']:.2f} / {m[name + '_p99_s']:.2f}" for name in WAITS)
        lines.append(f"| {row['split']} | {row['rate_rps']:g} | {escaped(row['run'])} | {waits} | "
                     f"{row['metrics']['short']['e2e_p99_s']:.2f} |")
    return lines + [""]


def study_tables(result: dict) -> List[str]:
    slo = ", ".join(f"{name.upper()} {1e3 * seconds:g} ms" for name, seconds in result["slo_s"].items())
    lines = [f"# Serving study: {result['workload']}", "", f"`{result['command']}`", "",
             f"{result['requests']} requests per run; max_new_tokens {result['max_new_tokens']}; KV tokens per "
             f"instance: {result['kv_capacity_tokens']} with KV admission by prediction, the GPU's with the full "
             f"reservation; short = fewer than {result['short_threshold']} output tokens. Latencies in seconds; "
             f"goodput: requests per second within every SLO ({slo}).", ""]
    for setup in dict.fromkeys(row["setup"] for row in result["rows"]):
        for rate in result["rates_rps"]:
            rows = [row for row in result["rows"] if row["setup"] == setup and row["rate_rps"] == rate]
            lines += [f"## {result['workload']}: {setup}, {rate:g} requests/s", "",
                      "| run | short P99 e2e | short P50 e2e | long P99 e2e | all P99 e2e | TTFT P99 | TPOT P99 | "
                      "ITL P99 | throughput tok/s | goodput rps (short) | retractions |",
                      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
            for row in rows:
                m = row["metrics"]
                lines.append(f"| {escaped(row['run'])} | {m['short']['e2e_p99_s']:.2f} | {m['short']['e2e_p50_s']:.2f} | "
                             f"{m['long']['e2e_p99_s']:.2f} | {m['all']['e2e_p99_s']:.2f} | "
                             f"{m['all']['ttft_p99_s']:.2f} | {m['all']['tpot_p99_s']:.3f} | {m['all']['itl_p99_s']:.3f} | "
                             f"{m['all']['throughput_tok_s']:.0f} | {m['all']['goodput_rps']:.2f} "
                             f"({m['short']['goodput_rps']:.2f}) | {row['retractions']} |")
            lines.append("")
    return lines


def curves(ax, result: dict, setup: str, runs: List[str], metric: Callable[[dict], float]) -> None:
    """One line per run of the setup: ``metric`` of its rows against load."""
    for index, label in enumerate(runs):
        rows = sorted((row for row in result["rows"] if row["setup"] == setup and row["run"] == label),
                      key=lambda row: row["rate_rps"])
        if rows:
            outlets = label.startswith("least-predicted-work")
            ax.plot([row["rate_rps"] for row in rows], [metric(row["metrics"]) for row in rows],
                    "-" if outlets else ":", marker="o" if outlets else "s", color=f"C{index % 10}",
                    label=label.replace("least-predicted-work", "lpw"))


def plot(args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("short P99 e2e (s)", lambda m: m["short"]["e2e_p99_s"], True),
              ("long P99 e2e (s)", lambda m: m["long"]["e2e_p99_s"], True),
              ("throughput (tok/s)", lambda m: m["all"]["throughput_tok_s"], False)]
    for result in stage_results(args, "simulate"):
        name = result["workload"]
        setups = list(dict.fromkeys(row["setup"] for row in result["rows"]))
        figures = {  # every policy with OUTLETS' deployed r̂₀; and, for the method's workload, the predictors
            "policies": [label for label, *_ in PEER_RUNS]
            + [f"least-predicted-work + {queue} | outlets r0" for queue in ("sjf", "tail-safe")],
            "predictors": [f"least-predicted-work + sjf | {predictor}"
                           for predictor in workloads_predictors(result)] + ["round-robin + fcfs"],
        }
        for kind, runs in figures.items():
            fig, axes = plt.subplots(len(setups), len(panels), figsize=(15, 3.2 * len(setups)), squeeze=False)
            for row_axes, setup in zip(axes, setups):
                for ax, (ylabel, metric, log) in zip(row_axes, panels):
                    curves(ax, result, setup, runs, metric)
                    ax.set_title(f"{setup}: {ylabel}", fontsize=8)
                    ax.set_xlabel("requests/s", fontsize=8)
                    if log:
                        ax.set_yscale("log")
            axes[0][0].legend(fontsize=6)
            fig.suptitle(f"{name}: {'policies (OUTLETS r̂₀)' if kind == 'policies' else 'predictors (lpw + sjf)'}")
            fig.tight_layout()
            path = os.path.join(REPO, "docs", "figures", f"serving-study-{name}-{kind}.png")
            fig.savefig(path, dpi=100)
            plt.close(fig)
            print(f"wrote {path}")


def workloads_predictors(result: dict) -> List[str]:
    return list(dict.fromkeys(row["predictor"] for row in result["rows"] if row["routing"] == "least-predicted-work"))


STAGES = {"workload": workload, "simulate": simulate, "breakdown": breakdown, "report": report, "plot": plot}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", default=os.path.join(REPO, "benchmarks", "data", "serving-study"))
    parser.add_argument("--workloads", nargs="+", choices=list(workloads()), default=list(workloads()))
    parser.add_argument("--stages", nargs="+", choices=list(STAGES), default=list(STAGES))
    parser.add_argument("--rates", type=float, nargs="+", help="requests/s (default: each workload's own)")
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--kv-capacity", type=int, default=100_000, help="KV tokens per instance")
    parser.add_argument("--short-threshold", type=int, default=800)
    parser.add_argument("--slo", nargs="+", default=DEFAULT_SLO, metavar="METRIC:MS", help="goodput targets")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for stage in args.stages:
        STAGES[stage](args)

