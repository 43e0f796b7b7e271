"""OUTLETS on the 2,978 ShareGPT prompts: a real SmolLM2 label set, then capture, train, evaluate.

Reads the shared data's data/prompts/sharegpt_first_turn_2978.jsonl (``$OUTLETS_SHARED_DIR``, else
../shared; never copied into the repo). Stages,
each resumable and skipped when its output exists:

1. ``prepare``: every prompt, split 4:1 by a fixed seed and by prompt group (twins and
   near-duplicates in one split: ``data/prompt_groups.py``);
2. ``regenerate``: SmolLM2 answers each prompt with the llama backend (up to 2,048 new tokens; a
   longer response is censored and never labelled): the test split, ``NOISE_SEEDS`` more samples
   of a fixed subset of ``--noise-prompts`` test prompts (the sampling-noise floor), the train split;
3. ``pack``: the regenerated responses (ids, response token ids, finish reasons, lengths; no
   prompt text) into ``benchmarks/data/sharegpt-smollm2/`` (committed, gzip). On a machine without
   the regenerated files, stage 2 starts by unpacking them against the prompts in ../shared, each
   seed-0 response going to its prompt's current split (``--labels-as-is`` stops there; otherwise
   only what the packed files lack is regenerated);
4. ``capture``; ``train`` + ``export`` of the OUTLETS, SD-only and LP-only drafts
   (recipes/smollm2-135m-cpu-outlets.yaml); ``eval`` with the noise samples, whose report and
   per-request predictions are copied next to the packed label set (for the serving study);
5. ``curve``: OUTLETS and the probes trained on nested subsets of ``--curve`` train responses.

    python benchmarks/sharegpt_outlets.py --output runs/bench-sharegpt --until pack --workers 2
    python benchmarks/sharegpt_outlets.py --output runs/bench-sharegpt            # everything
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from typing import List, Optional, Sequence

from specforge_outlets.studies.committed_data import LABEL_SET, SHAREGPT_PROMPTS, shared

from specforge_outlets.cli import main as outlets
from specforge_outlets.data.feature_subset import subset_features
from specforge_outlets.data.jsonl import iter_jsonl, recover_jsonl, write_jsonl
from specforge_outlets.data.label_set import PACKED_SUFFIX, pack_label_set, read_packed, sample_noise_prompts, seeded_id_order, unpack_label_set
from specforge_outlets.data.prepare_command import prompt_text
from specforge_outlets.data.prompt_groups import check_split_groups
from specforge_outlets.data.regenerate_command import side_paths
from specforge_outlets.demo.stages import written
from specforge_outlets.data.sharded_regeneration import regenerate_sharded
from specforge_outlets.evaluation.label_stats import first_turns, length_summary, noise_floor, plot_lengths, samples_by_prompt
from specforge_outlets.evaluation.learning_curve import curve_points, plot_curve
from specforge_outlets.evaluation.report_file import read_report
from specforge_outlets.studies.label_set_drafts import DRAFTS, NOISE_SEEDS, RECIPE

HERE = os.path.dirname(os.path.abspath(__file__))
PACKED = LABEL_SET
FIGURE = os.path.join(HERE, "..", "docs", "figures", "sharegpt-smollm2-lengths.png")
CURVE_FIGURE = os.path.join(HERE, "..", "docs", "figures", "sharegpt-smollm2-learning-curve.png")
# Test prompts given the NOISE_SEEDS samples: with the scored one, 4 samples on at least 250
# prompts, so the floor and the ranking ceiling are measured on the rows the predictors are scored on.
NOISE_PROMPTS = 256
STAGES = ("prepare", "regenerate", "pack", "capture", "train", "eval", "curve")


def step(done_marker: str, argv: Sequence[object]) -> None:
    """Run one ``outlets`` command unless its output already exists."""
    if written(done_marker):
        return
    code = outlets([str(arg) for arg in argv])
    if code != 0:
        raise SystemExit(f"`outlets {argv[0]}` failed with exit status {code}")


def regenerate(args: argparse.Namespace, source: str, output: str, seed: int) -> None:
    """One split answered by ``--workers`` engine processes; the last, single pass writes its summary."""
    options = ["--backend", "llama", "--target", args.target, "--max-new-tokens", args.max_new_tokens,
               "--max-response-tokens", args.max_new_tokens, "--concurrency", args.concurrency,
               "--threads", 1 if args.workers > 1 else args.threads, "--seed", seed]  # fmt: skip
    marker = side_paths(output)["summary"]
    if args.workers > 1 and not os.path.exists(marker):
        regenerate_sharded(source, output, args.workers, [str(option) for option in options])
    step(marker, ["regenerate", *options, "--resume", "--input", source, "--output", output])


def packed_noise_ids() -> set:
    """Prompts the committed label set already sampled with the noise seeds."""
    paths = [os.path.join(PACKED, f"noise-seed{seed}{PACKED_SUFFIX}") for seed in NOISE_SEEDS]
    return {str(row["id"]) for path in paths if os.path.exists(path) for row in read_packed(path)}


def regen_files() -> List[str]:
    return ["test.jsonl", "train.jsonl", *(f"noise-seed{seed}.jsonl" for seed in NOISE_SEEDS)]


def capture_input(regen: str, split: str, rows: Optional[int] = None) -> str:
    """The file ``capture`` reads: every response of the split, the censored ones too.

    A censored response has no label, only a lower bound: training fits it one-sided
    (``outlets.length_censored``, ``--censored-training``) and drafts on its tokens, the test
    scores count it through the censoring-aware metrics, and the serving study needs every test
    request's predictions, the long tail included. ``rows`` keeps that many of them, the first in a
    seeded order of ids (nested: a larger subset holds a smaller one), for a capture that has to
    fit a CPU budget.
    """
    path = os.path.join(regen, f"{split}.jsonl")
    merged = os.path.join(regen, f"{split}.with-censored{f'.first{rows}' if rows else ''}.jsonl")
    if not os.path.exists(merged):  # written once: a resumed capture must read the same rows in the same order
        every = recover_jsonl(path) + recover_jsonl(side_paths(path)["filtered"])
        if rows:
            if rows > len(every):
                raise SystemExit(f"--train-rows {rows}: the {split} split has {len(every)} responses")
            chosen = set(sorted((str(row["id"]) for row in every), key=seeded_id_order)[:rows])
            every = [row for row in every if str(row["id"]) in chosen]
        write_jsonl(merged, every)
    return merged


def capture(args: argparse.Namespace, regen: str, split: str, output: str, rows: Optional[int] = None) -> None:
    """``outlets capture`` of one split, ``--workers`` shards at once; resumed where an earlier run stopped."""
    if written(os.path.join(output, "manifest.json")):
        return
    argv = [sys.executable, "-m", "specforge_outlets.cli", "capture", "--target", args.target,
            "--input", capture_input(regen, split, rows), "--output", output, "--split", split,
            "--max-length", str(args.max_length), "--resume"]  # fmt: skip
    if args.workers > 1:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        shards = [subprocess.Popen([*argv, "--shard", f"{k}/{args.workers}"], env=env) for k in range(args.workers)]
        if any(shard.wait() != 0 for shard in shards):
            raise SystemExit(f"capture of {split} failed in a shard; rerun to resume")
    code = outlets(argv[3:])
    if code != 0:
        raise SystemExit(f"`outlets capture` of {split} failed with exit status {code}")


def write_label_stats(regen: str) -> None:
    """Lengths and censoring per split, the sampling-noise floor: ``PACKED/label_stats.json`` and a figure."""
    def rows(name: str):
        path = os.path.join(regen, name)
        return recover_jsonl(path) + recover_jsonl(side_paths(path)["filtered"])

    splits = {name[: -len(".jsonl")]: rows(name) for name in regen_files()}
    noise_ids = {str(row["id"]) for name, split in splits.items() if name.startswith("noise") for row in split}
    noise_files = [[r for r in splits["test"] if str(r["id"]) in noise_ids]] + [
        split for name, split in splits.items() if name.startswith("noise")]
    samples = samples_by_prompt(noise_files)
    stats = {"splits": {name: length_summary(first_turns(split)) for name, split in splits.items()},
             "noise_floor": noise_floor(samples)}
    with open(os.path.join(PACKED, "label_stats.json"), "w", encoding="utf-8") as handle:
        json.dump(stats, handle, indent=2)
    plot_lengths({**first_turns(splits["train"]), **first_turns(splits["test"])}, samples, FIGURE)
    print(json.dumps(stats, indent=2))


def run() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, help="a seeded random subset (default: all 2,978)")
    parser.add_argument("--noise-prompts", type=int, default=NOISE_PROMPTS, help="test prompts sampled NOISE_SEEDS more times")
    parser.add_argument("--max-new-tokens", type=int, default=2048)
    parser.add_argument("--concurrency", type=int, default=16, help="llama-server slots")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="llama-server threads (1 when other work shares the cores: docs/data.md)")
    parser.add_argument("--workers", type=int, default=1,
                        help="engine processes, one thread and one core each (2 on a 2-core machine)")
    parser.add_argument("--labels-as-is", action="store_true",
                        help="no regeneration: pack, train and evaluate on the label set as far as it got")
    parser.add_argument("--max-length", type=int, default=4096, help="capture: longest conversation kept (tokens)")
    parser.add_argument("--train-rows", type=int,
                        help="capture, train and fit on this many train responses only (a seeded subset: CPU budget)")
    parser.add_argument("--train-max-length", type=int, default=2048, help="training sequence length (tokens)")
    parser.add_argument("--epochs", type=int, default=2, help="training epochs of every draft")
    parser.add_argument("--max-steps", type=int, help="cap on each draft's optimizer steps (CPU time budget)")
    parser.add_argument("--drafts", nargs="+", choices=list(DRAFTS), default=list(DRAFTS),
                        help="drafts to train (outlets is always needed; the others are the ablation rows)")
    parser.add_argument("--curve", type=int, nargs="*", default=[250, 500, 1000],
                        help="learning curve: train-split sizes (the full split is the main run)")
    parser.add_argument("--curve-probes-only", action="store_true",
                        help="learning curve of the probes only, no draft trained per size (CPU budget)")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--output", default="runs/bench-sharegpt")
    parser.add_argument("--until", choices=STAGES, default=STAGES[-1], help="stop after this stage")
    args = parser.parse_args()
    prompts = shared(SHAREGPT_PROMPTS, "the ShareGPT benchmark")
    out = os.path.abspath(args.output)
    data, regen, features = (os.path.join(out, name) for name in ("data", "regen", "features"))
    last = STAGES.index(args.until)
    if "outlets" not in args.drafts:
        parser.error("--drafts must include outlets")

    prepare = ["prepare", "--dataset", "jsonl", "--path", os.path.abspath(prompts), "--output", data]
    if args.prompts:
        prepare += ["--max-samples", args.prompts, "--sample", "random"]
    step(os.path.join(data, "summary.json"), prepare)
    check_split_groups({split: [(row["id"], prompt_text(row)) for _, row in iter_jsonl(os.path.join(data, f"{split}.jsonl"))]
                        for split in ("train", "test")})  # fmt: skip
    noise_input = os.path.join(data, "noise.jsonl")
    if not os.path.exists(noise_input):
        sample_noise_prompts(os.path.join(data, "test.jsonl"), noise_input, args.noise_prompts, keep=packed_noise_ids())
    if last < STAGES.index("regenerate"):
        return 0

    if not os.path.isdir(regen) and os.path.exists(os.path.join(PACKED, "summary.json")):
        moved = unpack_label_set(PACKED, data, regen, args.target)  # the committed label set: no regeneration
        with open(os.path.join(out, "unpack_moves.json"), "w", encoding="utf-8") as handle:
            json.dump(moved, handle, indent=2)
        print(json.dumps(moved, indent=2))
    if not args.labels_as_is:
        for split in ("test", "train"):  # train before the noise samples: the drafts' training waits on it
            regenerate(args, os.path.join(data, f"{split}.jsonl"), os.path.join(regen, f"{split}.jsonl"), 0)
        for seed in NOISE_SEEDS:
            regenerate(args, noise_input, os.path.join(regen, f"noise-seed{seed}.jsonl"), seed)
    if last < STAGES.index("pack"):
        return 0
    pack_label_set(regen, regen_files(), PACKED)
    write_label_stats(regen)
    if last < STAGES.index("capture"):
        return 0

    train_features = os.path.join(features, f"train-first{args.train_rows}" if args.train_rows else "train")
    test_features = os.path.join(features, "test")
    capture(args, regen, "test", test_features)  # first: the evaluation needs every test request
    capture(args, regen, "train", train_features, args.train_rows)
    if last < STAGES.index("train"):
        return 0
    drafts = {name: train_draft(args, out, name, train_features, DRAFTS[name]) for name in args.drafts}
    if last < STAGES.index("eval"):
        return 0
    noise = [os.path.join(regen, f"noise-seed{seed}.jsonl") for seed in NOISE_SEEDS]
    ablations = [option for name in ("sd-only", "lp-only") if name in drafts
                 for option in (f"--{name}-draft", drafts[name])]
    report = evaluate(args, os.path.join(out, "report"), drafts["outlets"], test_features, train_features,
                      [*ablations, "--noise-samples", *noise])
    os.makedirs(os.path.join(PACKED, "eval"), exist_ok=True)
    for name in ("report.json", "report.md", "predictions.jsonl.gz"):
        shutil.copy(os.path.join(report, name), os.path.join(PACKED, "eval", name))
    if last < STAGES.index("curve"):
        return 0
    reports = [report]
    for size in args.curve:  # OUTLETS and the probes trained on nested subsets of the train split
        subset = os.path.join(features, f"train-{size}")
        if not os.path.exists(os.path.join(subset, "manifest.json")):
            subset_features(train_features, subset, size)
        draft = None if args.curve_probes_only else train_draft(args, out, f"outlets-{size}", subset, ())
        reports.append(evaluate(args, os.path.join(out, f"report-{size}"), draft, test_features, subset,
                                ["--baselines", "probe", "--no-drafting"]))
    write_learning_curve(reports)
    print(f"report: {os.path.join(report, 'report.md')}")
    return 0


def write_learning_curve(report_dirs: Sequence[str]) -> None:
    """``PACKED/eval/learning_curve.json`` and its figure from the full run's and the subsets' reports."""
    reports = [read_report(directory) for directory in report_dirs]
    rows = curve_points(reports)
    with open(os.path.join(PACKED, "eval", "learning_curve.json"), "w", encoding="utf-8") as handle:
        json.dump(rows, handle, indent=2)
    plot_curve(rows, reports[0].noise_floor_static_mae, CURVE_FIGURE)
    print(json.dumps(rows, indent=2))


def train_draft(args: argparse.Namespace, out: str, name: str, features: str, overrides: Sequence[str]) -> str:
    """``outlets train`` on the CPU recipe, then ``outlets export``; an interrupted run resumes."""
    run_dir, draft = os.path.join(out, f"train-{name}"), os.path.join(out, f"draft-{name}")
    step(os.path.join(draft, "config.json"),
         ["train", "--config", RECIPE, f"model.target_model_path={args.target}",
          f"data.hidden_states_path={features}", f"data.max_length={args.train_max_length}",
          f"training.num_epochs={args.epochs}", f"output_dir={run_dir}", f"tracking.wandb_dir={run_dir}",
          *([f"training.max_steps={args.max_steps}"] if args.max_steps else []), *overrides])  # fmt: skip
    step(os.path.join(draft, "config.json"), ["export", "--checkpoint", run_dir, "--output", draft])
    return draft


def evaluate(args: argparse.Namespace, report: str, draft: Optional[str], test: str, train: str,
             extra: Sequence[str]) -> str:
    step(os.path.join(report, "report.json"),
         ["eval", *(["--draft", draft] if draft else []), "--features", test, "--train-features", train, "--target", args.target,
          "--max-new-tokens", args.max_new_tokens, "--output", report, *extra])  # fmt: skip
    return report


if __name__ == "__main__":
    raise SystemExit(run())
