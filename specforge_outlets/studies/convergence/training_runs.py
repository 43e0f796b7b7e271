"""The validation split, and a draft trained until its stopping rule while its doubling checkpoints are scored.

``train`` runs ``outlets train`` to ``--budget`` optimizer steps with a checkpoint every ``--first-step``;
restarted, it resumes from the newest complete checkpoint (``training/resumable.py``). While it trains,
every checkpoint at a doubling step is evaluated on the validation split
(``evaluation/checkpoint_curve.py``), and the draft is stopped once the last doubling improved each of
its own objectives by under 2%.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional

from specforge_outlets.data.feature_subset import split_validation
from specforge_outlets.demo.stages import written
from specforge_outlets.evaluation.checkpoint_curve import (checkpoint_point, doubling_steps, length_metrics, plot_curves,
                                                           stop_reason)
from specforge_outlets.studies.convergence.curves import (export_dir, paths, read_curves, run_name, train_dir,
                                                          write_entry)
from specforge_outlets.studies.label_set_drafts import DRAFTS, RECIPE, VARIANTS
from specforge_outlets.training.resumable import complete_checkpoints, prune_checkpoints, resume_overrides, supervise

POLL_S = 60.0  # seconds between looks for a new checkpoint while training
VALIDATION_SHARE = 0.1  # of the train split's prompt groups
# The method settings of the convergence runs: the recipe's, with censored responses trained
# one-sided (the label-set work's choice: docs/training.md).
METHOD = ("outlets.length_censored=one_sided",)


def split(args: argparse.Namespace) -> None:
    where = paths(args.run)
    if written(os.path.join(where["val"], "manifest.json")):
        return
    split_validation(where["train"], where["fit"], where["val"], VALIDATION_SHARE, seed=0)
    print(f"validation split: {where['fit']} and {where['val']}")


def train_argv(args: argparse.Namespace, name: str) -> List[str]:
    out = train_dir(args, name)
    variant = VARIANTS[args.variant] if args.variant else ()
    return [sys.executable, "-m", "specforge_outlets.cli", "train", "--config", RECIPE,
            f"model.target_model_path={args.target}", f"data.hidden_states_path={args.fit or paths(args.run)['fit']}",
            f"data.max_length={args.max_length}", "training.num_epochs=1000", f"training.max_steps={args.budget}",
            f"training.save_interval={args.first_step}", f"output_dir={out}", f"tracking.wandb_dir={out}",
            f"run_id={name}", *METHOD, *DRAFTS[args.draft], *variant, *resume_overrides(out, name)]  # fmt: skip


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
