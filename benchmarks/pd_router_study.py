"""The paper's cluster shape on real SGLang servers: one prefill and two decode instances behind sglang-router.

What ``kv_bound_server_study.py`` measures on one server, here through the deployment users run (PD
disaggregation behind the stock router, docs/serving.md step 7), on this CPU:

- **Cluster**: one prefill instance and two KV-bound decode instances (``--max-total-tokens`` each),
  KV over ``mooncake_tcp`` with the CPU work-arounds of specforge_outlets/studies/sglang_plugins/pd_cpu/ (a
  plugin put on the servers' path, as ``scheduler_server_check.py`` does with the timing plugin), and
  sglang-router 0.3.2 in PD mode in front.
- **Policies**: the baseline users get by default, ``fcfs`` decode instances behind ``--decode-policy
  round_robin``; against the outlets default on the decode instances when the study ran (tail-safe order,
  KV admission by the charge, named on the command line) behind ``--decode-policy power_of_two``, which
  reads each decode instance's ``/get_load`` (its predicted remaining work) once a second.
- **Requests**: the KV-bound study's workload (the label set's ShareGPT test requests, real prompts,
  each ending at SmolLM2's length under the 2,048 cap with ``--end-at-output-len``), Poisson
  arrivals at ``--rate``, through ``outlets bench-serving --through-router`` at the router's address:
  the prediction (none, OUTLETS r̂₀, oracle) and the end-at-length settings ride ``custom_labels``,
  the field the router keeps. The target is the KV-bound study's random 2-layer Llama with SmolLM2's
  tokenizer (its forward costs little, so admission, order and routing decide the latencies).

Every (cluster, predictor) runs ``--repetitions`` times, predictors interleaved on one cluster;
retractions are counted from the decode instances' logs. Stages, each resumable (finished runs kept):

    .venv/bin/python benchmarks/pd_router_study.py run       # runs/pd-router/
    .venv/bin/python benchmarks/pd_router_study.py report    # benchmarks/data/pd-router/
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Dict, List

from specforge_outlets.atomic import write_text_atomic
from specforge_outlets.studies import sglang_plugins
from specforge_outlets.studies.kv_bound_server import (
    END_TOKEN_ID, MAX_NEW_TOKENS, METRICS, RETRACTED, SERVE_PYTHON, SHORT_THRESHOLD, finished_runs, make_target, slug,
    write_workload,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RUNS_DIR = os.path.join(REPO, "runs", "pd-router")
RESULTS = os.path.join(REPO, "benchmarks", "data", "pd-router")
# every instance: SGLang's PD flags for a CPU machine, no prefix reuse, the client's end-at-length processor
PD_ARGS = ["--disaggregation-transfer-backend", "mooncake_tcp", "--disable-overlap-schedule", "--disable-radix-cache",
           "--enable-custom-logit-processor", "--skip-server-warmup", "--sleep-on-idle"]
DECODE_ARGS = ["--disaggregation-mode", "decode", "--disaggregation-decode-retraction-backup", "cpu_tensor",
               "--max-running-requests", "64"]
DECODE_INSTANCES = 2
# cluster name -> (decode instances' policy flags, the router's decode policy, predictors sent)
CLUSTERS: Dict[str, tuple] = {
    "fcfs + round robin": (["--schedule-policy", "fcfs"], "round_robin", ("none",)),
    "outlets default + power_of_two": (["--schedule-policy", "outlets", "--outlets-long-output-len",
                                        str(SHORT_THRESHOLD), "--outlets-kv-admission", "predicted",
                                        "--outlets-kv-margin", "0.2"], "power_of_two",
                                       ("none", "outlets", "oracle")),
}


def run_dir(args, cluster: str, predictor: str, repetition: int) -> str:
    return os.path.join(args.runs_dir, slug(cluster), predictor, f"rep{repetition}")


# -- 1. run -----------------------------------------------------------------------------------------


def run(args) -> None:
    from specforge_outlets.cli import main as outlets
    from specforge_outlets.loadgen.sglang_router import SGLangRouter, pd_router_args
    from specforge_outlets.loadgen.sglang_server import SGLangServer, free_port

    os.makedirs(args.runs_dir, exist_ok=True)
    dataset = write_workload(args.runs_dir, args.requests, args.seed)
    with open(dataset) as handle:
        written = sum(1 for _ in handle)
    if written != args.requests:
        raise SystemExit(f"{dataset} holds {written} requests, not --requests {args.requests}: it was written by an "
                         f"earlier run; pass --requests {written} or another --runs-dir")
    model = make_target(os.path.join(args.runs_dir, "target"))
    # SGLANG_HOST_IP: mooncake's sessions and the bootstrap on loopback, not the host's first NIC address
    env = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "SGLANG_HOST_IP": "127.0.0.1"}
    for cluster in args.clusters:
        policy, decode_policy, predictors = CLUSTERS[cluster]
        pending = [(repetition, predictor) for repetition in range(args.repetitions) for predictor in predictors
                   if not os.path.exists(os.path.join(run_dir(args, cluster, predictor, repetition), "summary.json"))]
        if not pending:
            print(f"{cluster}: done")
            continue
        logs = os.path.join(args.runs_dir, slug(cluster))
        os.makedirs(logs, exist_ok=True)
        bootstrap = free_port()
        prefill = SGLangServer(model, ["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port",
                                       str(bootstrap), "--max-total-tokens", str(args.max_total_tokens), *PD_ARGS],
                               log_path=os.path.join(logs, "prefill.log"), python=SERVE_PYTHON, env=env,
                               pythonpath=[sglang_plugins.PD_CPU], cwd=REPO)
        decodes = [SGLangServer(model, [*DECODE_ARGS, "--max-total-tokens", str(args.max_total_tokens), *PD_ARGS,
                                        *policy], log_path=os.path.join(logs, f"decode{index}.log"),
                                python=SERVE_PYTHON, env=env, pythonpath=[sglang_plugins.PD_CPU], cwd=REPO)
                   for index in range(DECODE_INSTANCES)]
        router = SGLangRouter(pd_router_args(prefill.url, bootstrap, [decode.url for decode in decodes], decode_policy),
                              python=SERVE_PYTHON, log_path=os.path.join(logs, "router.log"))
        started = time.monotonic()
        try:
            for server in (prefill, *decodes):
                server.start()
            router.start()
            time.sleep(3)  # the router's first load polls
            print(f"{cluster}: cluster up in {time.monotonic() - started:.0f} s", flush=True)
            for repetition, predictor in pending:
                out = run_dir(args, cluster, predictor, repetition)
                log_starts = [os.path.getsize(decode.log_path) for decode in decodes]
                sent = {"none": [], "oracle": ["--oracle-prediction"]}.get(
                    predictor, ["--predictions", os.path.join(args.runs_dir, f"predictions-{predictor}.jsonl")])
                began = time.monotonic()
                code = outlets(["bench-serving", "--base-url", router.url, "--through-router", "--dataset", dataset,
                                "--rate", str(args.rate), "--seed", str(repetition), "--tokenizer", model,
                                "--end-at-output-len", str(END_TOKEN_ID), "--max-new-tokens", str(MAX_NEW_TOKENS),
                                "--temperature", "0", "--short-threshold", str(SHORT_THRESHOLD), "--timeout", "1800",
                                "--label", f"{cluster} | {predictor}", "--output", out + ".partial"] + sent)
                if code != 0:
                    raise SystemExit(f"{cluster} | {predictor} #{repetition}: bench-serving exited {code}; "
                                     f"see {out}.partial and {logs}")
                retracted = 0
                for decode, start in zip(decodes, log_starts):
                    with open(decode.log_path, encoding="utf-8", errors="replace") as handle:
                        handle.seek(start)
                        retracted += sum(int(count) for count in RETRACTED.findall(handle.read()))
                write_text_atomic(os.path.join(out + ".partial", "retractions.json"),
                                  json.dumps({"retracted": retracted}))
                os.replace(out + ".partial", out)  # a run counts as done only when all of it is there
                print(f"{cluster} | {predictor} #{repetition}: {time.monotonic() - began:.0f} s, {retracted} retracted",
                      flush=True)
        finally:
            router.stop()
            for server in (prefill, *decodes):
                server.stop()


# -- 2. report --------------------------------------------------------------------------------------


def report(args) -> None:
    rows = []
    for cluster, (_, _, predictors) in CLUSTERS.items():
        for predictor in predictors:
            runs = finished_runs(run_dir(args, cluster, predictor, repetition) for repetition in range(args.repetitions))
            if runs:
                rows.append({"cluster": cluster, "predictor": predictor, "runs": runs})
    if not rows:
        raise SystemExit(f"no finished run under {args.runs_dir}; run the `run` stage first")
    result = {"command": "python benchmarks/pd_router_study.py " + " ".join(sys.argv[1:]),
              "requests": args.requests, "rate": args.rate, "seed": args.seed,
              "max_total_tokens_per_instance": args.max_total_tokens, "decode_instances": DECODE_INSTANCES,
              "rows": rows}
    os.makedirs(RESULTS, exist_ok=True)
    write_text_atomic(os.path.join(RESULTS, "result.json"), json.dumps(result, indent=1))
    write_text_atomic(os.path.join(RESULTS, "report.md"), render(result))
    print(render(result))


def paired_ratios(row: dict, baseline: dict, column: str) -> List[float]:
    """Per repetition (same arrivals: --seed is the repetition), this row's value over the baseline's."""
    return [run["metrics"][column] / base["metrics"][column] for run, base in zip(row["runs"], baseline["runs"])
            if run["metrics"][column] and base["metrics"][column]]


def render(result: dict) -> str:
    baseline = result["rows"][0]
    lines = [f"# 1 prefill + {result['decode_instances']} decode SGLang instances behind sglang-router 0.3.2 "
             f"({result['requests']} requests at {result['rate']:g} req/s, --max-total-tokens "
             f"{result['max_total_tokens_per_instance']} per instance)", "",
             f"`{result['command']}`. Median of the runs, [min-max]; in parentheses the median over repetitions of "
             f"the ratio to `{baseline['cluster']}` on the same arrivals.", "",
             "| cluster | predictions | runs | " + " | ".join(column for column, _ in METRICS) + " | retracted |",
             "|---|---|---:|" + "---:|" * (len(METRICS) + 1)]
    for row in result["rows"]:
        cells = []
        for column, _ in METRICS:
            values = [run["metrics"][column] for run in row["runs"] if run["metrics"][column] is not None]
            if not values:
                cells.append("n/a")
                continue
            ratios = paired_ratios(row, baseline, column) if row is not baseline else []
            ratio = f" (x{statistics.median(ratios):.2f})" if ratios else ""
            cells.append(f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]{ratio}")
        retracted = [run["retracted"] for run in row["runs"]]
        lines.append(f"| {row['cluster']} | {row['predictor']} | {len(row['runs'])} | " + " | ".join(cells)
                     + f" | {statistics.median(retracted):g} [{min(retracted)}-{max(retracted)}] |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stage", choices=("run", "report"))
    parser.add_argument("--runs-dir", default=RUNS_DIR)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--rate", type=float, default=2.0, help="Poisson arrivals, requests/s")
    parser.add_argument("--seed", type=int, default=0, help="which test requests are drawn")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--max-total-tokens", type=int, default=8192, help="KV cache tokens of each instance")
    parser.add_argument("--clusters", nargs="+", default=list(CLUSTERS), choices=list(CLUSTERS))
    args = parser.parse_args()
    {"run": run, "report": report}[args.stage](args)


if __name__ == "__main__":
    main()
