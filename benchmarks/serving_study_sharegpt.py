"""Serving study on the method's own workload: ShareGPT prompts, SmolLM2's own output lengths, and every
predictor's estimates for the same requests, with re-prediction (r̂ₜ) against the static r̂₀ (issue 13).

The label set's test split (``benchmarks/data/sharegpt-smollm2/``: 595 first-turn prompts answered by
SmolLM2-135M-Instruct, 92 cut at 2,048 tokens) and its evaluation's per-request predictions
(``eval/predictions.jsonl.gz``: static r̂₀ and, for OUTLETS and the probes, the estimate at every
output token) drive the simulator. Requests are resampled with replacement into a Poisson trace at
each rate; a resampled request keeps its prompt length, output length and every predictor's values.

Stages, each resumable (its output is kept and skipped):

1. ``workload``: each test request's chat-prompt length (SmolLM2's tokenizer on the first turn, read
   from ../shared/data/prompts/, never copied) next to its output length, written to
   ``benchmarks/data/sharegpt-smollm2/serving/requests.jsonl`` (committed: lengths only).
2. ``simulate``: per cluster, KV admission and rate, the policies with the predictors varied.
   Clusters: the method's 1 prefill + 3 decode (``recipes/cluster-h100-1p3d.yaml``) and 4 colocated
   instances (``recipes/cluster-h100-colocated.yaml`` predicting at prefill, as the draft does). KV
   admission: by prediction with ``--kv-capacity`` tokens per instance, so that the cache binds; or
   the full ``max_new_tokens`` reservation in the GPU's own cache, where predictions act through
   routing and the queue order only.
   Predictors: none (the prior), the best static baseline (``bert``, lowest static MAE), OUTLETS r̂₀
   (static, what the method deploys), OUTLETS r̂ₜ (its estimate re-read after every token, as the
   plugin's EAGLE-3 mode does), the best dynamic predictor (``probe-mid``, a probe on the target's
   hidden states) and the oracle. Writes ``result.json`` and ``report.md`` under ``--output``.
3. ``breakdown``: where the queue forms. Four GPUs split 1P+3D, 2P+2D and 3P+1D (full reservation,
   the GPU's cache), SGLang's round robin + FCFS and least-predicted-work + SJF with OUTLETS r̂₀: the
   mean and P99 wait for a prefill instance, in the KV transfer and for a decode slot, per rate.
   Writes ``breakdown.json``.
4. ``report``: ``report.md``; ``plot``: ``docs/figures/serving-study-sharegpt.png``.

    .venv/bin/python benchmarks/serving_study_sharegpt.py
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import itertools
import json
import os
import sys
import time
from typing import Dict, List

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from specforge_outlets.atomic import write_text_atomic  # noqa: E402
from specforge_outlets.data.jsonl import write_jsonl  # noqa: E402
from specforge_outlets.scheduling import SchedulingConfig  # noqa: E402
from specforge_outlets.serving.trace import Trace, poisson_arrival_times  # noqa: E402
from specforge_outlets.simulation.cluster import KVAdmission, PredictionPoint, load_cluster_config  # noqa: E402
from specforge_outlets.simulation.engine import Policy, Simulation  # noqa: E402
from specforge_outlets.simulation.sglang_peers import queue_policy, routing_policy  # noqa: E402
from specforge_outlets.simulation.study import summarize  # noqa: E402

LABEL_SET = os.path.join(REPO, "benchmarks", "data", "sharegpt-smollm2")
PREDICTIONS = os.path.join(LABEL_SET, "eval", "predictions.jsonl.gz")
REQUESTS = os.path.join(LABEL_SET, "serving", "requests.jsonl")
SHARED = os.environ.get("OUTLETS_SHARED_DIR", os.path.join(REPO, "..", "shared"))
PROMPTS = os.path.join(SHARED, "data", "prompts", "sharegpt_first_turn_2978.jsonl")
FIGURE = os.path.join(REPO, "docs", "figures", "serving-study-sharegpt.png")
CLUSTERS = {"1P+3D": "cluster-h100-1p3d.yaml", "colocated x4": "cluster-h100-colocated.yaml"}
# KV admission: by prediction in a cache small enough to bind, or SGLang's full max_new_tokens
# reservation in the GPU's cache (predictions then act through routing and order only)
ADMISSIONS = {"KV by prediction": KVAdmission.PREDICTED, "KV full reservation": KVAdmission.MAX_NEW_TOKENS}
MAX_NEW_TOKENS = 2048  # the label set's generation limit: a cut response ran this long
# (label, routing, queue, predictor); predictor None: the policy needs no prediction
RUNS = [
    ("round-robin + fcfs", "round-robin", "fcfs", None),
    ("total-tokens + fcfs", "total-tokens", "fcfs", None),
] + [(f"least-predicted-work + {queue} | {predictor}", "least-predicted-work", queue, predictor)
     for queue in ("sjf", "tail-safe")
     for predictor in ("none", "bert", "outlets r0", "outlets rt", "probe-mid rt", "oracle")]


# -- 1. workload ------------------------------------------------------------------------------------


def read_label_set_predictions() -> List[dict]:
    with gzip.open(PREDICTIONS, "rt") as handle:
        return [json.loads(line) for line in handle]


def already_written(path: str) -> bool:
    """A stage whose output exists is skipped (delete the file to run it again)."""
    if os.path.exists(path):
        print(f"skip (exists): {path}")
        return True
    return False


def workload(args) -> None:
    if already_written(REQUESTS):
        return
    if not os.path.exists(PROMPTS):
        raise SystemExit(f"{PROMPTS} is missing: the prompt lengths are measured once on the shared ShareGPT "
                         "prompts (set OUTLETS_SHARED_DIR), then committed")
    from transformers import AutoTokenizer

    from specforge_outlets.data.chat_tokens import generation_prompt_ids
    from specforge_outlets.data.targets import ensure_smollm2

    tokenizer = AutoTokenizer.from_pretrained(str(ensure_smollm2()))
    prompts = {}
    with open(PROMPTS) as handle:
        for line in handle:
            row = json.loads(line)
            prompts[row["id"]] = row["prompt"]
    rows = []
    for row in read_label_set_predictions():
        ids = generation_prompt_ids(tokenizer, [{"role": "user", "content": prompts[row["id"]]}])
        rows.append({"id": row["id"], "input_length": len(ids), "output_length": int(row["true_output_len"]),
                     "censored": bool(row["censored"])})
    write_jsonl(REQUESTS, rows)
    print(f"wrote {REQUESTS} ({len(rows)} requests)")


# -- 2. simulate ------------------------------------------------------------------------------------


class Workload:
    """The test requests with every predictor's static value and trajectory, by row."""

    def __init__(self) -> None:
        with open(REQUESTS) as handle:
            requests = {row["id"]: row for row in map(json.loads, handle)}
        self.rows = read_label_set_predictions()
        self.input_lens = np.array([requests[row["id"]]["input_length"] for row in self.rows])
        self.output_lens = np.array([int(row["true_output_len"]) for row in self.rows])

    def trace(self, rate_rps: float, count: int, seed: int) -> tuple:
        """A Poisson trace of ``count`` requests resampled from the rows, and the rows it drew."""
        rng = np.random.default_rng(seed)
        drawn = rng.integers(0, len(self.rows), size=count)
        trace = Trace(f"sharegpt-smollm2-{rate_rps:g}rps", [f"{self.rows[i]['id']}#{n}" for n, i in enumerate(drawn)],
                      poisson_arrival_times(rng, rate_rps, count), self.input_lens[drawn], self.output_lens[drawn])
        return trace, drawn

    def run(self, trace: Trace, drawn: np.ndarray, cluster, routing: str, queue: str, predictor: str,
            cache: Dict[str, tuple]):
        """One simulated run of a policy with a predictor's values (``cache``: the trace's, by predictor)."""
        if predictor not in cache:
            cache[predictor] = self.predictions(predictor, drawn)
        predictions, trajectories = cache[predictor]
        policy = Policy(routing_policy(routing), queue_policy(queue))
        return Simulation(trace, predictions, cluster, policy, SchedulingConfig(), trajectories).run()

    def predictions(self, predictor: str, drawn: np.ndarray) -> tuple:
        """(static predictions, trajectories or None) of ``predictor`` for the drawn rows."""
        if predictor == "none":
            return [None] * len(drawn), None
        if predictor == "oracle":
            return [float(self.output_lens[i]) for i in drawn], None
        name, dynamic = predictor.split(" ")[0], predictor.endswith(" rt")
        static = [float(self.rows[i]["static"][name]) for i in drawn]
        if not dynamic:
            return static, None
        trajectories = [np.asarray(self.rows[i]["dynamic"][name], dtype=np.float64) for i in drawn]
        return [float(t[0]) for t in trajectories], trajectories


def cluster_for(name: str, admission: KVAdmission, kv_capacity: int):
    config = load_cluster_config(os.path.join(REPO, "recipes", CLUSTERS[name]))
    return dataclasses.replace(config, kv_admission=admission, max_new_tokens=MAX_NEW_TOKENS,
                               kv_capacity_tokens=kv_capacity if admission is KVAdmission.PREDICTED else None,
                               predict_at=PredictionPoint.PREFILL)


def simulate(args) -> None:
    path = os.path.join(args.output, "result.json")
    if already_written(path):
        return
    work = Workload()
    rows = []
    for cluster_name, admission_name in itertools.product(CLUSTERS, ADMISSIONS):
        cluster = cluster_for(cluster_name, ADMISSIONS[admission_name], args.kv_capacity)
        setup = f"{cluster_name}, {admission_name}"
        for rate in args.rates:
            trace, drawn = work.trace(rate, args.requests, args.seed)
            cache: Dict[str, tuple] = {}
            for label, routing, queue, predictor in RUNS:
                predictor = predictor or "none"
                started = time.perf_counter()
                result = work.run(trace, drawn, cluster, routing, queue, predictor, cache)
                metrics = summarize(result, args.short_threshold)
                rows.append({"setup": setup, "kv_capacity_tokens": cluster.kv_capacity(), "rate_rps": rate,
                             "run": label, "routing": routing,
                             "queue": queue, "predictor": predictor, "metrics": metrics,
                             "retractions": int(result.retractions.sum()), "sim_wall_s": time.perf_counter() - started})
                print(f"{setup:34s} {rate:5g} rps  {label:48s} short P99 {metrics['short']['e2e_p99_s']:7.2f} s  "
                      f"all P99 {metrics['all']['e2e_p99_s']:7.2f} s  thr {metrics['all']['throughput_tok_s']:7.0f}  "
                      f"retractions {rows[-1]['retractions']}", flush=True)
    result = {"command": "python benchmarks/serving_study_sharegpt.py " + " ".join(sys.argv[1:]),
              "requests": args.requests, "rates_rps": args.rates, "kv_capacity_tokens": args.kv_capacity,
              "max_new_tokens": MAX_NEW_TOKENS, "short_threshold": args.short_threshold, "seed": args.seed,
              "scheduling": dataclasses.asdict(SchedulingConfig()), "rows": rows}
    write_text_atomic(path, json.dumps(result, indent=1))


# -- 3. where the queue forms -----------------------------------------------------------------------

SPLITS = (1, 2, 3)  # prefill instances of four GPUs; the rest decode
BREAKDOWN_RUNS = [("round-robin + fcfs", "round-robin", "fcfs", "none"),
                  ("least-predicted-work + sjf | outlets r0", "least-predicted-work", "sjf", "outlets r0")]
WAITS = ("prefill_queue", "transfer", "decode_queue")


def breakdown(args) -> None:
    path = os.path.join(args.output, "breakdown.json")
    if already_written(path):
        return
    work = Workload()
    base = cluster_for("1P+3D", KVAdmission.MAX_NEW_TOKENS, args.kv_capacity)
    rows = []
    for prefill in SPLITS:
        cluster = dataclasses.replace(base, prefill_instances=prefill, decode_instances=4 - prefill)
        for rate in args.breakdown_rates:
            trace, drawn = work.trace(rate, args.requests, args.seed)
            cache: Dict[str, tuple] = {}
            for label, routing, queue, predictor in BREAKDOWN_RUNS:
                metrics = summarize(work.run(trace, drawn, cluster, routing, queue, predictor, cache),
                                    args.short_threshold)
                rows.append({"split": f"{prefill}P+{4 - prefill}D", "rate_rps": rate, "run": label, "metrics": metrics})
                waits = "  ".join(f"{name} {metrics['all'][name + '_mean_s']:6.2f}/{metrics['all'][name + '_p99_s']:6.2f}"
                                  for name in WAITS)
                print(f"{prefill}P+{4 - prefill}D {rate:5g} rps {label:42s} {waits}  short P99 "
                      f"{metrics['short']['e2e_p99_s']:7.2f}", flush=True)
    write_text_atomic(path, json.dumps({"requests": args.requests, "rates_rps": args.breakdown_rates, "rows": rows},
                                       indent=1))


# -- 4. report and plot -----------------------------------------------------------------------------


def report(args) -> None:
    with open(os.path.join(args.output, "result.json")) as handle:
        result = json.load(handle)
    lines = study_tables(result)
    path = os.path.join(args.output, "breakdown.json")
    if os.path.exists(path):
        with open(path) as handle:
            lines += breakdown_table(json.load(handle))
    with open(os.path.join(args.output, "report.md"), "w") as handle:
        handle.write("\n".join(lines) + "\n")
    print(f"wrote {os.path.join(args.output, 'report.md')}")


def breakdown_table(result: dict) -> List[str]:
    lines = ["## Where the queue forms (four GPUs, full reservation)", "",
             "Mean / P99 seconds per request: waiting for a prefill instance, in the KV transfer, waiting for "
             "a decode slot; and short requests' P99 end-to-end latency.", "",
             "| split | requests/s | run | prefill queue | transfer | decode queue | short P99 e2e |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for row in result["rows"]:
        m = row["metrics"]["all"]
        waits = " | ".join(f"{m[name + '_mean_s']:.2f} / {m[name + '_p99_s']:.2f}" for name in WAITS)
        lines.append(f"| {row['split']} | {row['rate_rps']:g} | {row['run']} | {waits} | "
                     f"{row['metrics']['short']['e2e_p99_s']:.2f} |")
    return lines + [""]


def study_tables(result: dict) -> List[str]:
    lines = ["# Serving study: ShareGPT x SmolLM2 with learned predictions", "", f"`{result['command']}`", "",
             f"{result['requests']} requests per run resampled from the label set's 595 test requests, Poisson "
             f"arrivals; max_new_tokens {result['max_new_tokens']}; KV tokens per instance: "
             f"{result['kv_capacity_tokens']} with KV admission by prediction, the GPU's with the full reservation; "
             f"short = fewer than {result['short_threshold']} output tokens. Latencies in seconds.", ""]
    for setup in dict.fromkeys(row["setup"] for row in result["rows"]):
        for rate in result["rates_rps"]:
            rows = [row for row in result["rows"] if row["setup"] == setup and row["rate_rps"] == rate]
            if not rows:
                continue
            lines += [f"## {setup}, {rate:g} requests/s", "",
                      "| run | short P99 e2e | short P50 e2e | long P99 e2e | all P99 e2e | TTFT P99 | throughput tok/s | "
                      "retractions |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
            for row in rows:
                m = row["metrics"]
                lines.append(f"| {row['run']} | {m['short']['e2e_p99_s']:.2f} | {m['short']['e2e_p50_s']:.2f} | "
                             f"{m['long']['e2e_p99_s']:.2f} | {m['all']['e2e_p99_s']:.2f} | {m['all']['ttft_p99_s']:.2f} | "
                             f"{m['all']['throughput_tok_s']:.0f} | {row['retractions']} |")
            lines.append("")
    return lines



def plot(args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(os.path.join(args.output, "result.json")) as handle:
        result = json.load(handle)
    predictors = ["none", "bert", "outlets r0", "outlets rt", "probe-mid rt", "oracle"]
    setups = list(dict.fromkeys(row["setup"] for row in result["rows"]))
    columns = 2
    fig, axes = plt.subplots((len(setups) + columns - 1) // columns, columns, figsize=(11, 8), squeeze=False,
                             sharey=True)
    for ax, setup in zip(axes.flat, setups):
        for predictor in predictors:  # the order fixed (sjf), the predictor varied
            rows = sorted((row for row in result["rows"] if row["setup"] == setup and row["queue"] == "sjf"
                           and row["routing"] == "least-predicted-work" and row["predictor"] == predictor),
                          key=lambda row: row["rate_rps"])
            ax.plot([row["rate_rps"] for row in rows], [row["metrics"]["short"]["e2e_p99_s"] for row in rows],
                    "--" if predictor.endswith(" rt") else "-", marker="o", label=f"lpw + sjf | {predictor}")
        for label in ("round-robin + fcfs", "total-tokens + fcfs"):
            rows = sorted((row for row in result["rows"] if row["setup"] == setup and row["run"] == label),
                          key=lambda row: row["rate_rps"])
            ax.plot([row["rate_rps"] for row in rows], [row["metrics"]["short"]["e2e_p99_s"] for row in rows], ":",
                    color="black" if label.startswith("round") else "gray", marker="s", label=label)
        ax.set_title(setup, fontsize=9)
        ax.set_xlabel("requests/s")
        ax.set_yscale("log")
    for row in axes:
        row[0].set_ylabel("short requests' P99 e2e latency (s)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(FIGURE), exist_ok=True)
    fig.savefig(FIGURE, dpi=120)
    print(f"wrote {FIGURE}")


STAGES = {"workload": workload, "simulate": simulate, "breakdown": breakdown, "report": report, "plot": plot}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", default=os.path.join(LABEL_SET, "serving"))
    parser.add_argument("--stages", nargs="+", choices=list(STAGES), default=list(STAGES))
    parser.add_argument("--rates", type=float, nargs="+", default=[10.0, 20.0, 30.0, 40.0, 60.0, 80.0])
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--breakdown-rates", type=float, nargs="+", default=[20.0, 40.0, 60.0, 80.0])
    parser.add_argument("--kv-capacity", type=int, default=100_000, help="KV tokens per instance")
    parser.add_argument("--short-threshold", type=int, default=800)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for stage in args.stages:
        STAGES[stage](args)


if __name__ == "__main__":
    main()
