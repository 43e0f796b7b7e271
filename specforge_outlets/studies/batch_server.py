"""An offline batch on real SGLang servers: SJF by OUTLETS r̂₀, its prefill-only pass charged, against SGLang's peers.

The simulator's regime map found one regime where a length prediction pays against SGLang's best
prediction-free configuration without a tail cost: an offline batch, every request submitted at once,
where the running slots (not the KV cache) bind, so the order of the queue decides who waits. This
checks it on real SGLang 0.5.23 servers on this CPU, with the KV-bound study's machinery
(``kv_bound_server``: the random 2-layer Llama with SmolLM2's tokenizer, the label set's real prompts,
each request generating exactly its recorded length, the scheduler pinned to a core of its own):

- **Requests**: ``--requests`` of the label set's prompt samples (the ladder's seeded draw,
  ``write_workload(..., ladder=True)``), sent to one server in the dataset's order at ``--rate`` (Poisson,
  seeded: the same gaps every session; the default ``BATCH_RATE`` lands the whole batch in about a second).
- **Slots bind, not KV**: ``--max-running-requests`` well below the batch, and a cache of
  ``--max-running-requests`` x (the longest prompt + the 2,048-token cap) tokens plus every prompt and output
  of the batch (``kv_room``), so that SGLang's admission (a new request charged its prompt and its whole
  ``max_new_tokens``) never waits for KV, and the finished requests' sequences, which the radix cache keeps,
  never evict a prompt the pass left there (LRU would, in a smaller cache); the report reads the servers' own
  log lines for the peak token usage and running count, and the prefix-cache hits.
- **r̂₀ before the first admission, charged**: before the batch, the outlets servers get a prefill-only
  pass (every prompt once, ``max_new_tokens`` 1), timed. The radix cache is on for every server, so the
  pass leaves each prompt's KV in the prefix cache. The pass sends every prompt at once (``PASS_RATE``): its
  order decides nothing (every prompt ends in the cache) and at once it is as short as it can be. Two views:
  **charged**, every request's TTFT, end-to-end and the makespan counted from the batch's submission (the
  first request's send; for the outlets runs the pass's start before it, its cost charged in full), which is
  what a user who hands the server a batch waits; **free**, each request's from its own send, as bench-serving
  records it, with no pass (a lower bound for the outlets runs). The prediction-free servers' two views differ
  only by the client's stagger (each request's send after the first, 0.6 s on average at ``BATCH_RATE``). The
  predictions the client sends are the committed OUTLETS r̂₀ of each prompt, the value the draft reads at the prompt's last token, which is what the pass
  would return; predictor-only mode (the draft in the server) needs SmolLM2 itself as the target, too slow
  on this CPU for a batch. Every run starts from an empty cache (``/flush_cache``).
- **Servers and rungs**: SGLang's ``fcfs`` (its default) twice (the second, in its own sessions, is the A/A
  control), ``lof`` (every request asks the same cap, so it orders as FCFS), and the plugin's SJF by r̂₀
  with SGLang's own KV charge (only the order differs) fed a constant (the train split's median), OUTLETS
  r̂₀ shuffled across the requests (seeded), OUTLETS r̂₀ and the oracle (the recorded length); and
  longest-predicted-first with OUTLETS r̂₀ (the makespan). Every repetition starts a fresh session of each
  server, in an order rotated by one each time.
- **Arrival order**: requests sent all at once (``--rate inf``) reach the scheduler in the order their
  connections land, a rotation of the client's order that differs per session, and each server's first round
  admits what has arrived before the rest; so every FCFS session was another random order of the batch's lengths
  (``benchmarks/data/batch-server``: the A/A control 0.85-0.99x of fcfs's mean TTFT). Sent at ``BATCH_RATE``
  instead, the client sends in the dataset's order with the seed's gaps (``poisson_arrivals``: the same
  cumulative times every session), 10 ms apart on average, so they reach the scheduler in that order and every
  FCFS session serves the same order; the batch still lands in about a second, far below one request's service
  (tens of seconds at 16 running), so the queue the order acts on is the whole batch all the same. SGLang's
  ``lof`` orders as FCFS here (every request asks the same ``max_new_tokens``), so ``--servers`` may leave it out.

Stages, each resumable (a finished run is kept and skipped); the defaults are the ordered study
(``benchmarks/data/batch-server-ordered``):

    .venv/bin/python benchmarks/batch_server_study.py run --runs-dir /work/outlets-runs/batch-server-ordered \
        --servers fcfs "fcfs (A/A control)" "outlets sjf"
    .venv/bin/python benchmarks/batch_server_study.py report --runs-dir /work/outlets-runs/batch-server-ordered
    .venv/bin/python benchmarks/batch_server_study.py plot

The first study, sent all at once with every server (``benchmarks/data/batch-server``): ``run --rate inf
--runs-dir /work/outlets-runs/batch-server``, then ``report`` and ``plot`` with ``--results
benchmarks/data/batch-server --figure docs/figures/batch-server.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import os
import random
import re
import statistics
import sys
import time
from typing import Dict, List, Optional, Sequence

from specforge_outlets.atomic import write_text_atomic
from specforge_outlets.data.jsonl import BadLine, iter_jsonl, write_jsonl
from specforge_outlets.loadgen.bench_command import summarize_records
from specforge_outlets.loadgen.client import RequestRecord
from specforge_outlets.serving.summary import read_summary
from specforge_outlets.studies.committed_data import REPO
from specforge_outlets.studies.kv_bound_server import (
    MAX_NEW_TOKENS, OUTLETS, RETRACTED, SGLANG_KV_CHARGE, SHORT_THRESHOLD, log_since, make_target, pinned_server,
    predictions_path, predictions_sent, send_dataset, slug, write_workload,
)

RUNS_DIR = os.path.join(REPO, "runs", "batch-server-ordered")
RESULTS = os.path.join(REPO, "benchmarks", "data", "batch-server-ordered")
FIGURE = os.path.join(REPO, "docs", "figures", "batch-server-ordered.png")
# the batch: 120 of the label set's samples (87k output tokens) take about 3.5 minutes at the ~450 tokens/s
# measured on a first fcfs run at 16 and at 32 running (the scheduler's cost per token sets the pace)
DEFAULT_REQUESTS = 120
DEFAULT_MAX_RUNNING = 16  # running slots, an eighth of the batch: the queue holds the rest
SHUFFLED = "shuffled"  # OUTLETS r̂₀ permuted across the drawn requests: its values without its ranking
PREFILL_ONLY = ["--max-new-tokens", "1"]  # the pass: each prompt's prefill and one token
# server name -> its flags; the radix cache stays on for all (the pass's prefixes are reused)
SERVERS: Dict[str, List[str]] = {
    "fcfs": ["--schedule-policy", "fcfs"],
    # the A/A control: fcfs again in sessions of its own, the spread between two sessions of one policy
    "fcfs (A/A control)": ["--schedule-policy", "fcfs"],
    # SGLang's longest-output-first reads max_new_tokens, the same cap for every request here
    "lof": ["--schedule-policy", "lof"],
    "outlets sjf": OUTLETS + ["--outlets-order", "sjf"] + SGLANG_KV_CHARGE,
    "outlets longest-predicted-first": OUTLETS + ["--outlets-order", "longest-predicted-first"] + SGLANG_KV_CHARGE,
}
# the servers that order by a prediction: the rungs each is fed, every run after its prefill-only pass
RUNGS: Dict[str, tuple] = {
    "outlets sjf": ("constant", SHUFFLED, "outlets", "oracle"),
    "outlets longest-predicted-first": ("outlets",),
}
PEERS = ("fcfs", "lof")  # SGLang's prediction-free configurations: the best of them is the aim's peer
# flags every server gets: the client's end-at-length processor, no warmup, an idle scheduler that sleeps
SERVER_ARGS = ["--enable-custom-logit-processor", "--skip-server-warmup", "--sleep-on-idle"]
AIM_MEAN_TTFT = 0.85  # issue 45's aim: mean TTFT at or below this ratio to the peer, the pass charged,
AIM_TAILS = 1.0  # with P99 TTFT, short and long P99 at or below this one
# the batch's Poisson rate: 120 requests land in about 1.2 s, 10 ms apart on average (the scheduler's decode
# step at 16 running takes ~35 ms), far below one request's service (tens of s), and in the dataset's order
BATCH_RATE = 100.0
PASS_RATE = math.inf  # the prefill-only pass all at once: its order decides nothing, and it is charged in full
# first tokens of one prefill batch reach the client within a few ms of each other; a request admitted a decode
# step (~35 ms at 16 running) or more before one sent ahead of it was out of order at the scheduler
ORDER_TOLERANCE_S = 0.05
SEED_SHUFFLE = 1  # the shuffled rung's permutation, apart from the draw's --seed
# the server's own log lines: running requests and KV use at each logged step, prefix-cache hits at each prefill
RUNNING = re.compile(r"#running-req: (\d+)")
TOKEN_USAGE = re.compile(r"token usage: ([\d.]+)")
CACHED = re.compile(r"#cached-token: (\d+)")
DECODE_PACE = re.compile(r"Decode batch, #running-req: (\d+),.*?gen throughput \(token/s\): ([\d.]+)")


def rungs_of(server_name: str) -> tuple:
    """The predictions each server is sent: the prediction-free servers none."""
    return RUNGS.get(server_name, ("none",))


def shuffled_rows(rows: Sequence[dict], seed: int) -> List[dict]:
    """``rows`` (id, predicted_output_len) with the predictions permuted across the ids by ``seed``."""
    values = [row["predicted_output_len"] for row in rows]
    random.Random(seed).shuffle(values)
    return [{"id": row["id"], "predicted_output_len": value} for row, value in zip(rows, values)]


def read_rows(path: str) -> List[dict]:
    """The rows of a JSONL file this study wrote; a damaged one is refused, naming its line."""
    rows = [row for _, row in iter_jsonl(path)]
    bad = next((row for row in rows if isinstance(row, BadLine)), None)
    if bad is not None:
        raise SystemExit(f"{bad}; delete the run (or the drawn workload) and run it again")
    return rows


def write_shuffled(directory: str) -> None:
    """predictions-shuffled.jsonl beside the drawn requests' OUTLETS r̂₀ (written once)."""
    path = predictions_path(directory, SHUFFLED)
    if not os.path.exists(path):
        write_jsonl(path, shuffled_rows(read_rows(predictions_path(directory, "outlets")), SEED_SHUFFLE))


def kv_room(dataset: str, model: str, max_running: int) -> int:
    """Cache tokens under which KV decides nothing: SGLang's admission never waits for it (each running request
    charged its prompt and its whole cap, the batch's longest prompt in the chat template the client sends), and
    the finished requests' sequences, which the radix cache keeps, never evict a prompt the pass left there
    (room for every prompt and output of the batch besides)."""
    from specforge_outlets.loadgen.workload import load_dataset_workload, load_tokenizer

    requests = load_dataset_workload(dataset, math.inf, MAX_NEW_TOKENS, load_tokenizer(model)).requests
    longest = max(len(request.input_ids) for request in requests)
    return (max_running * (longest + MAX_NEW_TOKENS)
            + sum(len(request.input_ids) + request.expected_output_len for request in requests))


# -- 1. run -----------------------------------------------------------------------------------------


def check_config(runs_dir: str, chosen: dict) -> None:
    """One runs directory holds one configuration: its first run records it, a later one must match."""
    path = os.path.join(runs_dir, "config.json")
    if not os.path.exists(path):
        write_text_atomic(path, json.dumps(chosen))
        return
    with open(path) as handle:
        recorded = json.load(handle)
    recorded.setdefault("rate", math.inf)  # recorded before --rate existed: its batches were sent all at once
    if recorded != chosen:
        raise SystemExit(f"{runs_dir} holds runs of {recorded}, not {chosen}: pass another --runs-dir for these")


def study_config(args, max_total_tokens: int) -> dict:
    """What makes two runs comparable: the batch, its draw, the slots, the cache and the rate it is sent at."""
    return {"requests": args.requests, "seed": args.seed, "max_running": args.max_running,
            "max_total_tokens": max_total_tokens, "rate": args.rate}


def run(args) -> None:
    os.makedirs(args.runs_dir, exist_ok=True)
    dataset = write_workload(args.runs_dir, args.requests, args.seed, ladder=True)
    write_shuffled(args.runs_dir)
    model = make_target(os.path.join(args.runs_dir, "target"))
    max_total_tokens = args.max_total_tokens or kv_room(dataset, model, args.max_running)
    check_config(args.runs_dir, study_config(args, max_total_tokens))
    common = ["--max-running-requests", str(args.max_running), "--max-total-tokens", str(max_total_tokens),
              *SERVER_ARGS]
    for repetition in range(args.repetitions):
        # a fresh session of every server per repetition, servers and rungs in an order rotated by one each time
        for server_name in rotated(args.servers, repetition):
            pending = [rung for rung in rotated(rungs_of(server_name), repetition)
                       if not os.path.exists(os.path.join(run_dir(args.runs_dir, server_name, rung, repetition),
                                                          "summary.json"))]
            if pending:
                log_path = os.path.join(args.runs_dir, "logs", f"{slug(server_name)}.rep{repetition}.server.log")
                with pinned_server(model, common + SERVERS[server_name], log_path) as server:
                    print(f"{server_name} #{repetition}: server up in {server.start_seconds:.0f} s", flush=True)
                    for rung in pending:
                        run_batch(args, server, server_name, rung, repetition, dataset, model, log_path)


def rotated(items: Sequence, shift: int) -> list:
    shift %= len(items)
    return list(items[shift:]) + list(items[:shift])


def run_batch(args, server, server_name: str, rung: str, repetition: int, dataset: str, model: str,
              log_path: str) -> None:
    """One batch from an empty cache: the prefill-only pass first where the server orders by a prediction."""
    out = run_dir(args.runs_dir, server_name, rung, repetition)
    partial = out + ".partial"
    label = f"{server_name} | {rung}"
    flush_cache(server.url)
    log_start = os.path.getsize(log_path)
    started = time.monotonic()
    pass_s = 0.0
    if server_name in RUNGS:
        send_dataset(server.url, dataset, model, os.path.join(partial, "pass"), f"{label} (prefill-only pass)",
                     PASS_RATE, args.seed, [], PREFILL_ONLY)
        pass_s = read_summary(os.path.join(partial, "pass"))["duration_s"]
    send_dataset(server.url, dataset, model, partial, label, args.rate, args.seed,
                 predictions_sent(args.runs_dir, rung))
    write_text_atomic(os.path.join(partial, "pass.json"), json.dumps({"pass_s": pass_s}))
    write_text_atomic(os.path.join(partial, "server.log"), log_since(log_path, log_start))
    os.replace(partial, out)  # a run counts as done only when all of it is there
    print(f"{label} #{repetition}: {time.monotonic() - started:.0f} s (pass {pass_s:.1f} s)", flush=True)


def flush_cache(url: str) -> None:
    """Empty the server's prefix cache (SGLang's ``/flush_cache``; it refuses while requests run)."""
    import urllib.request

    with urllib.request.urlopen(urllib.request.Request(f"{url}/flush_cache", data=b"", method="POST"),
                                timeout=60) as response:
        if response.status != 200:
            raise SystemExit(f"{url}/flush_cache answered {response.status}; the server is not idle")


def run_dir(runs_dir: str, server_name: str, rung: str, repetition: int) -> str:
    return os.path.join(runs_dir, slug(server_name), slug(rung), f"rep{repetition}")


# -- 2. report --------------------------------------------------------------------------------------

METRICS = (  # (column, class, key in summarize_records' metrics); makespan is added per run
    ("mean TTFT s", "all", "ttft_mean_s"),
    ("P50 TTFT s", "all", "ttft_p50_s"),
    ("P99 TTFT s", "all", "ttft_p99_s"),
    ("mean e2e s", "all", "e2e_mean_s"),
    ("P99 e2e s", "all", "e2e_p99_s"),
    ("short P99 s", "short", "e2e_p99_s"),
    ("long P99 s", "long", "e2e_p99_s"),
    ("throughput tok/s", "all", "throughput_tok_s"),
)
MAKESPAN = "makespan s"
COLUMNS = tuple(column for column, _, _ in METRICS) + (MAKESPAN,)
AIM_COLUMNS = {"mean TTFT s": AIM_MEAN_TTFT, "P99 TTFT s": AIM_TAILS, "short P99 s": AIM_TAILS, "long P99 s": AIM_TAILS}
# the outlets runs counted from the pass's start, from the batch's, and from the pass's start at the fcfs runs' pace
VIEWS = ("charged", "free", "charged, pace-adjusted")
PACED = VIEWS[2]
REQUESTS = "requests.jsonl.gz"  # beside the report: every request of every run
THROUGHPUT = "throughput tok/s"


def from_submission(records: Sequence[RequestRecord]) -> List[RequestRecord]:
    """``records`` as if each was sent with the first: its latencies counted from the batch's submission."""
    first = min(record.sent_s for record in records)
    return [dataclasses.replace(record, sent_s=first, e2e_s=record.e2e_s + record.sent_s - first,
                                ttft_s=None if record.ttft_s is None else record.ttft_s + record.sent_s - first)
            for record in records]


def batch_metrics(records: Sequence[RequestRecord], charge_s: float) -> Dict[str, float]:
    """The report's columns of one batch, each request's latencies counted from ``charge_s`` before it was sent."""
    metrics = summarize_records(records, SHORT_THRESHOLD, charge_s=charge_s)
    values = {column: float(metrics[cls][key]) for column, cls, key in METRICS}
    values[MAKESPAN] = (max(record.sent_s + record.e2e_s for record in records)
                        - min(record.sent_s for record in records) + charge_s)
    return values


def out_of_order(records: Sequence[RequestRecord]) -> int:
    """Pairs of requests whose first tokens came in the other order than their sends (the dataset's order where
    sends tie), by more than ``ORDER_TOLERANCE_S``: under FCFS, the pairs the scheduler received out of the
    client's order; under SJF, what the order moved."""
    first = [record.sent_s + record.ttft_s for record in sorted(records, key=lambda record: record.sent_s)]
    return sum(later < earlier - ORDER_TOLERANCE_S for index, earlier in enumerate(first)
               for later in first[index + 1:])


def server_load(server_log: str) -> dict:
    """What the server's own lines say of a run: peak running requests and KV use, prefix hits, retractions, and
    its pace: the median output tokens/s of its logged decode steps with every slot running (the machine's
    speed, which other processes on this CPU move between runs, apart from the order's)."""
    steps = [(int(running), float(rate)) for running, rate in DECODE_PACE.findall(server_log)]
    full = max((running for running, _ in steps), default=None)
    return {"pace_tok_s": statistics.median(rate for running, rate in steps if running == full) if steps else None,
            "max_running": max(map(int, RUNNING.findall(server_log)), default=None),
            "max_token_usage": max(map(float, TOKEN_USAGE.findall(server_log)), default=None),
            "cached_tokens": sum(map(int, CACHED.findall(server_log))),
            "retracted": sum(map(int, RETRACTED.findall(server_log)))}


def read_run(out: str) -> Optional[dict]:
    """A finished run's columns, charged and free, its pass and its server's load (None: not finished)."""
    if not os.path.exists(os.path.join(out, "summary.json")):
        return None
    records = [RequestRecord(**row) for row in read_rows(os.path.join(out, "requests.jsonl"))]
    failed = sum(not record.success for record in records)
    if failed:
        raise SystemExit(f"{out}: {failed} of {len(records)} requests failed; delete the run and run it again")
    with open(os.path.join(out, "pass.json")) as handle:
        pass_s = json.load(handle)["pass_s"]
    with open(os.path.join(out, "server.log"), encoding="utf-8", errors="replace") as handle:
        load = server_load(handle.read())
    return {"pass_s": pass_s, "requests": len(records), "charged": batch_metrics(from_submission(records), pass_s),
            "free": batch_metrics(records, 0.0), "load": load, "out_of_order": out_of_order(records)}


def pace_adjusted(run: dict, reference_tok_s: float) -> Dict[str, float]:
    """A run's charged columns as at the ``reference_tok_s`` pace: each time scaled by its pace over the reference."""
    scale = run["load"]["pace_tok_s"] / reference_tok_s
    return {column: value / scale if column == THROUGHPUT else value * scale
            for column, value in run["charged"].items()}


def report(args) -> None:
    with open(os.path.join(args.runs_dir, "config.json")) as handle:
        config = json.load(handle)
    rows, finished = [], []
    for server_name in SERVERS:
        for rung in rungs_of(server_name):
            outs = (run_dir(args.runs_dir, server_name, rung, repetition) for repetition in range(args.repetitions))
            runs = {out: found for out, found in ((out, read_run(out)) for out in outs) if found}
            finished += runs
            if runs:
                rows.append({"server": server_name, "rung": rung, "runs": list(runs.values())})
    if not any(row["server"] == "fcfs" for row in rows):
        raise SystemExit(f"no finished fcfs run under {args.runs_dir}: run the `run` stage first")
    reference = statistics.median(run["load"]["pace_tok_s"] for run in find(rows, "fcfs")["runs"])
    for row in rows:
        for found in row["runs"]:
            found[PACED] = pace_adjusted(found, reference)
    result = {"command": "python benchmarks/batch_server_study.py " + " ".join(sys.argv[1:]), **config,
              "model": "random 2-layer Llama with SmolLM2's tokenizer", "rows": rows}
    result["verdict"] = verdict(rows)
    os.makedirs(args.results, exist_ok=True)
    write_requests(args.runs_dir, sorted(finished), os.path.join(args.results, REQUESTS))
    write_text_atomic(os.path.join(args.results, "result.json"), json.dumps(result, indent=1))
    write_text_atomic(os.path.join(args.results, "report.md"), render(result))
    print(render(result))


def write_requests(runs_dir: str, outs: Sequence[str], path: str) -> None:
    """Every request of the finished runs ``outs`` as the client recorded it, without the token gaps and url, with its
    run and the run's pass (gzipped, reproducible: no timestamp in the header)."""
    lines = []
    for out in outs:
        with open(os.path.join(out, "pass.json")) as handle:
            pass_s = json.load(handle)["pass_s"]
        for row in read_rows(os.path.join(out, "requests.jsonl")):
            for dropped in ("itl_s", "url"):  # the gaps are bulky, the port changes per session
                row.pop(dropped, None)
            lines.append(json.dumps({"run": os.path.relpath(out, runs_dir), "pass_s": pass_s, **row}) + "\n")
    with open(path, "wb") as handle:
        handle.write(gzip.compress("".join(lines).encode(), mtime=0))


def median_of(row: dict, view: str, column: str) -> float:
    return statistics.median(run[view][column] for run in row["runs"])


def find(rows: Sequence[dict], server: str, rung: str = "none") -> Optional[dict]:
    return next((row for row in rows if row["server"] == server and row["rung"] == rung), None)


def ratio(row: dict, base: dict, view: str, column: str) -> tuple:
    """``row``'s median over ``base``'s median in ``view``, and the runs' [min, max] over the same."""
    reference = median_of(base, view, column)
    values = [run[view][column] / reference for run in row["runs"]]
    return median_of(row, view, column) / reference, min(values), max(values)


def verdict(rows: Sequence[dict]) -> dict:
    """Issue 45's aim against the best prediction-free peer of each view and the ladder's order on mean TTFT,
    each with the ratios they rest on (medians), and the A/A control's ratios to fcfs beside them."""
    peers = [row for row in (find(rows, name) for name in PEERS) if row]
    outlets = find(rows, "outlets sjf", "outlets")
    control = find(rows, "fcfs (A/A control)")
    found = {}
    for view in VIEWS:
        peer = min(peers, key=lambda row: median_of(row, view, "mean TTFT s"))
        found[f"peer ({view})"] = peer["server"]
        if control:  # the spread between two sessions of one policy, beside every ratio
            found[f"A/A ({view})"] = {column: ratio(control, find(rows, "fcfs"), view, column)[0]
                                      for column in AIM_COLUMNS}
        if outlets:
            ratios = {column: ratio(outlets, peer, view, column)[0] for column in AIM_COLUMNS}
            found[f"aim ({view})"] = {"ratios": ratios,
                                      "holds": all(ratios[column] <= bound for column, bound in AIM_COLUMNS.items())}
        means = {rung: median_of(row, view, "mean TTFT s") for rung in RUNGS["outlets sjf"]
                 if (row := find(rows, "outlets sjf", rung))}
        if len(means) == len(RUNGS["outlets sjf"]):
            found[f"order ({view})"] = {
                "mean TTFT s": means,
                "constant >= shuffled": means["constant"] >= means[SHUFFLED],
                "constant >= outlets >= oracle": means["constant"] >= means["outlets"] >= means["oracle"]}
    return found


def sent_as(result: dict) -> str:
    """How the batch was sent (a result written before ``--rate`` existed sent it all at once)."""
    rate = result.get("rate", math.inf)
    return "at once" if math.isinf(rate) else f"sent in order at {rate:g}/s"


def render(result: dict) -> str:
    rows = result["rows"]
    fcfs = find(rows, "fcfs")
    lines = [f"# Offline batch on real SGLang servers ({result['requests']} requests {sent_as(result)}, "
             f"--max-running-requests {result['max_running']}, --max-total-tokens {result['max_total_tokens']})", "",
             f"`{result['command']}`; {result['model']}. Each cell: the median over repetitions [min-max], then its "
             "ratio to fcfs's median (xR [min-max of the runs' ratios]). Charged: every request counted from the "
             "batch's submission (the first request's send; for the outlets runs the start of their prefill-only pass "
             "before it); free: each request from its own send, the pass left out (a lower bound); "
             "charged, pace-adjusted: charged, each run's times scaled by its pace (the median output tokens/s of its "
             "logged decode steps with every slot running) over the fcfs runs' median pace, so that what other "
             "processes on this CPU did to a run's speed is taken out of the order's effect. The prediction-free "
             "servers have no pass: their charged and free views differ only by the client's stagger.", ""]
    for view in VIEWS:
        lines += [f"## {view}", "", "| server | rung | runs | " + " | ".join(COLUMNS) + " |",
                  "|---|---|---:|" + "---:|" * len(COLUMNS)]
        for row in rows:
            cells = []
            for column in COLUMNS:
                values = [run[view][column] for run in row["runs"]]
                cell = f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]"
                if row is not fcfs:
                    cell += " (x{:.2f} [{:.2f}-{:.2f}])".format(*ratio(row, fcfs, view, column))
                cells.append(cell)
            lines.append(f"| {row['server']} | {row['rung']} | {len(row['runs'])} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## The prefill-only pass and the servers' load", "",
              "First tokens out of send order: pairs of requests (of n(n-1)/2) whose first tokens came in the other "
              f"order than their sends by more than {ORDER_TOLERANCE_S:g} s (`out_of_order`); for the FCFS servers the "
              "pairs the scheduler received out of the client's order, for SJF what the order moved.", "",
              "| server | rung | pass s | pass share of charged makespan | pace tok/s | max running | max token usage | "
              "prefix-cached tokens | retracted | first tokens out of send order |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        passes = [run["pass_s"] for run in row["runs"]]
        shares = [run["pass_s"] / run["charged"][MAKESPAN] for run in row["runs"]]
        loads = [run["load"] for run in row["runs"]]
        lines.append(f"| {row['server']} | {row['rung']} | {statistics.median(passes):.1f} "
                     f"[{min(passes):.1f}-{max(passes):.1f}] | {statistics.median(shares):.1%} | "
                     f"{statistics.median(load['pace_tok_s'] for load in loads):.0f} "
                     f"[{min(load['pace_tok_s'] for load in loads):.0f}-{max(load['pace_tok_s'] for load in loads):.0f}] | "
                     f"{max((load['max_running'] or 0) for load in loads)} | "
                     f"{max((load['max_token_usage'] or 0) for load in loads):.2f} | "
                     f"{statistics.median(load['cached_tokens'] for load in loads):.0f} | "
                     f"{sum(load['retracted'] for load in loads)} | "
                     + ", ".join(str(run["out_of_order"]) for run in row["runs"]) + " |")
    found = result["verdict"]
    lines += ["", "## Verdict (peer: the best prediction-free server of each view by mean TTFT)", ""]
    for view in VIEWS:
        if f"aim ({view})" in found:
            aim = found[f"aim ({view})"]
            lines.append(f"- aim, {view}, against SGLang `{found[f'peer ({view})']}`: "
                         f"{'holds' if aim['holds'] else 'does not hold'} ("
                         + ", ".join(f"{column} x{value:.2f}" for column, value in aim["ratios"].items())
                         + f"; needs mean TTFT <= x{AIM_MEAN_TTFT}, the tails <= x{AIM_TAILS})"
                         + (f"; the A/A control, fcfs against fcfs: " + ", ".join(
                             f"x{value:.2f}" for value in found[f"A/A ({view})"].values())
                            if f"A/A ({view})" in found else ""))
        if f"order ({view})" in found:
            order = found[f"order ({view})"]
            lines.append(f"- mean TTFT, {view}: " + ", ".join(f"{rung} {value:.1f} s" for rung, value in
                                                                    order["mean TTFT s"].items())
                         + f"; constant >= shuffled: {order['constant >= shuffled']}, constant >= outlets >= oracle: "
                         f"{order['constant >= outlets >= oracle']}")
    return "\n".join(lines) + "\n"


# -- 3. plot ----------------------------------------------------------------------------------------

PLOTTED = ("mean TTFT s", "P99 TTFT s", "short P99 s", "long P99 s", MAKESPAN)


def plot(args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(os.path.join(args.results, "result.json")) as handle:
        result = json.load(handle)
    rows = [row for row in result["rows"] if row["server"] != "fcfs"]
    fcfs = find(result["rows"], "fcfs")
    fig, axes = plt.subplots(1, len(PLOTTED), figsize=(3.6 * len(PLOTTED), 4.5), sharey=True)
    for axis, column in zip(axes, PLOTTED):
        for view, offset, color in zip(VIEWS, (-0.27, 0.0, 0.27), ("C0", "C1", "C2")):
            found = [ratio(row, fcfs, view, column) for row in rows]
            axis.barh([index + offset for index in range(len(rows))], [value - 1 for value, _, _ in found], left=1,
                      height=0.27, color=color, label=view,
                      xerr=[[value - low for value, low, _ in found], [high - value for value, _, high in found]])
        axis.axvline(1.0, color="0.3", linewidth=0.8)
        if column in AIM_COLUMNS:
            axis.axvline(AIM_COLUMNS[column], color="C3", linestyle="--", linewidth=0.8)
        axis.set(title=column.replace(" s", ""), xlabel="ratio to fcfs")
    axes[0].set_yticks(range(len(rows)), [f"{row['server']}\n{row['rung']}" for row in rows], fontsize=7)
    axes[0].invert_yaxis()
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Offline batch on real SGLang servers on CPU: {result['requests']} label-set requests "
                 f"{sent_as(result)}, "
                 f"{result['max_running']} running (median, range over repetitions; dashed: issue 45's aim)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(args.figure, dpi=110)
    print(f"wrote {args.figure}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stage", choices=("run", "report", "plot"))
    parser.add_argument("--runs-dir", default=RUNS_DIR)
    parser.add_argument("--requests", type=int, default=DEFAULT_REQUESTS)
    parser.add_argument("--seed", type=int, default=0, help="the draw of the requests (the ladder's)")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--max-running", type=int, default=DEFAULT_MAX_RUNNING,
                        help="--max-running-requests of every server: the slots that bind")
    parser.add_argument("--max-total-tokens", type=int,
                        help="KV cache tokens (default: enough that admission never waits for KV, kv_room)")
    parser.add_argument("--rate", type=float, default=BATCH_RATE,
                        help="the batch's Poisson rate in requests/s, sent in the dataset's order (inf: all at once, "
                             "in the order the connections land)")
    parser.add_argument("--servers", nargs="+", default=list(SERVERS), choices=list(SERVERS))
    parser.add_argument("--results", default=RESULTS)
    parser.add_argument("--figure", default=FIGURE)
    args = parser.parse_args()
    if not args.rate > 0:
        parser.error(f"--rate must be a positive number of requests/s (inf: all at once), got {args.rate}")
    if args.requests <= args.max_running:
        parser.error(f"--requests {args.requests} must exceed --max-running {args.max_running}: "
                     "a batch that fits the slots at once has no queue to order")
    {"run": run, "report": report, "plot": plot}[args.stage](args)
