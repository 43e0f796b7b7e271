"""EAGLE-3 mode on a real SGLang server: acceptance of the OUTLETS draft against the SD-only draft, and the
length head's cost per decode step.

SmolLM2-135M-Instruct (float32) serves first-turn ShareGPT prompts of the label set's test split with
``--speculative-algorithm EAGLE3`` and the drafts that ``benchmarks/sharegpt_outlets.py`` trained
(``runs/bench-sharegpt/draft-{outlets,sd-only}``: the same data, the same recipe; SD-only without
the length loss). Stages, each resumable (a stage's JSON under ``--output`` is kept and skipped):

1. ``acceptance``: the same ``--prompts`` prompts, greedy, up to ``--max-new-tokens``, sent at once,
   on a server without speculation (the reference output), with the OUTLETS draft and with the
   SD-only draft. Per request: SGLang's own ``spec_accept_length`` (tokens per verify step) and
   whether the output equals the non-speculative one token for token.
2. ``overhead``: decode-step time with the head read (``--schedule-policy outlets``: EAGLE-3 mode
   reads the length head after every verify) and without it (``fcfs``, same draft, same flags), at
   ``--batch-sizes`` concurrent requests of ``--overhead-tokens`` tokens each, a fresh server per
   policy and repetition, interleaved. Times come from the test-only timing plugin
   (``specforge_outlets/studies/sglang_plugins/timing/``): each decode step's forward plus its result processing, and
   the time inside the plugin's own code (the head read and setting the estimates).
3. ``report``: ``result.json`` and ``report.md``; ``plot`` (training environment, which has
   matplotlib): ``docs/figures/eagle3-cpu.png``.

On CPU the harness supplies what SGLang's EAGLE-3 lacks there (tests/sglang_harness/README.md),
which limits speculation to one draft token per step. ``--device cuda`` runs the same stages on a GPU
server that has SGLang, this package and the drafts, with the real kernels (no harness; bfloat16;
overlap scheduling off so that each step is timed on its own). Not run: no GPU was lent, and the
weights exceed what travels to the project's lent machine.

    .venv-serve/bin/python benchmarks/eagle3_cpu.py                      # measure and report, CPU
    .venv/bin/python benchmarks/eagle3_cpu.py --stages plot
    .venv-serve/bin/python benchmarks/eagle3_cpu.py --device cuda --output runs/eagle3-gpu
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
from typing import Dict, List

from specforge_outlets.atomic import write_text_atomic
from specforge_outlets.demo.stages import written
from specforge_outlets.loadgen.sglang_server import SGLangServer
from specforge_outlets.studies import sglang_plugins

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RUNS = os.path.join(REPO, "runs", "bench-sharegpt")
DRAFTS = {"outlets": os.path.join(RUNS, "draft-outlets"), "sd-only": os.path.join(RUNS, "draft-sd-only")}
TEST_SPLIT = os.path.join(RUNS, "data", "test.jsonl")
FIGURE = os.path.join(REPO, "docs", "figures", "eagle3-cpu.png")
LOGS = os.path.join(REPO, "runs", "eagle3-logs")  # server logs: large, not committed
# The label set's evaluation (committed): teacher-forced acceptance of the same two drafts.
EVAL_REPORT = os.path.join(REPO, "benchmarks", "data", "sharegpt-smollm2", "eval", "report.json")
# One draft token per verify step: what the CPU harness supports (topk 1, one draft step).
SPECULATIVE = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "1", "--speculative-eagle-topk", "1",
               "--speculative-num-draft-tokens", "2"]
MAX_PROMPT_TOKENS = 256  # prompts this long at most, so that a CPU batch of 16 fits in a few minutes
REQUEST_TIMEOUT_S = 1800.0  # a whole burst shares two CPU cores
# SGLang plugins put on the server's path (specforge_outlets.studies.sglang_plugins): the step timer,
# and on the CPU the pieces SGLang's EAGLE-3 lacks with torch_native.
DEVICE_ARGS = {
    "cpu": {"args": ["--dtype", "float32"], "plugins": [sglang_plugins.EAGLE3_CPU, sglang_plugins.TIMING]},
    # overlap scheduling off: the timing plugin then times each step's forward and commit in turn
    "cuda": {"args": ["--attention-backend", "triton", "--dtype", "bfloat16", "--disable-overlap-schedule"],
             "plugins": [sglang_plugins.TIMING]},
}


def smollm2_dir() -> str:
    from specforge_outlets.data.targets import ensure_smollm2

    return str(ensure_smollm2())


def test_prompts(count: int, drafts: Dict[str, str]) -> List[dict]:
    """The first ``count`` test-split conversations whose chat prompt has at most MAX_PROMPT_TOKENS tokens."""
    from transformers import AutoTokenizer

    from specforge_outlets.data.chat_tokens import generation_prompt_ids

    missing = [path for path in (TEST_SPLIT, *drafts.values()) if not os.path.exists(path)]
    if missing:
        raise SystemExit(f"missing {missing}: run `python benchmarks/sharegpt_outlets.py --output {RUNS}` first "
                         "(it regenerates the label set and trains both drafts)")
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir())
    prompts = []
    with open(TEST_SPLIT) as handle:
        for line in handle:
            row = json.loads(line)
            ids = generation_prompt_ids(tokenizer, row["conversations"][:1])
            if len(ids) <= MAX_PROMPT_TOKENS:
                prompts.append({"id": row["id"], "input_ids": ids})
            if len(prompts) == count:
                return prompts
    raise SystemExit(f"only {len(prompts)} test prompts of at most {MAX_PROMPT_TOKENS} tokens in {TEST_SPLIT}")


def drafts_of(args) -> Dict[str, str]:
    return {"outlets": args.outlets_draft, "sd-only": args.sd_only_draft}


def server(device: str, args: List[str], log: str) -> SGLangServer:
    spec = DEVICE_ARGS[device]
    os.makedirs(os.path.dirname(log), exist_ok=True)
    return SGLangServer(smollm2_dir(), ["--disable-radix-cache", "--max-total-tokens", "16384",
                                        "--max-running-requests", "32", "--skip-server-warmup", "--sleep-on-idle",
                                        *spec["args"], *args],
                        env={"TOKENIZERS_PARALLELISM": "false"}, log_path=log, device=device,
                        pythonpath=spec["plugins"], cwd=REPO)


def recorded(flags: List[str]) -> List[str]:
    """Server flags as a committed result keeps them: paths in the checkout relative to it, others by their
    last two parts (a run directory outside the work tree), no machine's path."""
    def kept(flag: str) -> str:
        if not os.path.isabs(flag):
            return flag
        if flag.startswith(REPO + os.sep):
            return os.path.relpath(flag, REPO)
        return os.path.join("RUN", *flag.rstrip(os.sep).split(os.sep)[-2:])
    return [kept(flag) for flag in flags]


def log_path(result_path: str) -> str:
    """Where the server of a stage's result logs: runs/eagle3-logs/<stage>/<name>.log."""
    stage, name = os.path.split(result_path)
    return os.path.join(LOGS, os.path.basename(stage), name.replace(".json", ".log"))


# -- 1. acceptance ----------------------------------------------------------------------------------


def serve_greedy(device: str, args: List[str], prompts: List[dict], max_new_tokens: int, log: str) -> List[dict]:
    with server(device, args, log) as running:
        results = running.burst([{"input_ids": p["input_ids"], "max_new_tokens": max_new_tokens, "ignore_eos": False}
                                 for p in prompts], gap_s=0.0, timeout=REQUEST_TIMEOUT_S)
    rows = []
    for prompt, result in zip(prompts, results):
        meta = result["response"]["meta_info"]
        rows.append({"id": prompt["id"], "output_ids": result["response"]["output_ids"],
                     "completion_tokens": meta["completion_tokens"],
                     "accept_length": meta.get("spec_accept_length"), "verify_steps": meta.get("spec_verify_ct"),
                     "predicted_output_len": meta.get("predicted_output_len"),
                     "seconds": result["done"] - result["sent"]})
    return rows


def acceptance(args) -> None:
    prompts = test_prompts(args.prompts, drafts_of(args))
    runs = {"no speculation": [], "outlets": SPECULATIVE + ["--speculative-draft-model-path", args.outlets_draft,
                                                            "--schedule-policy", "outlets"],
            "sd-only": SPECULATIVE + ["--speculative-draft-model-path", args.sd_only_draft]}
    for name, flags in runs.items():
        path = os.path.join(args.output, "acceptance", f"{name.replace(' ', '-')}.json")
        if written(path):
            continue
        rows = serve_greedy(args.device, flags, prompts, args.max_new_tokens, log_path(path))
        write_text_atomic(path, json.dumps({"flags": recorded(flags), "max_new_tokens": args.max_new_tokens, "rows": rows},
                                           indent=1))
        print(f"{name}: {len(rows)} requests", flush=True)


# -- 2. overhead ------------------------------------------------------------------------------------

STEP_LINE = re.compile(r"HARNESS decode step: batch=(\d+) steps=(\d+) mean_ms=([\d.]+) plugin_ms=([\d.]+)")


def decode_steps(log_text: str) -> Dict[int, Dict[str, float]]:
    """Per batch size: steps timed, mean step ms and mean ms inside the plugin (the timing plugin's lines)."""
    sums: Dict[int, List[float]] = {}
    for batch, steps, mean_ms, plugin_ms in STEP_LINE.findall(log_text):
        entry = sums.setdefault(int(batch), [0, 0.0, 0.0])
        entry[0] += int(steps)
        entry[1] += int(steps) * float(mean_ms)
        entry[2] += int(steps) * float(plugin_ms)
    return {batch: {"steps": n, "step_ms": total / n, "plugin_ms": plugin / n} for batch, (n, total, plugin) in
            sums.items()}


def overhead(args) -> None:
    prompts = test_prompts(max(args.batch_sizes), drafts_of(args))
    draft = SPECULATIVE + ["--speculative-draft-model-path", args.outlets_draft]
    policies = {"head read": ["--schedule-policy", "outlets"], "no head read": ["--schedule-policy", "fcfs"]}
    for repetition in range(args.repetitions):  # interleaved: a fresh server per policy and repetition
        for name, flags in policies.items():
            path = os.path.join(args.output, "overhead", f"{name.replace(' ', '-')}-{repetition}.json")
            if written(path):
                continue
            rows = {}
            with server(args.device, draft + flags, log_path(path)) as running:
                for batch in args.batch_sizes:
                    before = len(running.log_text())
                    running.burst([{"input_ids": p["input_ids"], "max_new_tokens": args.overhead_tokens}
                                   for p in prompts[:batch]], gap_s=0.0, timeout=REQUEST_TIMEOUT_S)
                    rows[batch] = decode_steps(running.log_text()[before:]).get(batch)
            write_text_atomic(path, json.dumps({"policy": name, "flags": recorded(draft + flags), "repetition": repetition,
                                                "by_batch": rows}, indent=1))
            print(f"{name} #{repetition}: {rows}", flush=True)


# -- 3. report --------------------------------------------------------------------------------------


def read_stage(directory: str) -> Dict[str, dict]:
    if not os.path.isdir(directory):
        return {}
    return {name[:-5]: json.load(open(os.path.join(directory, name))) for name in sorted(os.listdir(directory))
            if name.endswith(".json")}


BOOTSTRAP = 2000  # resamples of the requests for the paired interval of the acceptance difference


def paired_acceptance_difference(outlets: List[dict], sd_only: List[dict]) -> dict:
    """OUTLETS minus SD-only accepted drafts per verify step, pooled, with a paired bootstrap 95% interval.

    Both served the same prompts to the same greedy tokens (checked), so each request is a pair."""
    import random

    pairs = [(a["completion_tokens"] - 1, a["verify_steps"], b["completion_tokens"] - 1, b["verify_steps"])
             for a, b in zip(outlets, sd_only)]

    def difference(sample) -> float:
        ours = sum(p[0] for p in sample) / sum(p[1] for p in sample)
        theirs = sum(p[2] for p in sample) / sum(p[3] for p in sample)
        return ours - theirs  # tokens per verify step = 1 + accepted drafts: the 1s cancel

    rng = random.Random(0)
    draws = sorted(difference([rng.choice(pairs) for _ in pairs]) for _ in range(BOOTSTRAP))
    return {"accepted_drafts_per_step_difference": difference(pairs),
            "ci95": [draws[int(0.025 * BOOTSTRAP)], draws[int(0.975 * BOOTSTRAP) - 1]]}


def summarize(args) -> dict:
    runs = read_stage(os.path.join(args.output, "acceptance"))
    reference = {row["id"]: row["output_ids"] for row in runs.get("no-speculation", {}).get("rows", [])}
    accept = {}
    for name in ("outlets", "sd-only"):
        rows = runs.get(name, {}).get("rows")
        if not rows:
            continue
        tokens, steps = sum(r["completion_tokens"] for r in rows), sum(r["verify_steps"] for r in rows)
        accept[name] = {"requests": len(rows), "tokens": tokens, "verify_steps": steps,
                        # SGLang's accept length counts the verified token: 1 + drafts accepted per step
                        "accept_length_pooled": (tokens - len(rows)) / steps,
                        "accept_length_mean_per_request": statistics.mean(r["accept_length"] for r in rows),
                        "equal_to_non_speculative": sum(reference.get(r["id"]) == r["output_ids"] for r in rows),
                        "seconds_mean": statistics.mean(r["seconds"] for r in rows)}
    if "outlets" in accept and "sd-only" in accept:
        by_id = {row["id"]: row for row in runs["sd-only"]["rows"]}
        ours = [row for row in runs["outlets"]["rows"] if row["id"] in by_id]
        accept["outlets minus sd-only"] = paired_acceptance_difference(ours, [by_id[row["id"]] for row in ours])
    if "no-speculation" in runs:
        accept["no speculation"] = {"requests": len(reference), "seconds_mean": statistics.mean(
            r["seconds"] for r in runs["no-speculation"]["rows"])}
    by_policy: Dict[str, Dict[str, List[dict]]] = {}
    for run in read_stage(os.path.join(args.output, "overhead")).values():
        for batch, row in run["by_batch"].items():
            if row:
                by_policy.setdefault(run["policy"], {}).setdefault(batch, []).append(row)
    steps = {}
    for batch in sorted({b for rows in by_policy.values() for b in rows}, key=int):
        with_head = by_policy.get("head read", {}).get(batch, [])
        without = by_policy.get("no head read", {}).get(batch, [])
        if not with_head or not without:
            continue
        on, off = (statistics.median(r["step_ms"] for r in rows) for rows in (with_head, without))
        plugin = statistics.median(r["plugin_ms"] for r in with_head)
        steps[batch] = {"step_ms_with_head": on, "step_ms_without_head": off, "plugin_ms": plugin,
                        "plugin_share_of_step": plugin / on, "step_ratio": on / off,
                        "spread_with_head": [min(r["step_ms"] for r in with_head), max(r["step_ms"] for r in with_head)],
                        "spread_without_head": [min(r["step_ms"] for r in without), max(r["step_ms"] for r in without)],
                        "repetitions": len(with_head)}
    measured = (f"benchmarks/eagle3_cpu.py --device {args.device} --prompts {args.prompts} --max-new-tokens "
                f"{args.max_new_tokens} --batch-sizes {' '.join(map(str, args.batch_sizes))} --overhead-tokens "
                f"{args.overhead_tokens} --repetitions {args.repetitions}")
    if drafts_of(args) != DRAFTS:
        measured += " " + " ".join(recorded(["--outlets-draft", args.outlets_draft, "--sd-only-draft", args.sd_only_draft]))
    return {"command": measured, "device": args.device,
            "speculative_flags": SPECULATIVE, "acceptance": accept, "teacher_forced": teacher_forced(args.eval_report),
            "decode_steps": steps}


def teacher_forced(eval_report: str) -> dict:
    """``outlets eval``'s drafting block: the first draft step's acceptance on the test split's
    regenerated (sampled) responses, teacher-forced; the live runs draft one token per step."""
    if not os.path.exists(eval_report):
        return {}
    with open(eval_report) as handle:
        drafting = json.load(handle).get("drafting") or {}
    return {name: {"first_step_acceptance_rate": block["acceptance_rate_per_step"][0],
                   "first_step_top1": block["top1_acc_per_step"][0], "positions": block["positions"]}
            for name, block in drafting.items() if name in ("outlets", "sd_only")}


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = [name for name in ("outlets", "sd-only") if name in result["acceptance"]]
    values = [result["acceptance"][name]["accept_length_pooled"] for name in names]
    left.bar(names, values, color=["tab:blue", "tab:gray"][:len(names)])
    for x, value in enumerate(values):
        left.text(x, value + 0.01, f"{value:.3f}", ha="center")
    left.set_ylim(1.0, 2.0)
    left.set_ylabel("tokens per verify step (max 2)")
    left.set_title("EAGLE-3 accept length (same prompts, greedy)", fontsize=10)
    steps = result["decode_steps"]
    batches = sorted(steps, key=int)
    xs = [int(b) for b in batches]
    for key, color, label in (("without_head", "tab:gray", "no head read (fcfs)"),
                              ("with_head", "tab:blue", "head read (outlets)")):
        low = [steps[b][f"spread_{key}"][0] for b in batches]
        high = [steps[b][f"spread_{key}"][1] for b in batches]
        right.fill_between(xs, low, high, color=color, alpha=0.15)
        right.plot(xs, [steps[b][f"step_ms_{key}"] for b in batches], "o-", color=color, label=label)
    for x, batch in zip(xs, batches):  # the plugin's own time is far below the run-to-run spread
        right.annotate(f"plugin {steps[batch]['plugin_ms']:.2f} ms", (x, steps[batch]["step_ms_with_head"]),
                       textcoords="offset points", xytext=(4, 8), fontsize=8, color="tab:orange")
    right.set_xscale("log", base=2)
    right.set_xlabel("requests decoding at once")
    right.set_ylabel("ms per decode step")
    right.set_title(f"Decode step on {result['device']} (band: min-max of the runs)", fontsize=10)
    right.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def report(args) -> None:
    result = summarize(args)
    write_text_atomic(os.path.join(args.output, "result.json"), json.dumps(result, indent=1))
    lines = [f"# EAGLE-3 mode on a real SGLang server ({result['device']})", "", f"`{result['command']}`", "",
             f"Speculative flags: `{' '.join(SPECULATIVE)}`", "", "## Acceptance (same prompts, greedy)", "",
             "| draft | requests | tokens | verify steps | accept length (pooled) | mean per request | "
             "output equals non-speculative | mean latency s |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name in ("outlets", "sd-only"):
        row = result["acceptance"].get(name)
        if row:
            lines.append(f"| {name} | {row['requests']} | {row['tokens']} | {row['verify_steps']} | "
                         f"{row['accept_length_pooled']:.3f} | {row['accept_length_mean_per_request']:.3f} | "
                         f"{row['equal_to_non_speculative']}/{row['requests']} | {row['seconds_mean']:.1f} |")
    if "no speculation" in result["acceptance"]:
        lines.append(f"| (no speculation) | {result['acceptance']['no speculation']['requests']} | | | | | | "
                     f"{result['acceptance']['no speculation']['seconds_mean']:.1f} |")
    paired = result["acceptance"].get("outlets minus sd-only")
    if paired:
        low, high = paired["ci95"]
        lines += ["", f"OUTLETS minus SD-only, accepted drafts per verify step: "
                  f"{paired['accepted_drafts_per_step_difference']:+.4f} (paired bootstrap 95% interval "
                  f"{low:+.4f} to {high:+.4f}, {BOOTSTRAP} resamples of the requests)."]
    forced = result.get("teacher_forced") or {}
    if forced:
        lines += ["", "Teacher-forced, first draft step (`outlets eval` on the test split's sampled responses, "
                  f"{forced['outlets']['positions']} positions): acceptance rate OUTLETS "
                  f"{forced['outlets']['first_step_acceptance_rate']:.4f}, SD-only "
                  f"{forced['sd_only']['first_step_acceptance_rate']:.4f}. Live, the accepted drafts per verify "
                  "step above are the same quantity on greedy outputs."]
    if result["decode_steps"]:
        lines += ["", "## Decode step with and without the length-head read", "",
                  "| batch | ms/step with head | ms/step without | ratio | inside the plugin ms | share of step | "
                  "spread with / without |", "|---:|---:|---:|---:|---:|---:|---|"]
    for batch, row in sorted(result["decode_steps"].items(), key=lambda item: int(item[0])):
        lines.append(f"| {batch} | {row['step_ms_with_head']:.2f} | {row['step_ms_without_head']:.2f} | "
                     f"x{row['step_ratio']:.3f} | {row['plugin_ms']:.3f} | {100 * row['plugin_share_of_step']:.2f}% | "
                     f"{row['spread_with_head'][0]:.1f}-{row['spread_with_head'][1]:.1f} / "
                     f"{row['spread_without_head'][0]:.1f}-{row['spread_without_head'][1]:.1f} |")
    with open(os.path.join(args.output, "report.md"), "w") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def plot_stage(args) -> None:
    with open(os.path.join(args.output, "result.json")) as handle:
        result = json.load(handle)
    plot(result, FIGURE if args.device == "cpu" else os.path.join(args.output, "eagle3.png"))


STAGES = {"acceptance": acceptance, "overhead": overhead, "report": report, "plot": plot_stage}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", default=os.path.join(REPO, "benchmarks", "data", "eagle3-cpu"))
    parser.add_argument("--device", choices=list(DEVICE_ARGS), default="cpu")
    parser.add_argument("--stages", nargs="+", choices=list(STAGES), default=["acceptance", "overhead", "report"])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--overhead-tokens", type=int, default=48)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--outlets-draft", default=DRAFTS["outlets"], help="the OUTLETS draft export")
    parser.add_argument("--sd-only-draft", default=DRAFTS["sd-only"], help="the SD-only draft export")
    parser.add_argument("--eval-report", default=EVAL_REPORT,
                        help="`outlets eval` report.json of the same drafts: the teacher-forced acceptance beside")
    args = parser.parse_args()
    for stage in args.stages:
        STAGES[stage](args)


if __name__ == "__main__":
    main()
