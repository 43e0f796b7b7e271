"""Real SGLang servers whose KV cache binds: admission and retraction under learned predictions.

The simulated study (``serving_study_sharegpt.py``) found that where the KV cache binds, admission by
predicted length is where predictions pay. This checks it on real SGLang 0.5.23 servers on this CPU,
side by side with SGLang's own ``fcfs`` and ``lof``:

- **Requests**: ``--requests`` of the label set's 595 ShareGPT test requests (seeded draw), each with
  its real first-turn prompt (from the shared data, never copied: ``committed_data.shared``) in
  SmolLM2's chat template, and
  each generating exactly the length SmolLM2 gave it at regeneration, under the label set's
  ``max_new_tokens`` cap of 2048 (``outlets bench-serving --end-at-output-len``: the server ends the
  request there, so neither ``lof`` nor SGLang's reservation learns the lengths). All at once, or
  with Poisson arrivals at ``--rate`` requests/s (seeded by ``--seed``: every run sends at the same
  times; one ``--runs-dir`` holds one rate).
- **Target**: a random 2-layer Llama with SmolLM2's tokenizer and vocabulary (``--model-path``
  takes SmolLM2 itself, at 5-30 tokens/s here). Its forward costs little, so a run takes seconds,
  and the scheduler's admission, retraction and order decide the latencies, as on a GPU whose
  decode step costs about the same at any batch size. The work (prompt and output tokens) is
  the real workload's.
- **Cores**: the server's scheduler runs one thread on a core of its own (``pin_server``), the client
  and the server's other processes on the other; a run's pace, its decode steps' time against a fit
  to every fcfs run (``simulator_vs_server.py``), shows whether the machine slowed it.
- **KV cache**: ``--max-total-tokens`` tokens (default 8,192; the requests' prompts and outputs
  need about three times that in all). SGLang's admission reserves ``new_token_ratio`` (0.7,
  decaying) of each running request's remaining ``max_new_tokens``, so with the 2,048 cap only a
  few run at once; the plugin's admission by prediction reserves the predicted remaining length
  instead, and SGLang retracts when the cache overflows.
- **Servers**: ``fcfs`` (twice: the second, an A/A control, measures the spread between sessions of
  one policy), ``lof``, and ``--schedule-policy outlets`` with ``--outlets-order``
  ``tail-safe`` (the default) and ``sjf``, each with SGLang's own KV charge (``--outlets-kv-admission sglang``)
  and with KV admission by prediction (``--outlets-kv-admission predicted --outlets-kv-margin 0.2``, the
  plugin's default until the predicted peak replaced it). Two more read each request's predicted quantiles (``--outlets-quantile-levels``, the distribution
  record's): ``sjf`` ordered by the Gittins rank (``--outlets-order-key gittins``) with KV admission
  by prediction, and ``tail-safe`` with KV admission charging the remaining length's median
  (``--outlets-kv-admission quantile --outlets-kv-quantile 0.5``). Every outlets server names its admission on its command line, so a
  change of the plugin's default cannot relabel a row.
- **Predictions** sent with each request (``custom_params``, what a router or prefill instance
  would send): none (the prior), the best static baseline (``bert``), OUTLETS r̂₀ (both from
  ``benchmarks/data/sharegpt-smollm2/eval/predictions.jsonl.gz``), the exact length (oracle), and
  for the quantile servers only, ``outlets quantiles``: the detached quantile draft's r̂₀ and
  total-length quantiles (the conformal correction's where the record has it) from
  ``eval/distribution/detached-predictions.jsonl.gz``
  (a drawn request it lacks gets the committed OUTLETS r̂₀ alone).
  Predictor-only mode (the draft predicting inside the server) needs SmolLM2's features, so it
  runs only with ``--model-path`` SmolLM2 and ``--draft``.

``--ladder`` (the ladder of predictors, its own ``--runs-dir``): requests drawn from the label
set's four samples per prompt (the test response and three regenerated ones, as
``predictor_ladder.py`` draws them), each generating that sample's length, and the peak (the
plugin's default) and the charge run with none, a constant (the train split's median), OUTLETS r̂₀,
the per-prompt ceiling (the mean of the prompt's other samples) and the oracle, beside fcfs:

    .venv/bin/python benchmarks/kv_bound_server_study.py run --ladder --runs-dir runs/kv-bound-ladder \
        --requests 300 --max-total-tokens 16384 --repetitions 3 \
        --servers fcfs "fcfs (A/A control)" "outlets tail-safe + KV by the predicted peak" \
        "outlets tail-safe + KV by prediction"

Every (server, predictor) runs ``--repetitions`` times: each repetition starts a fresh session of
every server, in an order rotated by one each time, and runs its predictors one after another; the
report gives the median and the range. Retractions are counted from the server's own log lines.
Stages, each resumable (a finished run is kept and skipped):

    .venv/bin/python benchmarks/kv_bound_server_study.py run       # runs/kv-bound-server/
    .venv/bin/python benchmarks/kv_bound_server_study.py report    # benchmarks/data/kv-bound-server/
    .venv/bin/python benchmarks/kv_bound_server_study.py plot      # docs/figures/kv-bound-server.png
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import statistics
import sys
import time
from typing import Dict, List, Optional

import numpy as np

from specforge_outlets.studies.committed_data import LABEL_SET, REPO, SHAREGPT_PROMPTS, read_eval_record, shared
from specforge_outlets.atomic import write_text_atomic
from specforge_outlets.data.jsonl import write_jsonl
from specforge_outlets.serving.summary import read_summary
from specforge_outlets.simulation.predicted_lengths import read_file_quantiles

SERVE_PYTHON = os.path.join(REPO, ".venv-serve", "bin", "python")
RUNS_DIR = os.path.join(REPO, "runs", "kv-bound-server")
RESULTS = os.path.join(REPO, "benchmarks", "data", "kv-bound-server")
FIGURE = os.path.join(REPO, "docs", "figures", "kv-bound-server.png")
MAX_NEW_TOKENS = 2048  # the label set's generation limit: the cap every request is sent with
END_TOKEN_ID = 2  # SmolLM2's <|im_end|>, where an assistant turn ends (its generation config's eos_token_id)
SHORT_THRESHOLD = 800  # short requests: fewer output tokens; also the tail-safe long class
# each request generates exactly its recorded length, ended by the server under the label set's cap
EXACT_LENGTHS = ["--end-at-output-len", str(END_TOKEN_ID), "--max-new-tokens", str(MAX_NEW_TOKENS)]
KV_MARGIN = "0.2"  # --outlets-kv-margin of the KV-admission servers
OUTLETS = ["--schedule-policy", "outlets", "--outlets-long-output-len", str(SHORT_THRESHOLD)]
SGLANG_KV_CHARGE = ["--outlets-kv-admission", "sglang"]  # named, not left to the plugin's default
KV_BY_PREDICTION = ["--outlets-kv-admission", "predicted", "--outlets-kv-margin", KV_MARGIN]
KV_BY_PEAK = ["--outlets-kv-admission", "peak"]  # the plugin's default when the study ran
# the committed distribution record (benchmarks/length_distribution.py): the detached quantile draft's
# point and total-length quantiles per test request, raw and conformally corrected
DISTRIBUTION_RECORD = os.path.join(LABEL_SET, "eval", "distribution", "detached-predictions.jsonl.gz")
QUANTILE_PREDICTORS = ("outlets+conformal", "outlets")  # the record's names; the first it has quantiles of is sent
QUANTILE_LEVELS = "0.1,0.25,0.5,0.75,0.9"  # the record's levels: checked when its predictions file is written
READS_QUANTILES = ["--outlets-quantile-levels", QUANTILE_LEVELS]
# server name -> its flags; stock servers ignore predictions, so they run with none only
SERVERS: Dict[str, List[str]] = {
    "fcfs": ["--schedule-policy", "fcfs"],
    # the A/A control: fcfs again in its own server sessions, so the spread between two sessions of one
    # policy is measured beside every gap between policies (lof's lead over fcfs among them)
    "fcfs (A/A control)": ["--schedule-policy", "fcfs"],
    "lof": ["--schedule-policy", "lof"],
    "outlets tail-safe": OUTLETS + SGLANG_KV_CHARGE,
    "outlets sjf": OUTLETS + ["--outlets-order", "sjf"] + SGLANG_KV_CHARGE,
    "outlets tail-safe + KV by prediction": OUTLETS + KV_BY_PREDICTION,
    "outlets sjf + KV by prediction": OUTLETS + ["--outlets-order", "sjf"] + KV_BY_PREDICTION,
    # the plugin's default when the study ran: admitted while the predicted future peak of the cache fits
    "outlets tail-safe + KV by the predicted peak": OUTLETS + KV_BY_PEAK,
    # servers that read each request's predicted quantiles. The Gittins rank orders the sjf queue
    # (the plugin takes --outlets-order-key with sjf only); admission stays by the point's margin.
    "outlets gittins + KV by prediction": (OUTLETS + ["--outlets-order", "sjf", "--outlets-order-key", "gittins"]
                                           + KV_BY_PREDICTION + READS_QUANTILES),
    # admission charges the remaining length's median instead of the margin
    "outlets tail-safe + KV at q0.5": (OUTLETS + ["--outlets-kv-admission", "quantile", "--outlets-kv-quantile", "0.5"]
                                       + READS_QUANTILES),
}
# flags every server gets: a small KV cache, no prefix reuse, the client's end-at-length processor
SERVER_ARGS = ["--max-running-requests", "64", "--disable-radix-cache", "--enable-custom-logit-processor",
               "--skip-server-warmup", "--sleep-on-idle"]
PREDICTORS = ("none", "bert", "outlets", "oracle")
# The server's scheduler (its forward) runs one thread on this core alone, the client and the server's
# other processes on the others: with torch's default, one thread on every core, a parallel region
# stalls whenever any other process takes a core (docs/results.md, "Real servers: KV-bound SGLang on
# this CPU"), and the client is such a process. SGLang's own
# binding (SGLANG_CPU_OMP_THREADS_BIND) acts only on CPUs with AMX or on arm64, not on this one.
SERVER_CORE = (os.cpu_count() or 1) - 1
QUANTILES = "outlets quantiles"  # the distribution record's point and quantiles (write_quantile_predictions)


# the ladder of predictors (--ladder), from no information to all of it, on the peak (the default then)
# and on the charge it replaced
LADDER_PREDICTORS = ("none", "constant", "outlets", "ceiling", "oracle")
LADDER_SERVERS = ("outlets tail-safe + KV by the predicted peak", "outlets tail-safe + KV by prediction")


def predictors_of(server_name: str, ladder: bool = False) -> tuple:
    """The predictors each server runs with: every predictor on the default and on ``outlets sjf``
    (with ``ladder``: the ladder's on the peak and the charge, none elsewhere).

    Stock servers ignore predictions; the tail-safe order alone and SJF with KV admission run without
    one, with OUTLETS' and with the oracle's (this CPU's time). The servers that read quantiles run with
    OUTLETS' quantiles only: a point alone is a point mass, whose Gittins rank is the point (SJF's order)
    and whose median is the point (the margin's charge without the margin).
    """
    if not server_name.startswith("outlets"):
        return ("none",)
    if ladder:
        return LADDER_PREDICTORS if server_name in LADDER_SERVERS else ("none",)
    if READS_QUANTILES[0] in SERVERS[server_name]:
        return (QUANTILES,)
    if server_name in ("outlets sjf", "outlets tail-safe + KV by prediction"):
        return PREDICTORS
    return ("none", "outlets", "oracle")


RETRACTED = re.compile(r"#retracted_reqs: (\d+)")


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


# -- the workload -----------------------------------------------------------------------------------


def predictions_path(directory: str, predictor: str) -> str:
    return os.path.join(directory, f"predictions-{slug(predictor)}.jsonl")


def write_workload(directory: str, count: int, seed: int, ladder: bool = False) -> str:
    """dataset.jsonl (id, prompt, output_length) and one predictions file per predictor; returns the dataset.

    The quantiles' file is written whenever it is missing, so a study directory drawn before it existed
    gains it for the requests it already drew (the dataset is never redrawn).
    """
    dataset = os.path.join(directory, "dataset.jsonl")
    if not os.path.exists(dataset):
        (write_ladder_dataset if ladder else write_dataset)(dataset, count, seed)
    quantiles = predictions_path(directory, QUANTILES)
    if not ladder and not os.path.exists(quantiles):  # the ladder's servers read no quantiles
        with open(dataset, encoding="utf-8") as handle:
            write_quantile_predictions(quantiles, [json.loads(line)["id"] for line in handle])
    return dataset


def read_prompts(wanted) -> Dict[str, str]:
    """The ShareGPT prompts of the test request ids ``wanted`` (shared data, never copied)."""
    prompts_path = shared(SHAREGPT_PROMPTS, "this study (it sends the real ShareGPT prompts)")
    prompts = {}
    with open(prompts_path, encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            if row["id"] in wanted:
                prompts[row["id"]] = row["prompt"]
    missing = sorted(set(wanted) - set(prompts))
    if missing:
        raise SystemExit(f"{prompts_path} lacks {len(missing)} test request(s), first {missing[0]}: not the label set's prompts")
    return prompts


def write_ladder_dataset(dataset: str, count: int, seed: int) -> None:
    """``count`` of the label set's prompt samples (``predictor_ladder.LabelSetSamples``: id ``prompt/k``, k = 0 the
    test response), the ladder's predictions of them, the dataset last (done)."""
    from specforge_outlets.studies.label_set_samples import LabelSetSamples

    samples = LabelSetSamples()
    drawn = random.Random(seed).sample(range(len(samples.ids)), count)
    prompts = read_prompts({samples.ids[i].split("/")[0] for i in drawn})
    values = {"constant": np.full(len(samples.ids), samples.train_median), "outlets": samples.values["outlets r0"],
              "ceiling": samples.values["ceiling"]}
    for predictor, predicted in values.items():
        write_jsonl(predictions_path(os.path.dirname(dataset), predictor),
                    [{"id": samples.ids[i], "predicted_output_len": float(predicted[i])} for i in drawn])
    write_jsonl(dataset, [{"id": samples.ids[i], "prompt": prompts[samples.ids[i].split("/")[0]],
                           "output_length": int(samples.output_lens[i])} for i in drawn])


def write_dataset(dataset: str, count: int, seed: int) -> None:
    """The drawn requests and the committed evaluation's point predictions of them, the dataset last (done)."""
    drawn = random.Random(seed).sample(read_eval_record(), count)
    prompts = read_prompts({row["id"] for row in drawn})
    for predictor in ("bert", "outlets"):
        write_jsonl(predictions_path(os.path.dirname(dataset), predictor),
                    [{"id": row["id"], "predicted_output_len": row["static"][predictor]} for row in drawn])
    write_jsonl(dataset, [{"id": row["id"], "prompt": prompts[row["id"]], "output_length": int(row["true_output_len"])}
                          for row in drawn])


def write_quantile_predictions(path: str, ids: List[str]) -> None:
    """Each drawn request's point and total-length quantiles from the distribution record, in the rows
    ``outlets bench-serving`` and ``outlets simulate`` read (``quantile_levels``, ``quantiles``).

    Point and quantiles are one draft's: the record's static r̂₀ beside its quantiles (the conformal
    correction moves quantiles only). A drawn request without quantiles there is sent the committed
    evaluation's OUTLETS point alone, as ``predictions-outlets.jsonl`` sends it.
    """
    record = read_eval_record(DISTRIBUTION_RECORD)
    name = next((name for name in QUANTILE_PREDICTORS if name in (record[0].get("quantiles") or {})), None)
    if name is None:
        raise SystemExit(f"{DISTRIBUTION_RECORD} has no quantiles of {' or '.join(QUANTILE_PREDICTORS)}")
    found = read_file_quantiles(DISTRIBUTION_RECORD, name)
    if found.levels != tuple(float(level) for level in QUANTILE_LEVELS.split(",")):
        raise SystemExit(f"{DISTRIBUTION_RECORD}: quantile levels {list(found.levels)} are not the servers' "
                         f"--outlets-quantile-levels {QUANTILE_LEVELS}; set QUANTILE_LEVELS to the record's")
    points = {row["id"]: row["static"][name] for row in record}
    committed = {row["id"]: row["static"]["outlets"] for row in read_eval_record()}
    rows = [{"id": request_id, "predicted_output_len": points[request_id], "quantile_levels": list(found.levels),
             "quantiles": list(found.static[request_id])} if request_id in found.static
            else {"id": request_id, "predicted_output_len": committed[request_id]} for request_id in ids]
    write_jsonl(path, rows)
    without = sum("quantiles" not in row for row in rows)
    print(f"wrote {path}: {len(ids) - without} of {len(ids)} requests with {name}'s quantiles from "
          f"{DISTRIBUTION_RECORD}; {without} not in it with the committed OUTLETS point only", flush=True)


def make_target(directory: str) -> str:
    """A random 2-layer Llama with SmolLM2's tokenizer, vocabulary and end of turn."""
    if os.path.exists(os.path.join(directory, "config.json")):
        return directory
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    from specforge_outlets.data.targets import ensure_smollm2

    smollm2 = str(ensure_smollm2())
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                         bos_token_id=1, eos_token_id=END_TOKEN_ID, pad_token_id=0, tie_word_embeddings=True)
    model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=END_TOKEN_ID, pad_token_id=0)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory


# -- 1. run -----------------------------------------------------------------------------------------


def check_arrivals(args) -> None:
    """One runs directory holds one arrival pattern: its first run records it, a later one must match."""
    path = os.path.join(args.runs_dir, "arrivals.json")
    chosen = {"rate_rps": str(args.rate), "seed": args.seed, **({"requests": "ladder samples"} if args.ladder else {})}
    if not os.path.exists(path):
        write_text_atomic(path, json.dumps(chosen))
        return
    with open(path) as handle:
        recorded = json.load(handle)
    if recorded != chosen:
        raise SystemExit(f"{args.runs_dir} holds runs at --rate {recorded['rate_rps']} --seed {recorded['seed']}"
                         f"{' of the ladder' if 'requests' in recorded else ''}, not --rate {args.rate} --seed "
                         f"{args.seed}{' of the ladder' if args.ladder else ''}: pass another --runs-dir for these")


def run(args) -> None:
    os.makedirs(args.runs_dir, exist_ok=True)
    check_arrivals(args)
    dataset = write_workload(args.runs_dir, args.requests, args.seed, args.ladder)
    model = args.model_path or make_target(os.path.join(args.runs_dir, "target"))
    common = ["--max-total-tokens", str(args.max_total_tokens), *SERVER_ARGS]
    if args.draft:
        common += ["--outlets-draft-path", os.path.abspath(args.draft)]
    for repetition in range(args.repetitions):
        # every repetition starts a fresh server session per policy, in an order rotated by one each
        # time, so that no policy always runs first or in the same stretch of this machine's time
        shift = repetition % len(args.servers)
        for server_name in args.servers[shift:] + args.servers[:shift]:
            pending = [predictor for predictor in predictors_of(server_name, args.ladder)
                       if not os.path.exists(os.path.join(run_dir(args, server_name, predictor, repetition), "summary.json"))]
            if pending:
                run_session(args, server_name, repetition, pending, dataset, model, common)


def run_session(args, server_name: str, repetition: int, predictors, dataset: str, model: str, common) -> None:
    """One server session of ``server_name``: its ``predictors`` of one repetition, one after another."""
    log_path = os.path.join(args.runs_dir, "logs", f"{slug(server_name)}.rep{repetition}.server.log")
    with pinned_server(model, common + SERVERS[server_name], log_path) as server:
        print(f"{server_name} #{repetition}: server up in {server.start_seconds:.0f} s", flush=True)
        run_predictors(args, server, server_name, repetition, predictors, dataset, model, log_path)


@contextlib.contextmanager
def pinned_server(model: str, flags: List[str], log_path: str):
    """A fresh SGLang server of the serving environment with ``flags``, its scheduler pinned (``pin_server``)."""
    from specforge_outlets.loadgen.sglang_server import SGLangServer

    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with SGLangServer(model, flags, log_path=log_path, python=SERVE_PYTHON,
                      env={"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
                      cwd=REPO) as server:
        pin_server(server.process.pid)
        yield server


def pin_server(pid: int) -> None:
    """The server's scheduler, every thread of it, on SERVER_CORE; its other processes and this one
    (it sends the requests) on the other cores."""
    import psutil

    others = set(range(os.cpu_count() or 1)) - {SERVER_CORE} or {SERVER_CORE}
    os.sched_setaffinity(0, others)
    root = psutil.Process(pid)
    for process in [root, *root.children(recursive=True)]:
        cores = {SERVER_CORE} if process.name().startswith("sglang::sched") else others
        for thread in process.threads():
            os.sched_setaffinity(thread.id, cores)


def run_predictors(args, server, server_name: str, repetition: int, predictors, dataset: str, model: str,
                   log_path: str) -> None:
    """The runs of one server session, one predictor after another."""
    for predictor in predictors:
        out = run_dir(args, server_name, predictor, repetition)
        log_start = os.path.getsize(log_path)
        started = time.monotonic()
        send_dataset(server.url, dataset, model, out + ".partial", f"{server_name} | {predictor}", args.rate,
                     args.seed, predictions_sent(args.runs_dir, predictor))
        server_log = log_since(log_path, log_start)
        retracted = sum(int(count) for count in RETRACTED.findall(server_log))
        write_text_atomic(os.path.join(out + ".partial", "retractions.json"), json.dumps({"retracted": retracted}))
        # the server's own lines of this run: the step model of the simulator check is fitted to them
        write_text_atomic(os.path.join(out + ".partial", "server.log"), server_log)
        os.replace(out + ".partial", out)  # a run counts as done only when all of it is there
        print(f"{server_name} | {predictor} #{repetition}: {time.monotonic() - started:.0f} s, "
              f"{retracted} retracted", flush=True)


def predictions_sent(directory: str, predictor: str) -> List[str]:
    """bench-serving's flags that send ``predictor``'s values: none, the exact lengths, or its file in ``directory``."""
    return {"none": [], "oracle": ["--oracle-prediction"]}.get(
        predictor, ["--predictions", predictions_path(directory, predictor)])


def send_dataset(url: str, dataset: str, model: str, output: str, label: str, rate: float, seed: int,
                 sent: List[str], generation: List[str] = EXACT_LENGTHS) -> None:
    """One ``outlets bench-serving`` run of ``dataset`` against ``url`` into ``output``; a failed run stops the study."""
    from specforge_outlets.cli import main as outlets

    code = outlets(["bench-serving", "--base-url", url, "--dataset", dataset, "--rate", str(rate), "--seed", str(seed),
                    "--tokenizer", model, *generation, "--temperature", "0",
                    "--short-threshold", str(SHORT_THRESHOLD), "--timeout", "3600",
                    "--label", label, "--output", output] + sent)
    if code != 0:
        raise SystemExit(f"{label}: bench-serving exited {code}; see {output} and the server's log")


def log_since(log_path: str, start: int) -> str:
    """The server's log lines written since byte ``start`` (one run's)."""
    with open(log_path, encoding="utf-8", errors="replace") as handle:
        handle.seek(start)
        return handle.read()


def run_dir(args, server_name: str, predictor: str, repetition: int) -> str:
    return os.path.join(args.runs_dir, slug(server_name), slug(predictor), f"rep{repetition}")


# -- 2. report --------------------------------------------------------------------------------------

METRICS = (  # (column, path in summary.json's metrics)
    ("throughput tok/s", ("all", "throughput_tok_s")),
    ("short P99 s", ("short", "e2e_p99_s")),
    ("long P99 s", ("long", "e2e_p99_s")),
    ("short mean s", ("short", "e2e_mean_s")),
    ("all mean s", ("all", "e2e_mean_s")),
    ("TTFT P99 s", ("all", "ttft_p99_s")),
    ("TPOT P99 s", ("all", "tpot_p99_s")),
    ("ITL P99 s", ("all", "itl_p99_s")),
)


def finished_runs(directories) -> List[dict]:
    """The report's metrics and retraction count of each finished run among ``directories`` (unfinished: skipped)."""
    runs = []
    for out in directories:
        if not os.path.exists(os.path.join(out, "summary.json")):
            continue
        metrics = read_summary(out)["runs"][0]["metrics"]
        with open(os.path.join(out, "retractions.json")) as handle:
            retracted = json.load(handle)["retracted"]
        runs.append({"metrics": {column: metric(metrics, path) for column, path in METRICS},
                     "retracted": retracted, "requests": metrics["all"]["requests"],
                     "failed": metrics["all"]["failed"]})
    return runs


def report(args) -> None:
    rows = []
    for server_name in SERVERS:
        for predictor in predictors_of(server_name, args.ladder):
            runs = finished_runs(run_dir(args, server_name, predictor, repetition)
                                 for repetition in range(args.repetitions))
            if runs:
                rows.append({"server": server_name, "predictor": predictor, "runs": runs})
    if not rows:
        raise SystemExit(f"no finished run under {args.runs_dir}; run the `run` stage first")
    result = {"command": "python benchmarks/kv_bound_server_study.py " + " ".join(sys.argv[1:]),
              "requests": args.requests, "seed": args.seed, "rate_rps": str(args.rate),
              "max_total_tokens": args.max_total_tokens,
              "model": args.model_path or "random 2-layer Llama with SmolLM2's tokenizer", "rows": rows}
    os.makedirs(args.results, exist_ok=True)
    write_text_atomic(os.path.join(args.results, "result.json"), json.dumps(result, indent=1))
    write_text_atomic(os.path.join(args.results, "report.md"), render(result))
    print(render(result))


def metric(metrics: dict, path) -> Optional[float]:
    value = metrics.get(path[0], {}).get(path[1])
    return None if value is None else float(value)


def summary_of(row: dict, column: str) -> tuple:
    values = [run["metrics"][column] for run in row["runs"] if run["metrics"][column] is not None]
    return (statistics.median(values), min(values), max(values)) if values else (None, None, None)


def render(result: dict) -> str:
    fcfs = next((row for row in result["rows"] if row["server"] == "fcfs"), None)
    arrivals = "at once" if float(result.get("rate_rps", "inf")) == math.inf else f"at {result['rate_rps']} req/s"
    lines = [f"# KV-bound real servers ({result['requests']} requests {arrivals}, "
             f"--max-total-tokens {result['max_total_tokens']})",
             "", f"`{result['command']}`; {result['model']}. Median of the runs, [min-max] in brackets; "
             "ratios to fcfs's median.", "",
             "| server | predictions | runs | " + " | ".join(column for column, _ in METRICS) + " | retracted |",
             "|---|---|---:|" + "---:|" * (len(METRICS) + 1)]
    for row in result["rows"]:
        cells = []
        for column, _ in METRICS:
            median, low, high = summary_of(row, column)
            if median is None:
                cells.append("n/a")
                continue
            ratio = ""
            if fcfs is not None and row is not fcfs and summary_of(fcfs, column)[0]:
                ratio = f" (x{median / summary_of(fcfs, column)[0]:.2f})"
            cells.append(f"{median:.2f} [{low:.2f}-{high:.2f}]{ratio}")
        retracted = [run["retracted"] for run in row["runs"]]
        lines.append(f"| {row['server']} | {row['predictor']} | {len(row['runs'])} | " + " | ".join(cells)
                     + f" | {statistics.median(retracted):g} [{min(retracted)}-{max(retracted)}] |")
    return "\n".join(lines) + "\n"


# -- 3. plot ----------------------------------------------------------------------------------------


def plot(args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(os.path.join(args.results, "result.json")) as handle:
        result = json.load(handle)
    rows = result["rows"]
    labels = [f"{row['server']}\n{row['predictor']}" for row in rows]
    columns = ("short P99 s", "short mean s", "long P99 s", "throughput tok/s")  # a burst's P99 is its backlog's
    fig, axes = plt.subplots(1, len(columns), figsize=(5 * len(columns), 5.5), sharey=True)
    for axis, column in zip(axes, columns):
        medians = [summary_of(row, column) for row in rows]
        values = [m[0] or 0 for m in medians]
        errors = [[(m[0] or 0) - (m[1] or 0) for m in medians], [(m[2] or 0) - (m[0] or 0) for m in medians]]
        axis.barh(range(len(rows)), values, xerr=errors, color=["0.6" if not row["server"].startswith("outlets") else
                                                                "C0" if "KV" not in row["server"] else "C1"
                                                                for row in rows])
        axis.set(title=column, xlabel=column)
    axes[0].set_yticks(range(len(rows)), labels, fontsize=7)
    axes[0].invert_yaxis()
    fig.suptitle(f"KV-bound SGLang servers on CPU: {result['requests']} ShareGPT requests at SmolLM2's lengths, "
                 f"KV cache {result['max_total_tokens']} tokens (median, range over repetitions)", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.figure, dpi=110)
    print(f"wrote {args.figure}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stage", choices=("run", "report", "plot"))
    parser.add_argument("--runs-dir", default=RUNS_DIR)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rate", type=float, default=math.inf,
                        help="requests/s, Poisson arrivals seeded by --seed (default inf: all at once)")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--max-total-tokens", type=int, default=8192)
    parser.add_argument("--servers", nargs="+", default=list(SERVERS), choices=list(SERVERS))
    parser.add_argument("--model-path", help="target directory (default: the random Llama with SmolLM2's tokenizer)")
    parser.add_argument("--draft", help="an `outlets export` for --model-path: predictor-only mode in every outlets server")
    parser.add_argument("--ladder", action="store_true",
                        help="the ladder of predictors: requests drawn from the label set's four samples per prompt, "
                             f"the peak and the charge run with {', '.join(LADDER_PREDICTORS)} (a --runs-dir of its own)")
    parser.add_argument("--results", default=RESULTS, help="where the report stage writes report.md and result.json")
    parser.add_argument("--figure", default=FIGURE)
    args = parser.parse_args()
    {"run": run, "report": report, "plot": plot}[args.stage](args)

