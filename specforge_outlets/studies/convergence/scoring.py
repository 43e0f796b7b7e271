"""The chosen checkpoints scored on the test split against every baseline, and what of it is committed.

Only this part reads the test split: ``outlets eval`` of each draft's chosen checkpoint (its last
evaluated one, or ``--step``) against every baseline fitted on the drafts' own training responses;
the OUTLETS draft is scored with a quantile head fitted on its frozen states, calibrated on the
validation split.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
from typing import Dict, Tuple

from specforge_outlets.atomic import directory_replaced
from specforge_outlets.cli import main as outlets
from specforge_outlets.demo.stages import written
from specforge_outlets.evaluation.report import write_jsonl_gz
from specforge_outlets.scheduling.length_distribution import DEFAULT_QUANTILE_LEVELS
from specforge_outlets.studies.convergence.curves import export_dir, paths, read_curves
from specforge_outlets.studies.label_set_drafts import NOISE_SEEDS

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
