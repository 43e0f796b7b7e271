"""FCFS against `--schedule-policy outlets` on real SGLang servers on this CPU, with `outlets bench-serving`.

SmolLM2-135M-Instruct (float32) on SGLang 0.5.23 with the OUTLETS plugin in predictor-only mode
(`--outlets-draft-path`: the draft predicts each request's output length at prefill). A saturating
burst of real prompts, each generating exactly the length the target produced for it when it was
regenerated (`--fixed-output-len`), so every run does the same work and only the order differs.
Runs, one server at a time:

- 1 instance: `fcfs`; `outlets` with the draft's predictions only; `outlets` with the draft's r̂₀
  also sent with each request (`--predictions`, from `outlets eval`'s predictions/outlets.jsonl: what
  a PD prefill instance or a router would know before admission); optionally the oracle (the exact
  length as the prediction, upper bound).
- `--dp-size 2`: `fcfs` + round-robin routing, `outlets` + `--load-balance-method outlets`.

`outlets` runs use `--outlets-order` (default tail-safe, the plugin's default; `sjf` reproduces the
first measurement) with the long class starting at `--short-threshold` output tokens.

Every run loads the draft. In a colocated server r̂₀ exists only after a request's prefill, which
happens at admission, so with draft predictions alone the waiting queue is ordered by the prior
(arrival order): `outlets` can differ from `fcfs` there only through retraction, and across
data-parallel ranks through the predicted work of running requests. With external predictions
(`--predictions`, oracle) the draft's forward is skipped for requests that bring one. Writes one
bench-serving directory per run and `compare.md`/`compare.png` (`outlets compare-runs`) under --output.

    .venv/bin/python benchmarks/cpu_serving_study.py --draft DRAFT_DIR --regenerated REGEN.jsonl \
        --output runs/cpu-study

REGEN.jsonl is an `outlets regenerate` output the draft was not trained on (a test split). Needs
`make test` (both environments) and the converted SmolLM2 (`make demo` creates it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from specforge_outlets.cli import main as outlets  # noqa: E402
from tests.sglang_harness.server import SGLangServer, omp_bind_groups  # noqa: E402

SERVE_PYTHON = os.path.join(REPO, ".venv-serve", "bin", "python")
DEFAULT_MODEL = os.path.expanduser("~/.cache/specforge-outlets/smollm2-135m")

# (run name, data-parallel ranks, schedule policy, load-balance method, predictions sent by the client)
RUNS = (
    ("dp1-fcfs", 1, "fcfs", None, None),
    ("dp1-outlets", 1, "outlets", None, None),
    ("dp1-outlets-predicted", 1, "outlets", None, "file"),
    ("dp1-outlets-oracle", 1, "outlets", None, "oracle"),
    ("dp2-fcfs-round-robin", 2, "fcfs", "round_robin", None),
    ("dp2-outlets", 2, "outlets", "outlets", None),
)
DEFAULT_RUNS = ("dp1-fcfs", "dp1-outlets", "dp1-outlets-predicted", "dp2-fcfs-round-robin", "dp2-outlets")


def build_dataset(regenerated: str, path: str, limit: int, only_ids=None) -> int:
    """prompt + output_length (the target's own response length) per regenerated conversation."""
    rows = []
    with open(regenerated, encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            row = json.loads(line)
            turns = row["conversations"]
            if len(turns) < 2 or turns[0]["role"] != "user" or "num_tokens" not in turns[1]:
                continue
            if only_ids is not None and row["id"] not in only_ids:
                continue
            rows.append({"id": row["id"], "prompt": turns[0]["content"], "output_length": turns[1]["num_tokens"]})
    rows = rows[:limit]
    if not rows:
        raise SystemExit(f"{regenerated}: no regenerated conversation with a user turn and num_tokens")
    with open(path, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
    return len(rows)


def run() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draft", required=True, help="`outlets export` directory of a draft for the target")
    parser.add_argument("--regenerated", required=True, help="regenerated JSONL the draft was not trained on")
    parser.add_argument("--model-path", default=DEFAULT_MODEL, help="target model directory (converted SmolLM2)")
    parser.add_argument("--output", default="runs/cpu-study")
    parser.add_argument("--predictions", help="outlets eval's predictions/outlets.jsonl for these requests; "
                                              "the burst is then the requests it names")
    parser.add_argument("--num-requests", type=int, default=16)
    parser.add_argument("--max-running-requests", type=int, default=2,
                        help="per rank; fewer than the burst, so that a waiting queue forms")
    parser.add_argument("--short-threshold", type=int, default=128,
                        help="short requests: fewer output tokens (SmolLM2's answers here are < 400)")
    parser.add_argument("--runs", nargs="+", default=list(DEFAULT_RUNS), choices=[name for name, *_ in RUNS])
    parser.add_argument("--outlets-order", default="tail-safe", choices=["tail-safe", "sjf"],
                        help="waiting-queue order of the outlets runs (the plugin's --outlets-order)")
    args = parser.parse_args()
    for path, what in ((args.draft, "--draft"), (args.model_path, "--model-path")):
        if not os.path.isdir(path):
            raise SystemExit(f"{what} {path}: no such directory")
    if not os.path.exists(SERVE_PYTHON):
        raise SystemExit(f"no serve environment at {SERVE_PYTHON}; run `make test` first")

    os.makedirs(args.output, exist_ok=True)
    dataset = os.path.join(args.output, "burst.jsonl")
    only_ids = None
    if args.predictions:
        with open(args.predictions, encoding="utf-8") as handle:
            only_ids = {json.loads(line)["id"] for line in handle if line.strip()}
    elif "dp1-outlets-predicted" in args.runs:
        args.runs.remove("dp1-outlets-predicted")
    count = build_dataset(args.regenerated, dataset, args.num_requests, only_ids)
    print(f"burst of {count} requests from {args.regenerated}")
    done = []
    for name, ranks, policy, balance, sent in RUNS:
        if name not in args.runs:
            continue
        server_args = ["--schedule-policy", policy, "--max-running-requests", str(args.max_running_requests),
                       "--outlets-draft-path", os.path.abspath(args.draft), "--disable-radix-cache"]
        if policy == "outlets":
            server_args += ["--outlets-order", args.outlets_order, "--outlets-long-output-len", str(args.short_threshold)]
        env = {}
        if ranks > 1:
            server_args += ["--dp-size", str(ranks), "--load-balance-method", balance]
            env["SGLANG_CPU_OMP_THREADS_BIND"] = omp_bind_groups(ranks)
        out = os.path.join(args.output, name)
        shutil.rmtree(out, ignore_errors=True)
        started = time.monotonic()
        with SGLangServer(args.model_path, server_args, env=env, log_path=f"{out}.server.log",
                          python=SERVE_PYTHON) as server:
            print(f"{name}: server up in {server.start_seconds:.0f} s")
            code = outlets(["bench-serving", "--base-url", server.url, "--dataset", dataset, "--rate", "inf",
                            "--tokenizer", args.model_path, "--fixed-output-len", "--temperature", "0",
                            "--short-threshold", str(args.short_threshold), "--label", name, "--output", out]
                           + {None: [], "oracle": ["--oracle-prediction"], "file": ["--predictions", args.predictions]}[sent])
        print(f"{name}: exit {code}, {time.monotonic() - started:.0f} s")
        if code == 0:
            done.append(out)
    return outlets(["compare-runs", *done, "--output", args.output]) if done else 1


if __name__ == "__main__":
    raise SystemExit(run())
