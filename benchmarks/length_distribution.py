"""The quantile head on the draft state, joint and detached, against the N/2 probe with the same head.

Reads the features ``sharegpt_outlets.py --until capture --train-rows R`` wrote under ``--run``.
Stages, each resumable and skipped when its output exists:

1. ``split``: the captured train responses into a fitting part and a calibration part by prompt
   group (``--calibration-share``; no group straddles them): the drafts and the probe fit on the
   first, the split-conformal correction is estimated on the second, the test split scores;
2. ``train``: two OUTLETS drafts with the quantile head (recipes/smollm2-135m-cpu-outlets.yaml,
   ``outlets.quantile_levels``), ``joint`` (the pinball loss reaches the draft) and ``detached``
   (stop-gradient at the draft state: drafting as without the head), side by side, one core each,
   ``--max-steps`` optimizer steps (CPU budget); an interrupted run resumes from its checkpoint;
3. ``eval``: ``outlets eval`` of each draft with the probe baselines and ``--calibration-features``:
   coverage, PIT and conformal correction for OUTLETS and for the probes given the same quantile
   head; both reports and compacted per-request predictions (quantiles included: ``DYNAMIC_KEPT``)
   are written to ``benchmarks/data/sharegpt-smollm2/eval/distribution/``.

    .venv/bin/python benchmarks/length_distribution.py --run runs/bench-sharegpt --train-rows 1200
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

from specforge_outlets.studies.committed_data import LABEL_SET

from specforge_outlets.data.feature_subset import split_validation
from specforge_outlets.demo.stages import written

HERE = os.path.dirname(os.path.abspath(__file__))
RECIPE = os.path.join(HERE, "..", "recipes", "smollm2-135m-cpu-outlets.yaml")
OUT = os.path.join(LABEL_SET, "eval", "distribution")
FIGURES = os.path.join(HERE, "..", "docs", "figures")
# The levels of the quantile head: enough to draw a PIT histogram of 6 bins and to reserve KV at
# the 0.75 or 0.9 quantile; 0.1 and 0.9 are the coverage targets.
LEVELS = "[0.1,0.25,0.5,0.75,0.9]"
MODES = ("joint", "detached")
STAGES = ("split", "train", "eval")


def outlets(argv, env=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "specforge_outlets.cli", *map(str, argv)], env=env)


def wait_all(processes, what: str) -> None:
    if any(process.wait() != 0 for process in processes):
        raise SystemExit(f"{what} failed; rerun to resume")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="runs/bench-sharegpt", help="sharegpt_outlets.py's --output")
    parser.add_argument("--train-rows", type=int, help="the --train-rows of that capture")
    parser.add_argument("--calibration-share", type=float, default=0.2)
    parser.add_argument("--max-steps", type=int, default=300, help="optimizer steps of each draft (CPU budget)")
    parser.add_argument("--train-max-length", type=int, default=2048)
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--until", choices=STAGES, default=STAGES[-1])
    args = parser.parse_args()
    run = os.path.abspath(args.run)
    features = os.path.join(run, "features")
    captured = os.path.join(features, f"train-first{args.train_rows}" if args.train_rows else "train")
    fit, calibration = os.path.join(features, "fit"), os.path.join(features, "calibration")
    if not written(os.path.join(calibration, "manifest.json")):
        for part in (fit, calibration):
            shutil.rmtree(part, ignore_errors=True)
        split_validation(captured, fit, calibration, args.calibration_share)
    last = STAGES.index(args.until)
    if last < STAGES.index("train"):
        return 0

    one_core = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    runs = {mode: (os.path.join(run, f"train-quantile-{mode}"), os.path.join(run, f"draft-quantile-{mode}"))
            for mode in MODES}
    training = [outlets(["train", "--config", RECIPE, f"model.target_model_path={args.target}",
                         f"data.hidden_states_path={fit}", f"data.max_length={args.train_max_length}",
                         "training.num_epochs=1", f"training.max_steps={args.max_steps}", f"output_dir={train_dir}",
                         f"tracking.wandb_dir={train_dir}", f"outlets.quantile_levels={LEVELS}",
                         f"outlets.quantile_mode={mode}", "outlets.length_censored=one_sided"], one_core)
                for mode, (train_dir, draft) in runs.items() if not written(os.path.join(draft, "config.json"))]
    wait_all(training, "training")
    wait_all([outlets(["export", "--checkpoint", train_dir, "--output", draft])
              for train_dir, draft in runs.values() if not written(os.path.join(draft, "config.json"))], "export")
    if last < STAGES.index("eval"):
        return 0

    reports = {mode: os.path.join(run, f"report-quantile-{mode}") for mode in MODES}
    wait_all([outlets(["eval", "--draft", runs[mode][1], "--features", os.path.join(features, "test"),
                       "--train-features", fit, "--calibration-features", calibration, "--target", args.target,
                       "--max-new-tokens", 2048, "--censored-training", "one_sided", "--baselines", "probe",
                       "--quantile-levels", LEVELS, "--output", report], one_core)
              for mode, report in reports.items() if not written(os.path.join(report, "report.json"))], "eval")
    os.makedirs(OUT, exist_ok=True)
    for mode, report in reports.items():
        for name in ("report.json", "report.md"):
            shutil.copy(os.path.join(report, name), os.path.join(OUT, f"{mode}-{name}"))
        compact_record(os.path.join(report, "predictions.jsonl.gz"), os.path.join(OUT, f"{mode}-predictions.jsonl.gz"),
                       DYNAMIC_KEPT[mode])
        shutil.copy(os.path.join(report, "pit.png"), os.path.join(FIGURES, f"sharegpt-smollm2-quantile-pit-{mode}.png"))
    print(f"reports: {', '.join(reports.values())}")
    return 0


# What the committed records keep per-token (the full records are about 20 MB each): every
# predictor's r̂₀ and static quantiles always; OUTLETS' trajectory in both; its quantile trajectories
# (raw and conformal) in the detached draft's, the mode the serving study replays.
DYNAMIC_KEPT = {"joint": ("outlets",), "detached": ("outlets", "outlets+conformal")}


def compact_record(source: str, destination: str, dynamic_kept) -> None:
    """``outlets eval``'s record with the per-token predictions of the other predictors dropped."""
    from specforge_outlets.data.jsonl import iter_jsonl
    from specforge_outlets.evaluation.report import write_jsonl_gz

    rows = []
    for _, row in iter_jsonl(source):
        row["dynamic"] = {name: values for name, values in row["dynamic"].items() if name == "outlets"}
        row["quantiles"] = {name: entry if name in dynamic_kept else {"static": entry["static"]}
                            for name, entry in row.get("quantiles", {}).items()}
        rows.append(row)
    write_jsonl_gz(destination, rows)


if __name__ == "__main__":
    raise SystemExit(main())
