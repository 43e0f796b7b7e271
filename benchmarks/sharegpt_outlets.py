"""OUTLETS on real ShareGPT prompts: regenerate with SmolLM2, capture, train, evaluate against the baselines.

Reads ../shared/data/prompts/sharegpt_first_turn_2978.jsonl when present (never copied into the
repo). The file is sorted longest prompt first: ``--sample first`` takes the first N prompts (the
data issue's 64-prompt check; 1,100-2,400 tokens each, so capture and training need long
sequences), ``--sample random`` a seeded random draw. Every step is an ``outlets`` command and
resumes: regeneration appends, and a step whose output exists is skipped. Prints where the report is.

    python benchmarks/sharegpt_outlets.py --prompts 64 --sample first --output runs/bench-sharegpt64
"""

from __future__ import annotations

import argparse
import os
import sys

from specforge_outlets.cli import main as outlets

PROMPTS = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "prompts",
                       "sharegpt_first_turn_2978.jsonl")
RECIPE = os.path.join(os.path.dirname(__file__), "..", "recipes", "smollm2-135m-cpu-outlets.yaml")


def step(done_marker: str, argv) -> None:
    """Run one ``outlets`` command unless its output already exists."""
    if os.path.exists(done_marker):
        print(f"skip (exists): {done_marker}")
        return
    code = outlets([str(arg) for arg in argv])
    if code != 0:
        raise SystemExit(f"`outlets {argv[0]}` failed with exit status {code}")


def run() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--sample", choices=("first", "random"), default="first")
    parser.add_argument("--max-new-tokens", type=int, default=384)
    parser.add_argument("--max-length", type=int, default=3072, help="training sequence length (prompt + response)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--output", default="runs/bench-sharegpt64")
    args = parser.parse_args()
    if not os.path.isfile(PROMPTS):
        print(f"no ShareGPT prompts at {os.path.abspath(PROMPTS)}; nothing to benchmark", file=sys.stderr)
        return 1
    out = os.path.abspath(args.output)
    data, regen, features = (os.path.join(out, name) for name in ("data", "regen", "features"))
    step(os.path.join(data, "summary.json"),
         ["prepare", "--dataset", "jsonl", "--path", os.path.abspath(PROMPTS), "--output", data,
          "--max-samples", args.prompts, "--sample", args.sample])
    for split in ("train", "test"):
        outlets_argv = ["regenerate", "--backend", "hf", "--target", args.target, "--resume", "--batch-size", 8,
                        "--input", os.path.join(data, f"{split}.jsonl"), "--output", os.path.join(regen, f"{split}.jsonl"),
                        "--max-new-tokens", args.max_new_tokens]
        step(os.path.join(regen, f"{split}.summary.json"), outlets_argv)
        step(os.path.join(features, split, "manifest.json"),
             ["capture", "--target", args.target, "--input", os.path.join(regen, f"{split}.jsonl"),
              "--output", os.path.join(features, split), "--max-length", 8192])
    train, draft = os.path.join(out, "train"), os.path.join(out, "draft")
    if not os.path.exists(os.path.join(draft, "config.json")):  # an interrupted run resumes from its checkpoint
        step(os.path.join(draft, "config.json"),
             ["train", "--config", RECIPE, f"model.target_model_path={args.target}",
              f"data.hidden_states_path={os.path.join(features, 'train')}", f"data.max_length={args.max_length}",
              f"output_dir={train}", f"tracking.wandb_dir={train}", f"training.num_epochs={args.epochs}",
              "training.batch_size=1"])
    step(os.path.join(draft, "config.json"), ["export", "--checkpoint", train, "--output", draft])
    report = os.path.join(out, "report")
    step(os.path.join(report, "report.json"),
         ["eval", "--draft", draft, "--features", os.path.join(features, "test"),
          "--train-features", os.path.join(features, "train"), "--target", args.target, "--output", report])
    print(f"report: {os.path.join(report, 'report.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
