"""``outlets demo``: build a target, capture features, train an OUTLETS draft, export it, report.

This runs the training half of the pipeline end to end in about a minute on two CPU cores, on a
tiny randomly initialised Llama target whose synthetic conversations have a length that the
prompt determines (so there is something to learn). Each stage is skipped when its output
exists, so an interrupted demo resumes. The data and evaluation stages on the real embedded
target (SmolLM2-135M-Instruct) join here as those parts of the project land.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time


def register(subparsers) -> None:
    parser = subparsers.add_parser("demo", help="run the main job end to end on a local target")
    parser.add_argument("--output", default="runs/demo", help="run directory (default: runs/demo)")
    parser.add_argument("--conversations", type=int, default=48, help="synthetic conversations to capture")
    parser.set_defaults(func=run)


def stage(number: int, title: str, done: bool) -> bool:
    print(f"[{number}/4] {title}{' (cached)' if done else ''}", flush=True)
    return not done


def run(args) -> int:
    from specforge_outlets.data.features import load_features
    from specforge_outlets.demo.tiny_target import make_features, make_tiny_target, write_recipe
    from specforge_outlets.model.draft import OutletsLlamaForCausalLMEagle3
    from specforge_outlets.model.inference import labelled_predictions
    from specforge_outlets.training.export_command import export_draft

    root = os.path.abspath(args.output)
    target, features = os.path.join(root, "target"), os.path.join(root, "features")
    train_dir, export_dir = os.path.join(root, "train"), os.path.join(root, "draft")
    started = time.time()

    if stage(1, f"tiny Llama target -> {target}", os.path.isfile(os.path.join(target, "draft_config.json"))):
        make_tiny_target(target)
    if stage(2, f"{args.conversations} conversations -> features {features}",
             os.path.isfile(os.path.join(features, "manifest.json"))):
        make_features(target, features, count=args.conversations, seed=0, censor_every=8)
    if stage(3, f"outlets train -> {train_dir}", bool(glob.glob(os.path.join(train_dir, "*-latest")))):
        recipe = write_recipe(os.path.join(root, "recipe.yaml"), target, features, train_dir,
                              training={"log_interval": 10})
        subprocess.run([sys.executable, "-m", "specforge_outlets.cli", "train", "--config", recipe], check=True)
    if stage(4, f"outlets export -> {export_dir}", os.path.isfile(os.path.join(export_dir, "model.safetensors"))):
        export_draft(train_dir, export_dir)

    trained = OutletsLlamaForCausalLMEagle3.from_export(export_dir, target_model_path=target)
    untrained = OutletsLlamaForCausalLMEagle3(trained.config).float().eval()
    untrained.load_embedding(target)
    print("\nstatic prediction (at the last prompt position) against the true response length:")
    print(f"{'conversation':>18} {'true':>6} {'untrained':>10} {'OUTLETS':>8}")
    abs_errors = {"untrained": [], "OUTLETS": []}
    for path in sorted(glob.glob(os.path.join(features, "*.ckpt"))):
        sample = load_features(path)
        predicted, true = labelled_predictions(trained, sample)
        before, _ = labelled_predictions(untrained, sample)
        if true.numel() == 0:
            continue  # a censored response: no label
        abs_errors["OUTLETS"].append(float((predicted[0] - true[0]).abs()))
        abs_errors["untrained"].append(float((before[0] - true[0]).abs()))
        if len(abs_errors["OUTLETS"]) <= 8:
            print(f"{os.path.basename(path).removesuffix('.ckpt'):>18} {int(true[0]):>6} {float(before[0]):>10.1f} {float(predicted[0]):>8.1f}")
    n = len(abs_errors["OUTLETS"])
    print(f"\nstatic MAE over {n} labelled conversations: untrained {sum(abs_errors['untrained']) / n:.1f} tokens, "
          f"OUTLETS {sum(abs_errors['OUTLETS']) / n:.1f} tokens")
    print(f"draft: {export_dir}  ({sum(p.numel() for p in trained.parameters()) / 1e3:.0f}k parameters, "
          f"length head {sum(p.numel() for p in trained.length_head.parameters())})")
    print(f"finished in {time.time() - started:.0f} s")
    return 0
