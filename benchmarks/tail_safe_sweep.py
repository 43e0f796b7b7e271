"""FCFS, plain SJF and the tail-safe key across load and prediction quality, in the simulator.

Measures what the tail-safe key (``QueuePolicy.TAIL_SAFE`` in specforge_outlets/scheduling) is for:
short- and long-request P99 never far above FCFS's, under overload and with bad predictions, while
keeping what it can of SJF's gain near saturation. Everything runs through the shared scheduling
core, so the numbers are for the code the SGLang plugin serves with.

- Cluster: ``recipes/cluster-h100-4p2d.yaml`` (decode-bound: the waiting queues SJF orders are in
  front of decode; OUTLETS predicts at prefill). Least-predicted-work routing for every order.
- Workloads: the Azure conversation trace (99.8% of outputs < 800 tokens) and the same arrivals and
  prompts with synthetic heavy-tailed outputs (log-normal, median 300, sigma 1: 16% >= 800 tokens,
  the ShareGPT-like shape where the method reports its gain); loads from about half of saturation
  to twice it.
- Predictions: exact, noisy (log-normal sigma 0.5), degraded (sigma 1.0: the error doubled), and
  with ``--predictions FILE`` errors sampled from an ``outlets eval`` predictions file by true length.
- Orders: FCFS (the baseline of every ratio), plain SJF (no aging), SJF with the default aging, and
  the tail-safe key at several hold-backs (the trade-off curve). With ``--kv-admission predicted``
  the orders under test also reserve KV by predicted length, predicted remaining x (1 + ``--kv-margin``);
  the FCFS baseline still reserves max_new_tokens.

Writes ``results.jsonl`` (one row per run), ``tail_safe.md`` (worst case over the sweep per order,
the gain near saturation, and the target per order) and ``tradeoff.png``. The trace is the shared
data's Azure conversation trace (``$OUTLETS_SHARED_DIR``, else ``../shared``).

    python benchmarks/tail_safe_sweep.py --output runs/tail-safe \\
        [--predictions runs/demo/report/predictions/outlets.jsonl] [--kv-admission predicted [--kv-margin 0.5]]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

from specforge_outlets.studies.committed_data import AZURE_CONV_TRACE, shared
from specforge_outlets.scheduling import DEFAULT_LONG_HOLDBACK, QueuePolicy, RoutingPolicy, SchedulingConfig
from specforge_outlets.scheduling.kv_budget import DEFAULT_KV_MARGIN
from specforge_outlets.simulation.cluster import KVAdmission, load_cluster_config
from specforge_outlets.simulation.engine import Policy, Simulation, SimulationResult
from specforge_outlets.simulation.study import summarize
from specforge_outlets.simulation.predicted_lengths import PredictorKind, predict_lengths
from specforge_outlets.serving.trace import Trace, load_trace

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(REPO, "recipes", "cluster-h100-4p2d.yaml")
SHORT_THRESHOLD = 800  # output tokens: the method's short/long split, also the key's long class
# workload -> (rate scales from about half of saturation to twice it, the scale nearest saturation)
LOADS = {"azure-conv": ((6.5, 10, 13, 16, 20, 26), 13), "heavy-tail": ((3, 5, 6, 7, 8, 10, 12), 7)}
NOISE = {"exact": 0.0, "noisy": 0.5, "degraded": 1.0}
HOLDBACKS = (0.05, 0.1, 0.2, 0.3, 0.5, 1.0)
TOLERANCE = 1.05  # done-when: never more than 5% worse than FCFS on either class's P99
KEPT_GAIN = 0.9  # done-when: at least 90% of plain SJF's gain near saturation
# done-when: no throughput lost, within this allowance. Throughput here is output tokens generated
# while requests still arrive (`loaded_throughput`): over the whole makespan it would mostly measure
# how the last few requests drain (up to 5% between orders serving the same work).
NO_LOSS = 0.99


@dataclass(frozen=True)
class Order:
    """One waiting-queue order under test."""

    name: str
    queue: QueuePolicy
    scheduling: SchedulingConfig


def orders() -> List[Order]:
    found = [Order("sjf", QueuePolicy.SJF, SchedulingConfig(aging_tokens_per_s=0.0)),
             Order("sjf-aged", QueuePolicy.SJF, SchedulingConfig())]
    found += [Order(f"tail-safe {holdback:g}", QueuePolicy.TAIL_SAFE, SchedulingConfig(long_holdback=holdback))
              for holdback in HOLDBACKS]
    return found


def workloads(num_requests: int) -> Dict[str, Trace]:
    conv = load_trace(shared(AZURE_CONV_TRACE, "the tail-safe sweep")).head(num_requests)
    rng = np.random.default_rng(1)
    heavy = np.clip(np.round(300 * np.exp(rng.normal(0.0, 1.0, len(conv)))), 2, 4000).astype(int)
    return {"azure-conv": conv,
            "heavy-tail": Trace("heavy-tail", conv.ids, conv.arrival_times, conv.input_lens, heavy)}


def loaded_throughput(result: SimulationResult) -> float:
    """Output tokens per second generated from the first to the last arrival.

    A request's tokens count in proportion to the part of its decode (first token to finish) that
    lies before the last arrival, decode being close to one token per step.
    """
    start, end = result.arrival_times.min(), result.arrival_times.max()
    decode = np.maximum(result.finish_times - result.first_token_times, 1e-9)
    done = np.clip((end - result.first_token_times) / decode, 0.0, 1.0)
    started = result.first_token_times <= end
    tokens = np.where(started, 1.0 + (result.output_lens - 1) * done, 0.0).sum()
    return float(tokens / (end - start))


def simulate(trace: Trace, predictions, cluster, queue: QueuePolicy, scheduling: SchedulingConfig) -> Dict:
    policy = Policy(RoutingPolicy.LEAST_PREDICTED_WORK, queue)
    result = Simulation(trace, predictions, cluster, policy, scheduling).run()
    return dict(summarize(result, SHORT_THRESHOLD), loaded_throughput=loaded_throughput(result))


def ratios(metrics: Dict, fcfs: Dict) -> Dict[str, float]:
    return {
        "short_p99": metrics["short"]["e2e_p99_s"] / fcfs["short"]["e2e_p99_s"],
        "long_p99": metrics["long"]["e2e_p99_s"] / fcfs["long"]["e2e_p99_s"],
        "short_mean": metrics["short"]["e2e_mean_s"] / fcfs["short"]["e2e_mean_s"],
        "all_mean": metrics["all"]["e2e_mean_s"] / fcfs["all"]["e2e_mean_s"],
        "throughput": metrics["loaded_throughput"] / fcfs["loaded_throughput"],
        "makespan_throughput": metrics["all"]["throughput_tok_s"] / fcfs["all"]["throughput_tok_s"],
        "max_wait_s": metrics["all"]["queue_max_s"],
        "fcfs_max_wait_s": fcfs["all"]["queue_max_s"],
    }


def sweep(num_requests: int, predictions_path: Optional[str], kv_admission: KVAdmission,
          kv_margin: float = DEFAULT_KV_MARGIN, progress=print) -> List[Dict]:
    baseline_cluster = load_cluster_config(CLUSTER)  # FCFS, reserving max_new_tokens: the baseline
    cluster = dataclasses.replace(baseline_cluster, kv_admission=kv_admission, kv_margin=kv_margin)
    qualities = dict(NOISE, **({"outlets-measured": None} if predictions_path else {}))
    rows = []
    for workload, trace in workloads(num_requests).items():
        scales, _ = LOADS[workload]
        for quality, sigma in qualities.items():
            if sigma is None:
                predictions = predict_lengths(PredictorKind.FILE, trace, 0, predictions_path=predictions_path)
            else:
                predictions = predict_lengths(PredictorKind.NOISY, trace, 0, sigma)
            for scale in scales:
                scaled = trace.scaled(scale)
                fcfs = simulate(scaled, predictions, baseline_cluster, QueuePolicy.FCFS, SchedulingConfig())
                for order in orders():
                    row = {"workload": workload, "predictions": quality, "rate_scale": scale, "order": order.name,
                           **ratios(simulate(scaled, predictions, cluster, order.queue, order.scheduling), fcfs)}
                    rows.append(row)
                    progress(f"{workload} {quality:16s} x{scale:<4g} {order.name:15s} short P99 {row['short_p99']:.2f}"
                             f"  long P99 {row['long_p99']:.2f}  short mean {row['short_mean']:.2f}"
                             f"  throughput {row['throughput']:.3f}  max wait {row['max_wait_s']:.0f} s")
    return rows


def near_saturation(rows: Sequence[Dict], order: str, workload: str) -> List[Dict]:
    """Rows of one order at the workload's load nearest saturation, one per prediction quality."""
    scale = LOADS[workload][1]
    return [row for row in rows if row["order"] == order and row["workload"] == workload and row["rate_scale"] == scale]


def kept_gain(rows: Sequence[Dict], order: str, quality: str, metric: str = "short_p99") -> float:
    """Share of plain SJF's gain (1 - ratio to FCFS) kept on heavy-tailed outputs near saturation."""
    pick = lambda name: next(row for row in near_saturation(rows, name, "heavy-tail") if row["predictions"] == quality)
    gain = 1.0 - pick("sjf")[metric]
    return (1.0 - pick(order)[metric]) / gain if gain > 0.02 else float("nan")  # SJF gains nothing to keep


def largest_safe_holdback(rows: Sequence[Dict]) -> float:
    """The largest hold-back whose worst short- and long-request P99 stay within the tolerance (0: none)."""
    safe = [h for h in HOLDBACKS if all(row["short_p99"] <= TOLERANCE and row["long_p99"] <= TOLERANCE
                                        for row in rows if row["order"] == f"tail-safe {h:g}")]
    return max(safe, default=0.0)


def summary_table(rows: Sequence[Dict]) -> str:
    names = list(dict.fromkeys(row["order"] for row in rows))
    qualities = [row["predictions"] for row in near_saturation(rows, names[0], "heavy-tail")]
    listed = ", ".join(qualities)
    lines = [f"| order | worst short P99 / FCFS | worst long P99 / FCFS | lowest throughput / FCFS | max wait (s) | "
             f"heavy-tail near saturation: short P99 / FCFS ({listed}) | short mean / FCFS ({listed}) | "
             f"kept of SJF's short-P99 gain ({listed}) | done-when |", "|" + "---|" * 9]
    for name in names:
        mine = [row for row in rows if row["order"] == name]
        near = near_saturation(rows, name, "heavy-tail")
        fmt = lambda metric: ", ".join(f"{row[metric]:.2f}" for row in near)
        worst_short, worst_long = max(r["short_p99"] for r in mine), max(r["long_p99"] for r in mine)
        throughput = min(r["throughput"] for r in mine)
        kept = [kept_gain(rows, name, quality) for quality in qualities]
        verdict = ", ".join([
            "tail-safe" if worst_short <= TOLERANCE and worst_long <= TOLERANCE else "NOT tail-safe",
            "keeps 90%" if kept[0] >= KEPT_GAIN else "keeps < 90%",
            "no throughput loss" if throughput >= NO_LOSS else "loses throughput",
        ])
        lines.append(f"| {name} | {worst_short:.2f} | {worst_long:.2f} | {throughput:.3f} | "
                     f"{max(r['max_wait_s'] for r in mine):.0f} | {fmt('short_p99')} | {fmt('short_mean')} | "
                     + ", ".join("n/a" if np.isnan(k) else f"{k:.0%}" for k in kept) + f" | {verdict} |")
    fcfs_wait = max(row["fcfs_max_wait_s"] for row in rows)
    return "\n".join(lines) + (
        f"\n\nFCFS's longest wait over the sweep: {fcfs_wait:.0f} s. Ratios are to FCFS in the same run; worst = over "
        f"all {len(rows) // len(names)} runs per order; done-when: worst <= {TOLERANCE}, >= {KEPT_GAIN:.0%} of SJF's "
        f"gain with exact predictions, throughput >= {NO_LOSS}. Largest hold-back within {TOLERANCE} everywhere: "
        f"{largest_safe_holdback(rows):g}.\n")


def plot(rows: Sequence[Dict], path: str) -> None:
    """Short- against long-request P99 (ratios to FCFS): worst over the sweep, and near saturation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(row["order"] for row in rows))
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    for axis, title, pick in (
        (axes[0], "worst case over the sweep", lambda name: [row for row in rows if row["order"] == name]),
        (axes[1], "heavy-tail near saturation, exact predictions",
         lambda name: [row for row in near_saturation(rows, name, "heavy-tail") if row["predictions"] == "exact"]),
    ):
        for index, name in enumerate(names):
            mine = pick(name)
            x, y = max(row["long_p99"] for row in mine), max(row["short_p99"] for row in mine)
            marker = "o" if name.startswith("tail-safe") else "s"
            axis.scatter(x, y, marker=marker, s=50, color=f"C{index}", label=name)
        axis.axvline(TOLERANCE, color="grey", linestyle=":")
        axis.axhline(1.0, color="grey", linestyle=":")
        axis.set_xlabel("long-request P99 / FCFS")
        axis.set_ylabel("short-request P99 / FCFS")
        axis.set_title(title)
    axes[1].legend(fontsize=8, loc="upper right")
    fig.suptitle("Ordering keys against FCFS (simulator, 4P+2D H100, least-predicted-work routing)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="runs/tail-safe")
    parser.add_argument("--num-requests", type=int, default=8000)
    parser.add_argument("--predictions", help="outlets eval predictions JSONL (with true_output_len) to sample errors from")
    parser.add_argument("--from-results", help="an earlier run's results.jsonl: only rebuild the table and the plot")
    parser.add_argument("--kv-admission", default="max-new-tokens", choices=[k.value for k in KVAdmission],
                        help="KV admission of the orders under test (the FCFS baseline reserves max_new_tokens)")
    parser.add_argument("--kv-margin", type=float, default=DEFAULT_KV_MARGIN,
                        help=f"--kv-admission predicted: reserve predicted remaining x (1 + this) (default "
                             f"{DEFAULT_KV_MARGIN:g}, the plugin's)")
    args = parser.parse_args()
    if args.kv_margin < 0:
        parser.error(f"--kv-margin must be >= 0, got {args.kv_margin}")
    if args.from_results:
        with open(args.from_results, encoding="utf-8") as handle:
            rows = [json.loads(line) for line in handle if line.strip()]
    else:
        rows = sweep(args.num_requests, args.predictions, KVAdmission(args.kv_admission), args.kv_margin,
                     progress=lambda line: print(line, flush=True))
    os.makedirs(args.output, exist_ok=True)
    if not args.from_results:
        with open(os.path.join(args.output, "results.jsonl"), "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(row) + "\n" for row in rows)
    table = summary_table(rows)
    with open(os.path.join(args.output, "tail_safe.md"), "w", encoding="utf-8") as handle:
        handle.write(table)
    plot(rows, os.path.join(args.output, "tradeoff.png"))
    print(table)
    print(f"default hold-back: {DEFAULT_LONG_HOLDBACK:g}; wrote {args.output}/results.jsonl, tail_safe.md, tradeoff.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
