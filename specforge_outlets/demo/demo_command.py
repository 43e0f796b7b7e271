"""``outlets demo``: the main job on the embedded default target, end to end, in one run directory.

built-in prompts -> regenerated with the target -> captured features + length labels ->
OUTLETS draft (and an SD-only draft for the drafting comparison) -> evaluation against the
baselines -> serving simulation driven by the measured prediction errors.

Stages are content-addressed (``stages.py``): re-running reuses finished ones, so an interrupted
demo resumes. ``--quick`` is a few-minute smoke run of the same pipeline.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import yaml

from specforge_outlets import resources
from specforge_outlets.demo import converged_result
from specforge_outlets.demo.stages import Stage, outlets, run_stages, stage_seconds
from specforge_outlets.evaluation.report_file import read_report

DEFAULT_RECIPE = resources.recipe("smollm2-135m-cpu-outlets.yaml")
AZURE_TRACE = "data/traces/AzureLLMInferenceTrace_conv.csv"  # in the shared data, when present
CLUSTER = resources.recipe("cluster-h100-1p3d.yaml")
# 1,024 new tokens: with the llama backend the demo can afford answers long enough that few are
# censored (README, "What make demo does").
FULL = {"prompts": 80, "max_new_tokens": 1024, "epochs": 3, "sd_only": True}
# Quick: enough new tokens that short built-in answers end (README, "What make demo does").
QUICK = {"prompts": 30, "max_new_tokens": 160, "epochs": 1, "sd_only": False}
# The shell's exit status for a run ended by Ctrl-C (128 + SIGINT).
INTERRUPTED_EXIT = 130


def register(subparsers) -> None:
    parser = subparsers.add_parser("demo", help="run the main job end to end on the embedded default target")
    parser.add_argument("--output", default="runs/demo", help="run directory (default: runs/demo)")
    parser.add_argument("--quick", action="store_true", help="a few-minute smoke run of the same pipeline")
    parser.add_argument("--target", default="smollm2-135m", help="target model (default: the embedded SmolLM2)")
    parser.add_argument("--recipe", default=DEFAULT_RECIPE, help="training recipe (CPU)")
    parser.add_argument("--backend", choices=("llama", "hf"), default=None,
                        help="regeneration engine (default: llama for GGUF targets, the fast CPU engine; else hf)")
    parser.add_argument("--baselines", default=None, help="comma list passed to `outlets eval --baselines`")
    parser.add_argument("--prompts-file", default=None,
                        help="JSONL of {id, prompt} to draw from instead of the built-in prompts")
    parser.add_argument("--prompts", type=int, default=None, help="number of prompts (default 80, quick 30)")
    parser.set_defaults(func=run)


def recipe_overrides(recipe: str, target: str) -> list[str]:
    """Absolute paths for the recipe's repository-relative files, and the target."""
    with open(recipe) as f:
        model = yaml.safe_load(f).get("model", {})
    overrides = [f"model.target_model_path={target}"]
    draft = model.get("draft_model_config")
    if draft and not os.path.isabs(draft):
        overrides.append(f"model.draft_model_config={resources.recipe_relative(draft)}")
    return overrides


def is_gguf_target(target: str) -> bool:
    from specforge_outlets.data.targets import SMOLLM2_ALIAS

    return target == SMOLLM2_ALIAS or target.endswith(".gguf")


def build_stages(args, sizes) -> list[Stage]:
    from specforge_outlets.data.targets import resolve_target

    target = resolve_target(args.target)
    with open(args.recipe) as f:
        recipe_text = f.read()

    source = ["--dataset", "jsonl", "--path", args.prompts_file] if args.prompts_file else ["--dataset", "builtin"]

    def prepare(out, _):
        outlets("prepare", *source, "--output", out, "--max-samples", sizes["prompts"], "--sample", "random")

    backend = args.backend or ("llama" if is_gguf_target(args.target) else "hf")
    # llama takes the GGUF (alias or file) itself; hf the converted Hugging Face directory.
    engine = ["--backend", "llama", "--target", args.target] if backend == "llama" else [
        "--backend", "hf", "--target", target, "--batch-size", 16]

    def regenerate(out, up):
        print(f"regenerating with the {backend} backend"
              + (" (llama.cpp's llama-server: 3.6x the hf backend's tokens/s here, docs/data.md)" if backend == "llama" else ""))
        for split in ("train", "test"):
            outlets("regenerate", *engine, "--resume",
                    "--input", os.path.join(up["prepare"], f"{split}.jsonl"),
                    "--output", os.path.join(out, f"{split}.jsonl"),
                    "--max-new-tokens", sizes["max_new_tokens"])

    def capture(out, up):
        for split in ("train", "test"):
            outlets("capture", "--target", target, "--input", os.path.join(up["regenerate"], f"{split}.jsonl"),
                    "--output", os.path.join(out, split))

    def trainer(*extra_overrides):
        def train(out, up):
            run_dir = os.path.join(out, "run")
            outlets("train", "--config", args.recipe, *recipe_overrides(args.recipe, target),
                    f"data.hidden_states_path={os.path.join(up['capture'], 'train')}",
                    f"output_dir={run_dir}", f"tracking.wandb_dir={run_dir}",
                    f"training.num_epochs={sizes['epochs']}", *extra_overrides)
            shutil.rmtree(os.path.join(out, "draft"), ignore_errors=True)
            outlets("export", "--checkpoint", run_dir, "--output", os.path.join(out, "draft"))
        return train

    def evaluate(out, up):
        extra = ["--sd-only-draft", os.path.join(up["train_sd_only"], "draft")] if "train_sd_only" in up else []
        extra += ["--baselines", args.baselines] if args.baselines else []
        shutil.rmtree(os.path.join(out, "report"), ignore_errors=True)
        outlets("eval", "--draft", os.path.join(up["train_outlets"], "draft"), *extra,
                "--features", os.path.join(up["capture"], "test"),
                "--train-features", os.path.join(up["capture"], "train"),
                "--target", target, "--output", os.path.join(out, "report"))

    trace = resources.shared_data(AZURE_TRACE)

    def simulate(out, up):
        predictions = os.path.join(up["eval"], "report", "predictions", "outlets.jsonl")
        if trace is None:
            print(f"no {AZURE_TRACE} in the shared data (${resources.ENV_SHARED_DIR} or ../shared): simulation skipped")
            return
        outlets("simulate", "--trace", trace, "--num-requests", "4000", "--config", CLUSTER, "--output", os.path.join(out, "report"),
                "--predictor", "file", "--predictions", predictions, "--rate-scale", "1", "3", "5")

    stages = [
        Stage("prepare", {"source": source, "prompts": sizes["prompts"]}, prepare),
        Stage("regenerate", {"target": target, "max_new_tokens": sizes["max_new_tokens"], "backend": backend},
              regenerate, ("prepare",)),
        Stage("capture", {"target": target}, capture, ("regenerate",)),
        Stage("train_outlets", {"recipe": recipe_text, "epochs": sizes["epochs"]}, trainer(), ("capture",)),
    ]
    if sizes["sd_only"]:
        stages.append(Stage("train_sd_only", {"recipe": recipe_text, "epochs": sizes["epochs"]},
                            trainer("outlets.length_loss_weight=0"), ("capture",)))
    eval_needs = ("capture", "train_outlets") + (("train_sd_only",) if sizes["sd_only"] else ())
    stages.append(Stage("eval", {"baselines": args.baselines}, evaluate, eval_needs))
    stages.append(Stage("simulate", {"trace": trace is not None}, simulate, ("eval",)))
    return stages


def run(args) -> int:
    started = time.time()
    sizes = dict(QUICK if args.quick else FULL)
    if args.prompts:
        sizes["prompts"] = args.prompts
    root = os.path.abspath(args.output)
    try:
        dirs = run_stages(root, build_stages(args, sizes))
    except subprocess.CalledProcessError as failed:
        print(f"demo stopped: `outlets {failed.cmd[3]}` failed (its message is above); finished stages are kept")
        return failed.returncode
    except KeyboardInterrupt:
        print("demo interrupted: its running stage was stopped; finished stages are kept (rerun to resume)")
        return INTERRUPTED_EXIT
    print_summary(dirs, sizes)
    print(f"\nrun directory: {root}  ({time.time() - started:.0f} s)")
    for name, directory in dirs.items():
        print(f"  {name:<14} {stage_seconds(directory):>7.0f} s  {directory}")
    return 0


def print_summary(dirs, sizes) -> None:
    """The smoke run's evaluation and serving result, then the converged export's, each labelled."""
    report = read_report(os.path.join(dirs["eval"], "report"))
    epochs = f"{sizes['epochs']} epoch" + ("s" if sizes["epochs"] != 1 else "")
    print(f"\nSMOKE RUN, this demo's draft ({report.n_train_requests} training requests, {epochs} on this CPU: "
          "the pipeline works end to end; not what the method predicts)")
    print(f"length prediction on {report.n_requests} held-out requests (MAE in tokens):")
    print(f"  {'predictor':<16} {'static':>8} {'dynamic':>8} {'Spearman':>9}")
    for name, score in sorted(report.predictors.items(), key=lambda item: item[1].static_mae):
        print(f"  {name:<16} {score.static_mae:>8.1f} {_cell(score.dynamic_mae, 1):>8} {_cell(score.spearman, 3):>9}")
    print(f"  full report: {os.path.join(dirs['eval'], 'report', 'report.md')}")
    summary = os.path.join(dirs["simulate"], "report", "summary.md")
    if os.path.isfile(summary):
        print(f"  serving simulation driven by these errors: {summary}")
    print_converged()


def print_converged() -> None:
    converged = converged_result.rescore()
    if converged is None:
        print(f"\nCONVERGED EXPORT: its evaluation record ({converged_result.EVAL_DIR}) is in a checkout of the "
              "repository only; see docs/results.md")
        return
    print(f"\nCONVERGED EXPORT, committed ({converged.draft}: trained to its budget on {converged.n_train_requests} "
          f"ShareGPT responses; {converged_result.EXPORT_DIR})")
    print(f"length prediction on {converged.n_requests} finished test requests, rescored now from its committed "
          "predictions (MAE in tokens):")
    print(f"  {'predictor':<16} {'static':>8} {'dynamic':>8} {'Spearman':>9}")
    for name, score in converged.scores.items():
        dynamic = score["dynamic_mae"] if score["dynamic_source"] == "model" else None  # countdowns: not the eval's
        print(f"  {name:<16} {score['static_mae']:>8.1f} {_cell(dynamic, 1):>8} {_cell(score['spearman'], 3):>9}")
    print(f"  record: {os.path.join(converged_result.EVAL_DIR, converged_result.RECORD)}; "
          f"predicted by `{converged_result.REPRODUCE}` (docs/results.md)")


def _cell(value, digits: int) -> str:
    return "–" if value is None else f"{value:.{digits}f}"
