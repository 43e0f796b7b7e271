"""OUTLETS, SD-only and LP-only drafts trained until their validation curves flatten (or a stated budget).

Runs on the ShareGPT label set's captured features (``benchmarks/sharegpt_outlets.py --until
capture``). Three subcommands, each resumable:

    python benchmarks/convergence.py --run RUN split                 # validation split by prompt group
    python benchmarks/convergence.py --run RUN train --draft outlets # train; killed or stopped, rerun it
    python benchmarks/convergence.py --run RUN curve                 # evaluate new checkpoints only
    python benchmarks/convergence.py --run RUN test                  # the chosen checkpoints on the test split
    python benchmarks/convergence.py --run RUN scale                 # OUTLETS and the N/2 probe on nested subsets

``train`` runs ``outlets train`` on one thread (a core stays free) to ``--budget`` optimizer steps
with a checkpoint every ``--first-step`` (250); restarted, it resumes from the newest complete checkpoint
(``training/resumable.py``). While it trains, every checkpoint at a doubling step (250, 500, 1,000,
...) and the budget's last one is evaluated on the validation split (``evaluation/checkpoint_curve.py``) and the draft is
stopped once the last doubling improved each of its own objectives by under 2%. Curves go to
``--report`` (default ``benchmarks/data/sharegpt-smollm2/convergence/``: ``curves.json`` and
``curves.png``, committed). Only ``test`` reads the test split: ``outlets eval`` of each draft's chosen
checkpoint (its last evaluated one, or ``--step``) against every baseline fitted on the drafts' own
training responses (the fit split, censored ones one-sided as the drafts trained), into
``--report``/``eval/``; the OUTLETS draft is scored with a quantile head fitted on its frozen states
(``outlets fit-quantile-head``) whose served shifts the validation split calibrates (the export then
goes to ``--report``/draft-outlets/), the probes with their own heads, calibrated by eval on the same split.
Keep ``--run`` outside the work tree: checkpoints are large and must outlive a fresh checkout.

``scale`` answers the scaling claim on the validation split: OUTLETS trained on nested subsets of the
fit split (``SCALING_FRACTIONS``) at the same relative budget as the full run's point at
``SCALING_STEP`` (the schedule and the stop both scaled by the fraction, so each size sees the same
number of epochs at the same place in its schedule), and the N/2 probe fitted on the same subsets.
Runs and points go to ``--report``/``scaling/`` (``scaling.json``, ``scaling.png``).
"""

from __future__ import annotations

import argparse
import fcntl
import gzip
import json
import os
import shutil
import sys
from typing import Any, Dict, List, Optional, Tuple


from specforge_outlets.atomic import directory_replaced, write_text_atomic
from specforge_outlets.cli import main as outlets
from specforge_outlets.studies.committed_data import LABEL_SET
from specforge_outlets.scheduling.length_distribution import DEFAULT_QUANTILE_LEVELS
from specforge_outlets.studies.label_set_drafts import DRAFTS, NOISE_SEEDS, RECIPE, VARIANTS
from specforge_outlets.data.feature_subset import split_validation
from specforge_outlets.evaluation.report import write_jsonl_gz
from specforge_outlets.demo.stages import written
from specforge_outlets.evaluation.checkpoint_curve import (FIRST_STEP, checkpoint_point, doubling_steps, length_metrics,
                                                           plot_curves, plot_scaling, stop_reason)
from specforge_outlets.training.resumable import complete_checkpoints, prune_checkpoints, resume_overrides, supervise

REPORT = os.path.join(LABEL_SET, "convergence")  # curves.json and curves.png, committed
DEFAULT_BUDGET = 4000  # optimizer steps per draft, for runs that record none yet
POLL_S = 60.0  # seconds between looks for a new checkpoint while training
VALIDATION_SHARE = 0.1  # of the train split's prompt groups
# The method settings of the convergence runs: the recipe's, with censored responses trained
# one-sided (the label-set work's choice: docs/training.md).
METHOD = ("outlets.length_censored=one_sided",)
# The runs the test split scores: each draft at the recipe's settings (the length head at the draft's
# rate; the runs named ``outlets`` and ``lp-only`` trained it at 10x).
TEST_RUNS = {"outlets": "outlets-head-lr-1x", "sd-only": "sd-only", "lp-only": "lp-only-head-lr-1x"}
# Of the test report, into --report/eval; its predictions.jsonl.gz (every position's quantiles of six
# quantile predictors: 24 MB) stays in the run directory, over what the repository takes: the serving
# studies get the record without the quantiles and with the re-predicting trajectories they replay.
COMMITTED = ("report.json", "report.md", "pit.png")
RECORD = "predictions.jsonl.gz"
COMMITTED_EXPORT = "draft-outlets"  # the scored OUTLETS export (bf16, no embedding table: ~22 MB), into --report
RECORD_TRAJECTORIES = ("outlets", "probe-mid")  # the dynamic estimates the slim record keeps
# The baselines of the main test run. pia asks the target itself per request (75 batches of generation
# at ~87 s each beside the other runs, 1.8 hours) and egtp / estp pool every position of the 2,154 fit
# conversations per depth (~25 minutes each): they run apart (``test --baselines egtp,estp``, into
# eval-egtp-estp/), so the main report does not wait on them. Drafting is measured on the validation
# split at every checkpoint and live on SGLang (benchmarks/eagle3_cpu.py), so --no-drafting.
TEST_BASELINES = ("constant", "probe-mid", "probe-last", "bert", "lm-classifier")
# The quantile head fitted on the chosen OUTLETS draft and, for comparison, by the probes: the scheduler's
# levels; the validation split (no draft or probe trained on it) calibrates their conformal correction.
QUANTILE_LEVELS = DEFAULT_QUANTILE_LEVELS
SCALING_FRACTIONS = (0.125, 0.25)  # nested subsets of the fit split's files; the whole split is the third size
SCALING_STEP = 1000  # the main OUTLETS run's point (about one epoch) whose relative budget each subset gets


def paths(run: str) -> Dict[str, str]:
    base = os.path.join(run, "convergence")
    return {"base": base, "fit": os.path.join(base, "features", "fit"), "val": os.path.join(base, "features", "val"),
            "train": os.path.join(run, "features", "train")}


def recorded_budget(report: str) -> int:
    """The budget ``report``'s curves.json records, or DEFAULT_BUDGET before any run wrote one."""
    path = os.path.join(report, "curves.json")
    if not os.path.exists(path):
        return DEFAULT_BUDGET
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)["budget"]


def read_curves(args: argparse.Namespace) -> Dict[str, Any]:
    path = os.path.join(args.report, "curves.json")
    if not os.path.exists(path):
        return {"budget": args.budget, "drafts": {}}
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def write_entry(args: argparse.Namespace, name: str, entry: Dict[str, Any]) -> None:
    """Store one run's entry; the drafts train side by side, so each writes only its own, under a lock."""
    os.makedirs(args.report, exist_ok=True)
    with open(os.path.join(paths(args.run)["base"], "curves.lock"), "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        curves = read_curves(args)
        curves["budget"] = args.budget
        curves["drafts"][name] = entry
        write_text_atomic(os.path.join(args.report, "curves.json"), json.dumps(curves, indent=2))
        plot_curves({run: value["points"] for run, value in curves["drafts"].items()},
                    os.path.join(args.report, "curves.png"))


def run_name(draft: str, variant: Optional[str], train_files: Optional[int] = None) -> str:
    """A draft's run, a variant's (``outlets-float32``: bf16's effect at equal steps) or a subset's (``outlets-n263``)."""
    return (draft if variant is None else f"{draft}-{variant}") + (f"-n{train_files}" if train_files else "")


def split(args: argparse.Namespace) -> None:
    where = paths(args.run)
    if written(os.path.join(where["val"], "manifest.json")):
        return
    split_validation(where["train"], where["fit"], where["val"], VALIDATION_SHARE, seed=0)
    print(f"validation split: {where['fit']} and {where['val']}")


def train_dir(args: argparse.Namespace, name: str) -> str:
    return os.path.join(paths(args.run)["base"], f"train-{name}")


def train_argv(args: argparse.Namespace, name: str) -> List[str]:
    out = train_dir(args, name)
    variant = VARIANTS[args.variant] if args.variant else ()
    return [sys.executable, "-m", "specforge_outlets.cli", "train", "--config", RECIPE,
            f"model.target_model_path={args.target}", f"data.hidden_states_path={args.fit or paths(args.run)['fit']}",
            f"data.max_length={args.max_length}", "training.num_epochs=1000", f"training.max_steps={args.budget}",
            f"training.save_interval={args.first_step}", f"output_dir={out}", f"tracking.wandb_dir={out}",
            f"run_id={name}", *METHOD, *DRAFTS[args.draft], *variant, *resume_overrides(out, name)]  # fmt: skip


def export_dir(args: argparse.Namespace, name: str, step: int) -> str:
    """Where run ``name``'s checkpoint at ``step`` is exported (``evaluate_new`` writes it)."""
    return os.path.join(paths(args.run)["base"], "exports", f"{name}-step{step}")


def validation_predictions(export: str, target: str, validation):
    """The exported draft, loaded, and its predictions on every validation request (censored ones too)."""
    from specforge_outlets.evaluation.outlets_predictor import OutletsPredictor, load_draft
    from specforge_outlets.evaluation.predictor_api import EvalContext

    model = load_draft(export, target)
    return model, OutletsPredictor(EvalContext(target_path=target, progress=False), model, export).predict(
        validation.with_censored())


def train(args: argparse.Namespace) -> None:
    """Train ``--draft`` until the stopping rule, ``--until-step`` or the budget; a rerun resumes."""
    name = run_name(args.draft, args.variant, args.train_files)
    entry = read_curves(args)["drafts"].get(name, {"points": [], "stopped": None})
    if entry["stopped"]:
        print(f"{name}: stopped ({entry['stopped']})")
        return
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
           "WANDB_MODE": "offline"}
    code = supervise(train_argv(args, name), env, POLL_S, lambda: evaluate_new(args, name, args.draft, args.until_step))
    stopped = read_curves(args)["drafts"].get(name, {}).get("stopped")
    if stopped:
        print(f"{name}: {stopped}; the run stopped")
        return
    if code != 0:
        raise SystemExit(f"outlets train exited with {code}; rerun to resume from the last checkpoint")
    evaluate_new(args, name, args.draft, args.until_step)
    entry = read_curves(args)["drafts"][name]
    if not entry["stopped"]:
        entry["stopped"] = f"budget of {args.budget} steps reached"
        write_entry(args, name, entry)


def evaluate_new(args: argparse.Namespace, name: str, draft: str, until_step: Optional[int] = None) -> bool:
    """Evaluate run ``name``'s doubling checkpoints that have no point yet; True once it should stop."""
    import torch

    from specforge_outlets.evaluation.drafting import drafting_metrics, load_target_head
    from specforge_outlets.evaluation.requests import load_split
    from specforge_outlets.data.targets import resolve_target
    from specforge_outlets.training.export_command import export_draft

    torch.set_num_threads(args.threads)
    entry = read_curves(args)["drafts"].get(name, {"points": [], "stopped": None})
    done = {point["step"] for point in entry["points"]}
    wanted = doubling_steps(args.budget, args.first_step)
    found = complete_checkpoints(train_dir(args, name), name)
    target = resolve_target(args.target)
    validation = load_split(paths(args.run)["val"], name="validation")
    for step in [s for s in wanted if s in found and s not in done]:
        export = export_dir(args, name, step)
        if not os.path.exists(os.path.join(export, "config.json")):
            export_draft(found[step], export, os.path.join(train_dir(args, name), "draft_config.json"))
        model, predictions = validation_predictions(export, target, validation)
        drafting = drafting_metrics(model, load_target_head(target), validation.files(), progress=False)
        entry["points"].append(checkpoint_point(step, validation, predictions, drafting, one_sided=True))
        entry["points"].sort(key=lambda point: point["step"])
        entry["stopped"] = entry["stopped"] or stop_reason(entry["points"], draft)
        if until_step and step >= until_step:
            entry["stopped"] = entry["stopped"] or f"stopped at step {step} (--until-step)"
        write_entry(args, name, entry)
        print(json.dumps(entry["points"][-1]))
    prune_checkpoints(train_dir(args, name), name, keep=wanted)
    return bool(entry["stopped"])


def fill_length_metrics(args: argparse.Namespace, name: str) -> None:
    """Points of run ``name`` scored before a length metric existed: that side rescored from their exports
    (drafting is left as it was measured)."""
    from specforge_outlets.data.targets import resolve_target
    from specforge_outlets.evaluation.requests import load_split

    entry = read_curves(args)["drafts"].get(name)
    target = resolve_target(args.target)
    validation = load_split(paths(args.run)["val"], name="validation")
    for point in entry["points"] if entry else []:
        export = export_dir(args, name, point["step"])
        if "log_slope" in point or not os.path.exists(os.path.join(export, "config.json")):
            continue
        _, predictions = validation_predictions(export, target, validation)
        point.update(length_metrics(validation, predictions, one_sided=True))
        write_entry(args, name, entry)
        print(f"{name} step {point['step']}: {json.dumps({k: point[k] for k in ('log_slope', 'long_predicted_long')})}")


def curve(args: argparse.Namespace) -> None:
    for draft in DRAFTS:
        for variant in (None, *VARIANTS):
            name = run_name(draft, variant)
            if os.path.isdir(train_dir(args, name)) and (not args.runs or name in args.runs):
                evaluate_new(args, name, draft)
                if args.fill:
                    fill_length_metrics(args, name)
    curves = read_curves(args)["drafts"]  # drawn again: the figure follows the plotting code too
    plot_curves({run: value["points"] for run, value in curves.items()}, os.path.join(args.report, "curves.png"))


def chosen_exports(args: argparse.Namespace) -> Dict[str, str]:
    """Each test run's export at ``--step`` or at its last evaluated checkpoint."""
    curves, exports = read_curves(args)["drafts"], {}
    for draft, name in TEST_RUNS.items():
        points = curves.get(name, {}).get("points")
        if not points:
            raise SystemExit(f"{name}: no evaluated checkpoint in {args.report}/curves.json; train it first")
        step = dict(args.step).get(draft, points[-1]["step"])
        if step not in {point["step"] for point in points}:
            raise SystemExit(f"--step {draft}={step}: {name} has points at {[point['step'] for point in points]}")
        exports[draft] = export_dir(args, name, step)
        if not os.path.exists(os.path.join(exports[draft], "config.json")):
            raise SystemExit(f"{exports[draft]} is missing; `curve` exports each evaluated checkpoint")
    return exports


def test(args: argparse.Namespace) -> None:
    """Score the chosen checkpoints on the test split with every baseline; resumable (a written report is kept)."""
    test_features = os.path.join(args.run, "features", "test")
    if not written(os.path.join(test_features, "manifest.json")):
        raise SystemExit(f"no test features at {test_features}: capture them (resumable) with "
                         f"`python benchmarks/sharegpt_outlets.py --output {args.run} --until capture --workers 2`")
    exports = chosen_exports(args)
    exports["outlets"] = with_quantile_head(args, exports["outlets"])
    suffix = "" if args.baselines == list(TEST_BASELINES) else "-" + "-".join(args.baselines)
    out = os.path.join(paths(args.run)["base"], f"test-report{suffix}")
    if not written(os.path.join(out, "report.json")):
        noise = [os.path.join(args.run, "regen", f"noise-seed{seed}.jsonl") for seed in NOISE_SEEDS]
        code = outlets(["eval", "--draft", exports["outlets"], "--sd-only-draft", exports["sd-only"],
                        "--lp-only-draft", exports["lp-only"], "--features", test_features,
                        "--train-features", paths(args.run)["fit"], "--target", args.target,
                        "--baselines", ",".join(args.baselines), "--no-drafting",
                        "--censored-training", "one_sided", "--noise-samples", *noise,
                        "--max-new-tokens", str(generation_cap(args.run)),
                        "--quantile-levels", ",".join(map(str, QUANTILE_LEVELS)),
                        "--calibration-features", paths(args.run)["val"], "--output", out, "--overwrite"])  # fmt: skip
        if code != 0:
            raise SystemExit(f"outlets eval exited with {code}")
    committed = os.path.join(args.report, f"eval{suffix}")
    os.makedirs(committed, exist_ok=True)
    for name in COMMITTED:
        shutil.copy(os.path.join(out, name), os.path.join(committed, name))
    if not suffix:
        write_slim_record(os.path.join(out, RECORD), os.path.join(committed, RECORD))
        with directory_replaced(os.path.join(args.report, COMMITTED_EXPORT)) as partial:
            shutil.copytree(exports["outlets"], partial)
    print(f"report: {os.path.join(committed, 'report.md')} ({', '.join(f'{d}: {e}' for d, e in exports.items())})")


def write_slim_record(source: str, destination: str) -> None:
    """The evaluation record as the serving studies read it: every point predictor's r̂₀, the trajectories of
    ``RECORD_TRAJECTORIES``, no quantiles (nor the conformal entries, whose point is the raw one's; written
    atomically)."""
    rows = []
    with gzip.open(source, "rt") as handle:
        for row in map(json.loads, handle):
            row["static"] = {name: value for name, value in row["static"].items() if not name.endswith("+conformal")}
            row["dynamic"] = {name: row["dynamic"][name] for name in RECORD_TRAJECTORIES}
            rows.append({key: value for key, value in row.items() if key not in ("quantile_levels", "quantiles")})
    write_jsonl_gz(destination, rows)


def scale(args: argparse.Namespace) -> None:
    """OUTLETS and the N/2 probe on nested subsets of the fit split at one relative budget; resumable per size."""
    from specforge_outlets.data.feature_subset import subset_features
    from specforge_outlets.data.manifest import read_manifest

    where = paths(args.run)
    report = os.path.join(args.report, "scaling")
    total = len(read_manifest(where["fit"])["files"])
    points = []
    for fraction in (*SCALING_FRACTIONS, 1.0):
        files = round(fraction * total)
        if fraction < 1.0:
            fit = os.path.join(where["base"], "features", f"fit-{files}")
            if not written(os.path.join(fit, "manifest.json")):
                shutil.rmtree(fit, ignore_errors=True)  # a half-linked subset is linked again
                subset_features(where["fit"], fit, files, seed=0)
            until = round(SCALING_STEP * fraction)
            sized = argparse.Namespace(**{**vars(args), "fit": fit, "train_files": files, "report": report,
                                          "budget": round(args.budget * fraction), "first_step": until,
                                          "until_step": until, "draft": "outlets", "variant": None})
            train(sized)
            outlets_point = read_curves(sized)["drafts"][run_name("outlets", None, files)]["points"][-1]
        else:  # the full fit split: the main run's point at the same relative budget
            fit = where["fit"]
            outlets_point = next(point for point in read_curves(args)["drafts"][TEST_RUNS["outlets"]]["points"]
                                 if point["step"] == SCALING_STEP)
        points.append({"fraction": fraction, "train_files": files, "outlets": outlets_point,
                       "probe-mid": probe_point(args, fit, report, files)})
        write_text_atomic(os.path.join(report, "scaling.json"), json.dumps({"points": points}, indent=2))
    plot_scaling(points, os.path.join(report, "scaling.png"))
    print(f"scaling: {os.path.join(report, 'scaling.json')}")


def probe_point(args: argparse.Namespace, fit: str, report: str, files: int) -> Dict[str, Any]:
    """The N/2 probe fitted on ``fit`` (censored responses one-sided, as the drafts), scored on validation; kept once written."""
    from specforge_outlets.evaluation.baselines.probe import MidProbePredictor
    from specforge_outlets.evaluation.predictor_api import EvalContext
    from specforge_outlets.evaluation.requests import load_split

    path = os.path.join(report, "probes", f"probe-mid-{files}.json")
    if written(path):
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    probe = MidProbePredictor(EvalContext(progress=False, options={"censored_training": "one_sided"}))
    probe.fit(load_split(fit, name="fit"))
    validation = load_split(paths(args.run)["val"], name="validation")
    point = {**length_metrics(validation, probe.predict(validation.with_censored()), one_sided=True), **probe.info}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_text_atomic(path, json.dumps(point, indent=2))
    return point


def generation_cap(run: str) -> int:
    """The regeneration's ``max_new_tokens`` (the test capture reads a merged file that has no summary beside it)."""
    with open(os.path.join(run, "regen", "test.summary.json"), encoding="utf-8") as handle:
        return int(json.load(handle)["settings"]["max_new_tokens"])


def with_quantile_head(args: argparse.Namespace, export: str) -> str:
    """``export`` with a quantile head fitted on its frozen states over the fit split and its served quantiles
    calibrated on the validation split (``outlets fit-quantile-head --calibration-features``)."""
    out = f"{export}-quantiles-calibrated"
    if not os.path.exists(os.path.join(out, "config.json")):
        code = outlets(["fit-quantile-head", "--draft", export, "--features", paths(args.run)["fit"], "--target",
                        args.target, "--levels", ",".join(map(str, QUANTILE_LEVELS)), "--output", out, "--overwrite",
                        "--calibration-features", paths(args.run)["val"]])  # fmt: skip
        if code != 0:
            raise SystemExit(f"outlets fit-quantile-head exited with {code}")
    return out


def draft_step(value: str) -> Tuple[str, int]:
    """``--step``'s ``DRAFT=STEP``."""
    draft, _, step = value.partition("=")
    if draft not in TEST_RUNS or not step.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r}: expected DRAFT=STEP, DRAFT one of {', '.join(TEST_RUNS)}")
    return draft, int(step)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="the sharegpt_outlets.py output (features/train)")
    parser.add_argument("--budget", type=int,
                        help=f"optimizer steps at most per draft (default: the budget --report's curves.json records, "
                             f"else {DEFAULT_BUDGET}; it sets the runs' cosine schedule and their evaluated checkpoints)")
    parser.add_argument("--first-step", type=int, default=FIRST_STEP,
                        help="the first evaluated checkpoint, then every doubling (and the checkpoint interval)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: a core stays free)")
    parser.add_argument("--max-length", type=int, default=2048, help="training sequence length (tokens)")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--report", default=REPORT, help="where curves.json and curves.png go")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("split")
    trainer = sub.add_parser("train")
    trainer.add_argument("--draft", choices=list(DRAFTS), required=True)
    trainer.add_argument("--variant", choices=list(VARIANTS),
                         help="a variant run: one setting changed (its own name and curve)")
    trainer.add_argument("--until-step", type=int,
                         help="stop once the checkpoint at this step is evaluated (the schedule stays --budget's)")
    curver = sub.add_parser("curve")
    curver.add_argument("--fill", action="store_true",
                        help="also rescore the length side of points scored before a length metric existed")
    curver.add_argument("--runs", nargs="*", help="only these runs (e.g. outlets-head-lr-1x; default: every run)")
    sub.add_parser("scale")
    tester = sub.add_parser("test")
    tester.add_argument("--step", nargs="*", type=draft_step, default=[], metavar="DRAFT=STEP",
                        help="a draft's checkpoint to score (default: its last evaluated one)")
    tester.add_argument("--baselines", type=lambda text: text.split(","), default=list(TEST_BASELINES),
                        help=f"outlets eval's --baselines (default: {','.join(TEST_BASELINES)}); another list "
                             "writes test-report-<names> and --report/eval-<names>")
    parser.set_defaults(fit=None, train_files=None, until_step=None, variant=None)  # scale's subset runs set them
    args = parser.parse_args()
    if args.budget is None:  # a curve or test call without --budget keeps the runs' own
        args.budget = recorded_budget(args.report)
    {"split": split, "train": train, "curve": curve, "test": test, "scale": scale}[args.command](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
