"""Ordering and admitting by a predicted length distribution against the point prediction and SGLang's default.

The serving study's workloads (``--workload``, ``serving_study_sharegpt.py``: the label set's own,
``sharegpt-chatgpt``, ``azure-conv``) on 4 colocated H100 instances of 100,000 KV tokens each (the
KV-bound set-up of ``admission_study.py``), predictions with the request (``predict_at: arrival``:
``custom_params`` or the predictor-only mode in front, so that the waiting queues are ordered by
them). Every run is least-predicted-work routing with OUTLETS r̂₀ as the point, except the baseline:

- baseline: SGLang's default, round robin + FCFS under SGLang's admission (``kv_admission: sglang``);
- orders under KV by prediction (point x 1.2): SJF by ``point``, ``mean``, ``risk``, ``gittins``,
  ``kv-footprint`` (``SchedulingConfig.order_key``), tail-safe by the point and by q0.9
  (``long_class_quantile``), and SJF by the oracle's length;
- admissions under the plugin's default order (tail-safe by the point): ``predicted`` (point x 1.2),
  ``quantile`` (q0.5, q0.75 and q0.9 of the remaining length) and SGLang's own.

Distributions: until real quantile predictions exist, each request's distribution is a log-normal
around its OUTLETS r̂₀ with the spread and bias of OUTLETS' own errors on the label set
(``--distribution r0-lognormal``: median r̂₀ x exp(-bias), sigma the standard deviation of
log(r̂₀ / true) over its uncensored test responses; what a predictor whose only knowledge is its
point and its error spread would say), or the simulator's ``noisy`` point with its log-normal
(``--distribution noisy``, ``--noise-sigma``). ``--predictions FILE --file-predictor NAME`` reads real
quantiles from ``outlets eval``'s record (the label set's workload, joined by request id).

Stages, resumable: ``simulate`` writes ``<workload>-<rate>rps.json`` per rate under ``--output``
(kept and skipped when present; delete to run again), ``report`` writes ``report.md`` from every
file present: short/long P99, throughput, goodput (``--slo``) and retractions, each as a ratio to
SGLang's default.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/distribution_scheduling.py --requests 1000 --rates 40
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from typing import Dict, List, Optional, Tuple

import numpy as np

from specforge_outlets.atomic import write_text_atomic
from specforge_outlets.scheduling import LengthDistribution, SchedulingConfig
from specforge_outlets.serving.metrics import parse_goodput
from specforge_outlets.simulation.cluster import KVAdmission, PredictionPoint
from specforge_outlets.simulation.engine import Policy, Simulation
from specforge_outlets.simulation.predicted_lengths import read_file_quantiles
from specforge_outlets.simulation.sglang_peers import queue_policy, routing_policy
from specforge_outlets.simulation.study import summarize
from specforge_outlets.studies import sharegpt_serving as study
from specforge_outlets.studies.committed_data import read_eval_record

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CLUSTER = "colocated x4"
KV_CAPACITY = 100_000  # per instance: the serving study's KV-bound set-up
POINT = "outlets r0"
# (label, admission, routing, queue, predictor, scheduling settings)
BASELINE = "sglang default: round-robin + fcfs, sglang admission"
RUNS: List[Tuple[str, KVAdmission, str, str, str, Dict]] = [
    (BASELINE, KVAdmission.SGLANG, "round-robin", "fcfs", "none", {}),
    ("sjf point", KVAdmission.PREDICTED, "least-predicted-work", "sjf", POINT, {}),
    ("sjf mean", KVAdmission.PREDICTED, "least-predicted-work", "sjf", POINT, {"order_key": "mean"}),
    ("sjf risk", KVAdmission.PREDICTED, "least-predicted-work", "sjf", POINT, {"order_key": "risk"}),
    ("sjf gittins", KVAdmission.PREDICTED, "least-predicted-work", "sjf", POINT, {"order_key": "gittins"}),
    ("sjf kv-footprint", KVAdmission.PREDICTED, "least-predicted-work", "sjf", POINT, {"order_key": "kv-footprint"}),
    ("sjf oracle", KVAdmission.PREDICTED, "least-predicted-work", "sjf", "oracle", {}),
    ("tail-safe point (plugin default)", KVAdmission.PREDICTED, "least-predicted-work", "tail-safe", POINT, {}),
    ("tail-safe q0.9", KVAdmission.PREDICTED, "least-predicted-work", "tail-safe", POINT, {"long_class_quantile": 0.9}),
    # the KV charge at three quantiles of the remaining length (0.9 over-reserves a wide, calibrated distribution)
    *((f"tail-safe point, KV quantile {level:g}", KVAdmission.QUANTILE, "least-predicted-work", "tail-safe", POINT,
       {"kv_quantile": level}) for level in (0.5, 0.75, 0.9)),
    ("tail-safe point, sglang admission", KVAdmission.SGLANG, "least-predicted-work", "tail-safe", POINT, {}),
]
METRICS = (("short P99", "short", "e2e_p99_s"), ("long P99", "long", "e2e_p99_s"),
           ("throughput", "all", "throughput_tok_s"), ("goodput", "all", "goodput_rps"))


def measured_log_error(predictor: str = "outlets") -> Tuple[float, float]:
    """(mean, standard deviation) of log(r̂₀ / true) of ``predictor`` over the label set's uncensored responses."""
    errors = [math.log(float(row["static"][predictor]) / float(row["true_output_len"]))
              for row in read_eval_record() if not row["censored"]]
    return float(np.mean(errors)), float(np.std(errors))


def distributions(args, work, trace, points: List[Optional[float]], seed: int,
                  levels: Tuple[float, ...]) -> List[Optional[Tuple[float, ...]]]:
    """Per request its total-length quantiles at ``levels`` (see the module's docstring)."""
    if args.predictions:
        found = read_file_quantiles(args.predictions, args.file_predictor)
        if found.levels is None:
            raise SystemExit(f"--predictions {args.predictions}: no quantiles for --file-predictor {args.file_predictor}")
        missing = sorted({request_id.rsplit("#", 1)[0] for request_id in trace.ids} - set(found.static))
        if missing:
            raise SystemExit(f"--predictions {args.predictions}: no quantiles of --file-predictor {args.file_predictor} "
                             f"for {len(missing)} trace request(s) (first: {missing[0]!r}); use the record of the same "
                             "test requests")
        return [found.static[request_id.rsplit("#", 1)[0]] for request_id in trace.ids]
    if args.distribution == "noisy":
        rng = np.random.default_rng([seed, 27])
        noisy = trace.output_lens * np.exp(rng.normal(0.0, args.noise_sigma, size=len(trace)))
        return [LengthDistribution.log_normal(float(p), args.noise_sigma, levels).quantiles for p in noisy]
    bias, sigma = measured_log_error()
    return [None if p is None else LengthDistribution.log_normal(p * math.exp(-bias), sigma, levels).quantiles
            for p in points]


def cluster_for(admission: KVAdmission, kv_quantile: float):
    cluster = study.cluster_for(CLUSTER, KVAdmission.PREDICTED, KV_CAPACITY)
    return dataclasses.replace(cluster, kv_admission=admission, kv_quantile=kv_quantile,
                               predict_at=PredictionPoint.ARRIVAL)


def result_path(args, workload: str, rate: float) -> str:
    return os.path.join(args.output, f"{workload}-{rate:g}rps.json")


def simulate(args) -> None:
    slo = parse_goodput(args.slo)
    # a record with quantiles brings its own point predictions too: the point the distribution replaces
    # is the same draft's r̂₀, not the committed evaluation's
    work = study.LabelSetWorkload(args.predictions) if args.predictions else study.workloads()[args.workload]()
    levels = (read_file_quantiles(args.predictions, args.file_predictor).levels if args.predictions
              else SchedulingConfig().quantile_levels)
    for rate in args.rates or work.rates_rps:
        path = result_path(args, args.workload, rate)
        if os.path.exists(path):
            print(f"kept {path}")
            continue
        trace, cache = work.trace(rate, args.requests, args.seed), {}
        points, _ = work.predictions(POINT, trace, args.seed)
        if args.distribution == "noisy" and not args.predictions:  # the noisy point with its own distribution
            quantiles = distributions(args, work, trace, points, args.seed, levels)
            points = [q[len(q) // 2] for q in quantiles]
        else:
            quantiles = distributions(args, work, trace, points, args.seed, levels)
        cache[POINT] = (points, None)
        rows = []
        for label, admission, routing, queue, predictor, settings in RUNS:
            if predictor not in cache:
                cache[predictor] = work.predictions(predictor, trace, args.seed)
            predictions, trajectories = cache[predictor]
            settings = dict(settings)
            kv_quantile = settings.pop("kv_quantile", 0.9)  # a cluster setting, not a scheduling one
            scheduling = SchedulingConfig(quantile_levels=levels, **settings)
            started = time.perf_counter()
            result = Simulation(trace, predictions, cluster_for(admission, kv_quantile), Policy(routing_policy(routing),
                                queue_policy(queue)), scheduling, trajectories, args.seed,
                                quantiles if predictor == POINT else None).run()
            metrics = summarize(result, args.short_threshold, slo)
            rows.append({"run": label, "admission": admission.value, "routing": routing, "queue": queue,
                         "predictor": predictor, "scheduling": settings, "metrics": metrics,
                         "retractions": int(result.retractions.sum()), "sim_wall_s": time.perf_counter() - started})
            print(f"{args.workload} {rate:5g} rps {label:36s} short P99 {metrics['short']['e2e_p99_s']:8.2f} s  long P99 "
                  f"{metrics['long']['e2e_p99_s']:8.2f} s  thr {metrics['all']['throughput_tok_s']:7.0f}  goodput "
                  f"{metrics['all'].get('goodput_rps', float('nan')):6.2f}  retractions {rows[-1]['retractions']:5d}  "
                  f"({rows[-1]['sim_wall_s']:.1f} s)", flush=True)
        os.makedirs(args.output, exist_ok=True)
        source = (f"{args.predictions} ({args.file_predictor})" if args.predictions else args.distribution)
        write_text_atomic(path, json.dumps({
            "command": "python benchmarks/distribution_scheduling.py " + " ".join(sys.argv[1:]),
            "workload": args.workload, "rate_rps": rate, "requests": args.requests, "seed": args.seed,
            "cluster": CLUSTER, "kv_capacity_tokens": KV_CAPACITY,
            "distribution": source, "noise_sigma": args.noise_sigma if args.distribution == "noisy" else None,
            "measured_log_error": (measured_log_error() if args.distribution == "r0-lognormal" and not args.predictions
                                   else None),
            "quantile_levels": list(levels), "short_threshold": args.short_threshold, "slo_s": slo,
            "rows": rows}, indent=1))
        print(f"wrote {path}")


def report(args) -> None:
    files = sorted(name for name in os.listdir(args.output) if name.endswith("rps.json")) if os.path.isdir(
        args.output) else []
    results = []
    for name in files:
        with open(os.path.join(args.output, name)) as handle:
            results.append(json.load(handle))
    lines = ["# Ordering and admitting by a predicted length distribution", "",
             "Written by `benchmarks/distribution_scheduling.py`; simulated. Every cell: short P99 / long P99 / "
             "throughput / goodput as ratios to SGLang's default (round robin + FCFS under SGLang's admission), "
             "retractions in brackets.", "",
             "Read this first: with a log-normal of one spread for every request (`r0-lognormal`, `noisy`), the mean, "
             "the Gittins rank and the risk key are the point times one constant (the distributions differ only in scale), "
             "so those orders differ from SJF by the point only in how strongly aging weighs against size (weaker by that "
             "constant), and in the conditioning of requests that were retracted; kv-footprint differs by the prompt. "
             "The distribution's own information needs per-request spreads: a real quantile head (`--predictions`).", ""]
    for workload in dict.fromkeys(result["workload"] for result in results):
        chosen = sorted((r for r in results if r["workload"] == workload), key=lambda r: r["rate_rps"])
        first = chosen[0]
        lines += [f"## {workload}", "",
                  f"{first['requests']} requests a rate, {first['cluster']} of {first['kv_capacity_tokens']:,} KV tokens, "
                  f"distribution: {first['distribution']}"
                  + (f" (log error of r0: mean {first['measured_log_error'][0]:+.2f}, sd "
                     f"{first['measured_log_error'][1]:.2f})" if first.get("measured_log_error") else "") + ".", "",
                  "| run | " + " | ".join(f"{r['rate_rps']:g} rps" for r in chosen) + " |",
                  "|---|" + "---:|" * len(chosen)]
        for label, *_ in RUNS:
            cells = []
            for result in chosen:
                by = {row["run"]: row for row in result["rows"]}
                if label not in by:
                    cells.append("")
                    continue
                ours, base = by[label]["metrics"], by[BASELINE]["metrics"]
                ratios = [_ratio(ours[cls].get(key), base[cls].get(key)) for _, cls, key in METRICS]
                cells.append(" / ".join(ratios) + f" ({by[label]['retractions']})")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines += ["", "| SGLang's default | " + " | ".join(f"{r['rate_rps']:g} rps" for r in chosen) + " |",
                  "|---|" + "---:|" * len(chosen)]
        for what, cls, key in METRICS:
            values = [{row["run"]: row for row in r["rows"]}[BASELINE]["metrics"][cls].get(key) for r in chosen]
            lines.append(f"| {what} | " + " | ".join("n/a" if v is None else f"{v:.2f}" for v in values) + " |")
        lines.append("")
    os.makedirs(args.output, exist_ok=True)
    write_text_atomic(os.path.join(args.output, "report.md"), "\n".join(lines) + "\n")
    print(f"wrote {os.path.join(args.output, 'report.md')}")


def _ratio(ours, base) -> str:
    if ours is None or base is None or not base or not math.isfinite(ours) or not math.isfinite(base):
        return "n/a"
    return f"{ours / base:.2f}"


STAGES = {"simulate": simulate, "report": report}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", choices=list(study.workloads()), default=study.LabelSetWorkload.name)
    parser.add_argument("--stages", nargs="+", choices=list(STAGES), default=list(STAGES))
    parser.add_argument("--rates", type=float, nargs="+", help="requests/s (default: the workload's own)")
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--distribution", choices=["r0-lognormal", "noisy"], default="r0-lognormal")
    parser.add_argument("--noise-sigma", type=float, default=0.5, help="--distribution noisy: log-normal sigma")
    parser.add_argument("--predictions", help="outlets eval's record with quantiles (the label set's workload)")
    parser.add_argument("--file-predictor", default="outlets", help="whose quantiles to read from --predictions")
    parser.add_argument("--short-threshold", type=int, default=800)
    parser.add_argument("--slo", nargs="+", default=study.DEFAULT_SLO, metavar="METRIC:MS", help="goodput targets")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=os.path.join(REPO, "benchmarks", "data", "distribution-scheduling"))
    args = parser.parse_args()
    if args.predictions and args.workload != study.LabelSetWorkload.name:
        parser.error("--predictions joins by the label set's request ids: --workload sharegpt-smollm2 only")
    for stage in args.stages:
        STAGES[stage](args)


if __name__ == "__main__":
    main()
