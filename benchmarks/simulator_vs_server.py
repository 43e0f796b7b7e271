"""The simulator checked against the real KV-bound SGLang servers, on their own set-up.

``kv_bound_server_study.py`` measures fcfs, lof and the plugin's default on a real SGLang 0.5.23
server on this CPU. This runs the simulator on the same set-up, so the two can be read side by side:

- **Step model** fitted to those servers (``outlets fit-step-time``'s fit, on the ``Decode batch`` and
  ``Prefill batch`` lines each run kept): on the fcfs runs only (both fcfs servers, every repetition),
  then scored on every other server's logs, which it never saw.
- **Cluster**: one colocated instance with the server's cache (``--max-total-tokens``),
  ``max_running_requests`` and ``chunked_prefill_size``; ``max_new_tokens`` the study's cap.
- **Requests**: the study's own (``dataset.jsonl``), each arriving when the study sent it (all at 0,
  or its seeded Poisson times) with the prompt length the server counted (a run's ``requests.jsonl``)
  and the output length it generated.
- **Runs**: fcfs and lof under SGLang's admission (``kv_admission: sglang``); the default (tail-safe)
  without predictions under SGLang's admission too, as the plugin keeps SGLang's charge for a request
  without one; with bert, OUTLETS r̂₀ and the oracle under KV by prediction (``predicted``, margin 0.2:
  SGLang's rounds with the plugin's charge); the servers with the detached draft's quantiles
  (SJF by the Gittins rank, KV by prediction; tail-safe with KV at the median, ``quantile`` 0.5).

The report gives both as ratios to fcfs, the retraction counts, and the absolute fcfs numbers;
absolute times are not expected to agree (the step model is a fit), the ratios and their order are.

    .venv/bin/python benchmarks/simulator_vs_server.py   # after the study's run and report stages; seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import statistics
import sys
from typing import Dict, List, Optional, Tuple

import numpy as np

from specforge_outlets.atomic import write_text_atomic
from specforge_outlets.data.jsonl import BadLine, iter_jsonl
from specforge_outlets.evaluation.predictions_file import predictions_by_id
from specforge_outlets.scheduling import OrderKey, SchedulingConfig
from specforge_outlets.serving.trace import Trace
from specforge_outlets.simulation.cluster import cluster_config_from_dict
from specforge_outlets.simulation.engine import Policy, Simulation
from specforge_outlets.simulation.predicted_lengths import read_file_quantiles
from specforge_outlets.simulation.sglang_peers import queue_policy, routing_policy
from specforge_outlets.simulation.step_fit import fit_step_time, parse_intervals
from specforge_outlets.simulation.study import summarize
from specforge_outlets.studies import kv_bound_server as study

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RUNS_DIR = os.path.join(REPO, "runs", "kv-bound-300")
RESULTS = os.path.join(REPO, "benchmarks", "data", "kv-bound-server-300")
DEFAULT = "outlets tail-safe + KV by prediction"
FITTED_ON = ("fcfs", "fcfs (A/A control)")  # the servers whose logs the step model is fitted to
GITTINS = "outlets gittins + KV by prediction"
KV_AT_MEDIAN = "outlets tail-safe + KV at q0.5"


@dataclasses.dataclass(frozen=True)
class SimRun:
    """The simulated counterpart of a study server: its queue, its KV admission, and what the server's flags set."""

    queue: str
    kv_admission: str
    cluster: Tuple[Tuple[str, object], ...] = ()  # cluster fields beyond the shared set-up
    scheduling: Tuple[Tuple[str, object], ...] = ()  # SchedulingConfig fields


# (server, predictor) of the study -> its simulated run
RUNS = {
    ("fcfs", "none"): SimRun("fcfs", "sglang"),
    ("fcfs (A/A control)", "none"): SimRun("fcfs", "sglang"),  # the same policy: any real gap is the machine's
    ("lof", "none"): SimRun("lof", "sglang"),
    (DEFAULT, "none"): SimRun("tail-safe", "sglang"),
    (DEFAULT, "bert"): SimRun("tail-safe", "predicted"),
    (DEFAULT, "outlets"): SimRun("tail-safe", "predicted"),
    (DEFAULT, "oracle"): SimRun("tail-safe", "predicted"),
    # the detached draft's quantiles (`--outlets-order-key gittins`; `--outlets-kv-quantile 0.5`)
    (GITTINS, study.QUANTILES): SimRun("sjf", "predicted", scheduling=(("order_key", OrderKey.GITTINS),)),
    (KV_AT_MEDIAN, study.QUANTILES): SimRun("tail-safe", "quantile", cluster=(("kv_quantile", 0.5),)),
}
COLUMNS = (("short P99 s", "short", "e2e_p99_s"), ("long P99 s", "long", "e2e_p99_s"),
           ("throughput tok/s", "all", "throughput_tok_s"))


def read_jsonl(path: str) -> List[dict]:
    rows = [row for _, row in iter_jsonl(path)]
    bad = next((row for row in rows if isinstance(row, BadLine)), None)
    if bad is not None:
        raise SystemExit(str(bad))
    return rows


def finished_run_dirs(*parts: str) -> List[str]:
    """The finished runs' directories matching ``parts`` (a run in progress is ``repN.partial``)."""
    return sorted(path for path in glob.glob(os.path.join(*parts, "rep*")) if not path.endswith(".partial"))


def intervals_by_run(args) -> Dict[str, Dict[str, list]]:
    """Per server, per finished run (its directory under the study's), the decode intervals of its log."""
    runs: Dict[str, Dict[str, list]] = {}
    for server in study.SERVERS:
        for out in finished_run_dirs(args.runs_dir, study.slug(server), "*"):
            with open(os.path.join(out, "server.log"), encoding="utf-8", errors="replace") as handle:
                runs.setdefault(server, {})[os.path.relpath(out, args.runs_dir)] = parse_intervals(handle)
    return runs


def workload(args) -> Trace:
    """The study's requests in the order it sent them, at its send times, with the prompt lengths a
    finished run's server counted."""
    dataset = list(read_jsonl(os.path.join(args.runs_dir, "dataset.jsonl")))
    records = finished_run_dirs(args.runs_dir, "fcfs", "none")
    if not records:
        raise SystemExit(f"no finished fcfs run under {args.runs_dir}: run kv_bound_server_study.py run first")
    sent = {row["id"]: row for row in read_jsonl(os.path.join(records[0], "requests.jsonl"))}
    ids = sorted((row["id"] for row in dataset), key=lambda i: sent[i]["scheduled_s"])  # in arrival order
    lengths = {row["id"]: row["output_length"] for row in dataset}
    return Trace("kv-bound-server", ids, np.array([sent[i]["scheduled_s"] for i in ids]),
                 np.array([sent[i]["prompt_len"] for i in ids]), np.array([lengths[i] for i in ids]))


def predictions_of(args, predictor: str, trace: Trace) -> Tuple[list, Optional[list], Optional[Tuple[float, ...]]]:
    """Each request's point prediction as the study sent it, and where the file has them its total-length
    quantiles and their levels."""
    if predictor == "none":
        return [None] * len(trace), None, None
    if predictor == "oracle":
        return trace.output_lens.astype(float).tolist(), None, None
    path = study.predictions_path(args.runs_dir, predictor)
    by_id = predictions_by_id(path)
    quantiles = read_file_quantiles(path)
    if quantiles.levels is None:
        return [float(by_id[i]) for i in trace.ids], None, None
    return [float(by_id[i]) for i in trace.ids], [quantiles.static.get(i) for i in trace.ids], quantiles.levels


def simulate(args, coefficients: Dict[str, float], trace: Trace) -> Dict[tuple, dict]:
    base = {"mode": "colocated", "instances": 1, "kv_capacity_tokens": args.max_total_tokens,
            "max_running_requests": args.max_running_requests, "chunked_prefill_size": args.chunked_prefill_size,
            "max_new_tokens": study.MAX_NEW_TOKENS, "predict_at": "arrival", "fitted_step_time": coefficients}
    results = {}
    for (server, predictor), run in RUNS.items():
        cluster = cluster_config_from_dict({**base, "kv_admission": run.kv_admission, **dict(run.cluster)},
                                           "simulator check")
        policy = Policy(routing_policy("round-robin"), queue_policy(run.queue))
        points, quantiles, levels = predictions_of(args, predictor, trace)
        scheduling = SchedulingConfig(**dict(run.scheduling), **({"quantile_levels": levels} if levels else {}))
        result = Simulation(trace, points, cluster, policy, scheduling, quantiles=quantiles).run()
        metrics = summarize(result, study.SHORT_THRESHOLD)
        results[(server, predictor)] = {
            **{column: metrics[group][key] for column, group, key in COLUMNS},
            "retracted": int(result.retractions.sum())}
    return results


def real_medians(args, pace: Dict[str, float]) -> Dict[tuple, dict]:
    """The study's medians by (server, predictor), as measured and with each run's times divided by its
    pace (throughput multiplied): what the run would have measured at the fit's machine speed."""
    real = {}
    for server, predictor in RUNS:
        runs = []
        outs = finished_run_dirs(args.runs_dir, study.slug(server), study.slug(predictor))
        for out, run in zip(outs, study.finished_runs(outs)):
            speed = pace[os.path.relpath(out, args.runs_dir)]
            runs.append({**{column: run["metrics"][column] for column, _, _ in COLUMNS},
                         **{f"{column} (pace-adjusted)": run["metrics"][column] * (speed if "tok/s" in column else 1 / speed)
                            for column, _, _ in COLUMNS},
                         "retracted": run["retracted"]})
        if runs:
            real[(server, predictor)] = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
            real[(server, predictor)]["runs"] = len(runs)
    return real


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs-dir", default=RUNS_DIR)
    parser.add_argument("--results", default=RESULTS, help="where simulator-check.md and .json are written")
    parser.add_argument("--max-total-tokens", type=int, default=16384, help="the study's --max-total-tokens")
    parser.add_argument("--max-running-requests", type=int, default=64, help="the study's servers'")
    parser.add_argument("--chunked-prefill-size", type=int, default=4096, help="the servers' (SGLang's CPU default)")
    args = parser.parse_args()

    logs = intervals_by_run(args)
    fit = fit_step_time([interval for server in FITTED_ON for run in logs.get(server, {}).values() for interval in run])
    held_out = {}
    for server, runs in logs.items():
        intervals = [interval for run in runs.values() for interval in run]
        if server in FITTED_ON or not intervals:
            continue
        seconds, predicted = np.array([interval.seconds for interval in intervals]), fit.predict(intervals)
        held_out[server] = {"intervals": len(intervals), "median_abs_error": float(np.median(np.abs(predicted - seconds) / seconds)),
                            "total_time_ratio": float(predicted.sum() / seconds.sum())}
    # each run's pace: the seconds its decode intervals took over what the fit gives them. Runs of one
    # policy that differ in pace differ in the machine's speed, not in what the scheduler decided
    pace = {run: float(sum(interval.seconds for interval in intervals) / fit.predict(intervals).sum())
            for runs in logs.values() for run, intervals in runs.items() if intervals}
    trace = workload(args)
    simulated, real = simulate(args, fit.coefficients, trace), real_medians(args, pace)
    rows = [{"server": server, "predictor": predictor, "simulated": simulated[(server, predictor)],
             "real": real.get((server, predictor))} for server, predictor in RUNS]
    result = {"command": "python benchmarks/simulator_vs_server.py " + " ".join(sys.argv[1:]),
              "requests": len(trace), "fit": dataclasses.asdict(fit), "held_out": held_out, "pace": pace, "rows": rows}
    os.makedirs(args.results, exist_ok=True)
    write_text_atomic(os.path.join(args.results, "simulator-check.json"), json.dumps(result, indent=1))
    write_text_atomic(os.path.join(args.results, "simulator-check.md"), render(result))
    print(render(result))


def ratio(row: dict, side: str, column: str, fcfs: dict) -> str:
    value, base = (row[side] or {}).get(column), (fcfs[side] or {}).get(column)
    return f"{value / base:.2f}" if value is not None and base else "n/a"


def render(result: dict) -> str:
    fit, fcfs = result["fit"], result["rows"][0]
    coefficients = ", ".join(f"{key} {value:.3g}" for key, value in fit["coefficients"].items())
    lines = [f"# The simulator against the real KV-bound servers ({result['requests']} requests)", "",
             f"`{result['command']}`", "",
             f"Step model fitted to the fcfs servers' logs: {coefficients}; {fit['intervals']} intervals "
             f"({fit['dropped']} dropped as idle), R^2 {fit['r_squared']:.3f}, median error "
             f"{fit['median_abs_error']:.1%} per 40-step interval. On the other servers' logs (never fitted):", ""]
    for server, score in result["held_out"].items():
        lines.append(f"- {server}: median error {score['median_abs_error']:.1%} over {score['intervals']} intervals, "
                     f"total time x{score['total_time_ratio']:.2f}")
    lines += ["", "Each run's pace (its decode intervals' seconds over the fit's; 1.10 = 10% slower steps than "
              "the fit gives the same batch and cache):", ""]
    lines += [f"- {run}: {value:.2f}" for run, value in sorted(result["pace"].items())]
    lines += ["", "Ratios to fcfs (real: median over the runs; simulated: one deterministic run). Retractions per run.",
              "Real, pace-adjusted: each run's times divided by its pace, its throughput multiplied.", "",
              "| server | predictions | runs | " + " | ".join(f"{c} real | pace-adjusted | sim" for c, _, _ in COLUMNS)
              + " | retracted real | retracted sim |", "|---|---|---:|" + "---:|" * (3 * len(COLUMNS) + 2)]
    for row in result["rows"]:
        cells = [str((row["real"] or {}).get("runs", 0))]
        for column, _, _ in COLUMNS:
            cells += [ratio(row, "real", column, fcfs), ratio(row, "real", f"{column} (pace-adjusted)", fcfs),
                      ratio(row, "simulated", column, fcfs)]
        real_retracted = "n/a" if row["real"] is None else f"{row['real']['retracted']:g}"
        lines.append(f"| {row['server']} | {row['predictor']} | " + " | ".join(cells)
                     + f" | {real_retracted} | {row['simulated']['retracted']} |")
    if fcfs["real"] is not None:
        lines += ["", "fcfs in absolute terms: " + ", ".join(
            f"{column} real {fcfs['real'][column]:.1f} (pace-adjusted {fcfs['real'][column + ' (pace-adjusted)']:.1f}) "
            f"/ sim {fcfs['simulated'][column]:.1f}" for column, _, _ in COLUMNS)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
