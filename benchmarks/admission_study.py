"""The serving study's colocated runs under five KV admissions, every ratio against SGLang's own.

A workload of ``serving_study_sharegpt.py`` (``--workload``: the label set's, ``sharegpt-chatgpt`` or
``azure-conv``, with that study's clusters and runs: SGLang's prediction-free policies and the
plugin's default when it ran, least-predicted-work + tail-safe, with no prediction and with OUTLETS r̂₀; the
other two workloads' r̂₀ carry the errors OUTLETS made on the label set) on 4 colocated H100
instances of 100,000 KV tokens each,
under ``kv_admission`` ``max-new-tokens`` (the full reservation, the study's old baseline),
``sglang`` (SGLang 0.5.23's own, ``simulation/sglang_admission.py``) and ``predicted`` (the plugin's
KV by prediction: SGLang's rounds with a predicted request charged its prediction, a request without
one, or before its r̂₀ at prefill, charged as SGLang charges it), and as further baselines ``vllm``
(vLLM 0.34.0's own, ``simulation/vllm_admission.py``) and ``vllm-0.13`` (vLLM v0.13's, the paper's
baseline) under vLLM's default, round robin + FCFS only (vLLM's admission models its FCFS
scheduler). Every ratio is to SGLang's default, round robin + FCFS under SGLang's admission; the
report also gives the plugin's default and SGLang's as ratios to each vLLM version's. Colocated
only: neither engine's admission is modelled on disaggregated decode instances.
Writes ``<workload>-colocated.json`` and ``report.md``, one section for each workload written so far.

    .venv/bin/python benchmarks/admission_study.py                           # the label set's, about 2 minutes on one core
    .venv/bin/python benchmarks/admission_study.py --workload azure-conv     # ../shared needed
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from specforge_outlets.atomic import write_text_atomic
from specforge_outlets.simulation.cluster import KVAdmission
from specforge_outlets.simulation.study import summarize
from specforge_outlets.studies import sharegpt_serving as study

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CLUSTER = "colocated x4"
KV_CAPACITY = 100_000  # per instance, as the serving study's KV-bound set-up
ADMISSIONS = {"full reservation": KVAdmission.MAX_NEW_TOKENS, "sglang": KVAdmission.SGLANG,
              "predicted": KVAdmission.PREDICTED, "vllm": KVAdmission.VLLM, "vllm-0.13": KVAdmission.VLLM_0_13}
RUNS = study.PEER_RUNS + [(f"least-predicted-work + tail-safe | {p}", "least-predicted-work", "tail-safe", p)
                          for p in ("none", "outlets r0")]
BASELINE = ("sglang", "round-robin + fcfs")  # SGLang's default with SGLang's admission
VLLM_RUN = "round-robin + fcfs"  # vLLM's default, the only run under vLLM's admissions
# vLLM's admissions, as the report names them: 0.34.0's, and v0.13's, the paper's baseline
VLLM_BASELINES = {"vllm": "vLLM", "vllm-0.13": "vLLM v0.13"}
DEFAULT = ("predicted", "least-predicted-work + tail-safe | outlets r0")  # the plugin's default when the study ran


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", choices=list(study.workloads()), default=study.LabelSetWorkload.name)
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--rates", type=float, nargs="+", help="requests/s (default: the workload's own)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=os.path.join(REPO, "benchmarks", "data", "admission-study"))
    args = parser.parse_args()
    work = study.workloads()[args.workload]()
    rates = args.rates or list(work.rates_rps)
    rows = []
    for admission_name, admission in ADMISSIONS.items():
        cluster = dataclasses.replace(study.cluster_for(CLUSTER, KVAdmission.PREDICTED, KV_CAPACITY), kv_admission=admission)
        for rate in rates:
            trace, cache = work.trace(rate, args.requests, args.seed), {}
            for label, routing, queue, predictor in runs_under(admission_name):
                started = time.perf_counter()
                result = study.run_one(work, trace, cluster, routing, queue, predictor, args.seed, cache)
                metrics = summarize(result, 800)
                rows.append({"admission": admission_name, "rate_rps": rate, "run": label,
                             "short_p99_s": metrics["short"]["e2e_p99_s"], "long_p99_s": metrics["long"]["e2e_p99_s"],
                             "throughput_tok_s": metrics["all"]["throughput_tok_s"],
                             "retractions": int(result.retractions.sum()), "sim_wall_s": time.perf_counter() - started})
                print(f"{admission_name:17s} {rate:4g} rps {label:48s} short P99 {rows[-1]['short_p99_s']:7.2f} s  "
                      f"retractions {rows[-1]['retractions']}", flush=True)
    os.makedirs(args.output, exist_ok=True)
    result = {"command": "python benchmarks/admission_study.py " + " ".join(sys.argv[1:]), "workload": args.workload,
              "cluster": CLUSTER, "kv_capacity_tokens": KV_CAPACITY, "requests": args.requests, "seed": args.seed,
              "rates_rps": rates, "rows": rows}
    write_text_atomic(result_path(args.output, args.workload), json.dumps(result, indent=1))
    lines = []
    for name in study.workloads():  # every workload written so far, in the serving study's order
        if os.path.exists(result_path(args.output, name)):
            with open(result_path(args.output, name)) as handle:
                written = json.load(handle)
            lines += report(name, written["rows"], sorted({row["rate_rps"] for row in written["rows"]}))
    write_text_atomic(os.path.join(args.output, "report.md"), "\n".join(lines))
    print(f"wrote {args.output}")


def result_path(output: str, workload: str) -> str:
    return os.path.join(output, f"{workload}-colocated.json")


def runs_under(admission_name: str):
    """The runs of an admission: all of them, but vLLM's default alone under vLLM's."""
    return [run for run in RUNS if admission_name not in VLLM_BASELINES or run[0] == VLLM_RUN]


def report(workload, rows, rates):
    """short P99 / long P99 / throughput of every run as ratios to SGLang's default under SGLang's admission,
    then (for each vLLM admission run) the plugin's default and SGLang's as ratios to vLLM's default under it."""
    by = {(row["admission"], row["rate_rps"], row["run"]): row for row in rows}
    header = ["| admission | run | " + " | ".join(f"{rate:g} rps" for rate in rates) + " |",
              "|---|---|" + "---:|" * len(rates)]
    lines = [f"## {workload}", "", "short P99 / long P99 / throughput as ratios to round robin + FCFS under SGLang's "
             "admission (retractions in brackets)", ""] + header
    for admission in ADMISSIONS:
        lines += [ratio_row(by, admission, label, rates, BASELINE) for label, *_ in runs_under(admission)
                  if (admission, rates[0], label) in by]
    lines += baseline_table(by, rates, BASELINE, "baseline")
    for admission, vllm in VLLM_BASELINES.items():
        if (admission, rates[0], VLLM_RUN) in by:
            lines += ["", f"The plugin's default and SGLang's as ratios to {vllm}'s, round robin + FCFS under {vllm}'s "
                      f"admission (retractions in brackets; {vllm}'s preemptions are in its row above)", ""] + header
            lines += [ratio_row(by, *run, rates, (admission, VLLM_RUN)) for run in (DEFAULT, BASELINE)]
            lines += baseline_table(by, rates, (admission, VLLM_RUN), f"{vllm} baseline")
    return lines + [""]


def ratio_row(by, admission, label, rates, baseline):
    """A run's short P99 / long P99 / throughput as ratios to ``baseline``'s, retractions in brackets."""
    cells = []
    for rate in rates:
        ours, base = by[(admission, rate, label)], by[(baseline[0], rate, baseline[1])]
        cells.append(f"{ours['short_p99_s'] / base['short_p99_s']:.2f} / {ours['long_p99_s'] / base['long_p99_s']:.2f}"
                     f" / {ours['throughput_tok_s'] / base['throughput_tok_s']:.2f} ({ours['retractions']})")
    return f"| {admission} | {label.replace('|', chr(92) + '|')} | " + " | ".join(cells) + " |"


def baseline_table(by, rates, baseline, name):
    """``baseline``'s own short P99, long P99 and throughput at every rate."""
    lines = ["", "| requests/s | " + " | ".join(f"{rate:g}" for rate in rates) + " |", "|---|" + "---:|" * len(rates)]
    for key, what in (("short_p99_s", "short P99 s"), ("long_p99_s", "long P99 s"), ("throughput_tok_s", "tok/s")):
        lines.append(f"| {name} {what} | " + " | ".join(f"{by[(baseline[0], rate, baseline[1])][key]:.1f}" for rate in rates) + " |")
    return lines


if __name__ == "__main__":
    main()
