"""``outlets train``: SpecForge's launcher and trainer with the ``eagle3-outlets`` algorithm.

One process, torchrun with many ranks, and several nodes all work the way ``specforge train``
does: the launch plan is SpecForge's, only its worker entry point is ours, so every rank
registers the algorithm before SpecForge resolves the run.
"""

from __future__ import annotations

import os
import sys

from specforge_outlets.errors import OutletsError
from specforge_outlets.model.draft_config import DRAFT_CONFIG_FILE

# Workers re-enter through this CLI. torchrun's --no-python runs the command as given.
WORKER_PREFIX = (sys.executable, "-m", "specforge_outlets.cli")
TORCHRUN_PREFIX = (sys.executable, "-m", "torch.distributed.run", "--no-python")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train an OUTLETS draft (EAGLE-3 + length head) with SpecForge",
        description="Train an OUTLETS draft from a recipe: a SpecForge run config plus an `outlets:` block.",
    )
    parser.add_argument("-c", "--config", required=True, help="recipe YAML (see recipes/)")
    parser.add_argument("--role", choices=("auto", "all", "producer", "consumer", "both"), default="auto",
                        help="SpecForge launch role (workers get it from the launcher)")
    parser.add_argument("--node-rank", type=int, default=None, help="node rank for multi-node launches")
    parser.add_argument("--plan", action="store_true", help="print the process plan and exit")
    parser.add_argument("overrides", nargs="*", help="section.key=value, e.g. outlets.length_loss_weight=0")
    parser.set_defaults(func=run)


def run(args) -> int:
    from specforge.application import bind_run, resolve_run
    from specforge.cli import _config_for_role, _train, _worker_signal_unwind, _WorkerTermination
    from specforge.launch_plan import build_launch_plan, run_commands

    from specforge_outlets.training.algorithm import outlets_registry
    from specforge_outlets.training.head_lr import install_length_head_lr
    from specforge_outlets.training.progress import install_progress_line
    from specforge_outlets.training.tracking import install_outlets_config
    from specforge_outlets.training.preflight import check_recipe
    from specforge_outlets.training.recipe import load_recipe

    overrides = list(args.overrides)
    recipe = load_recipe(args.config, overrides)
    if "LOCAL_RANK" not in os.environ:  # the launching process decides; workers get its overrides
        resumed = resume_from_output_dir(recipe.config)
        if resumed:
            overrides.append(resumed)
            recipe = load_recipe(args.config, overrides)
    resolved = resolve_run(recipe.config, outlets_registry(recipe.settings, recipe.config.model.torch_dtype))
    plan = build_launch_plan(
        resolved.config,
        algorithm=resolved.algorithm,
        config_path=args.config,
        overrides=overrides,
        requested_role=args.role,
        node_rank=args.node_rank,
        worker_prefix=WORKER_PREFIX,
        torchrun_prefix=TORCHRUN_PREFIX,
    )
    if args.plan:
        print(plan.render())
        return 0
    if "LOCAL_RANK" not in os.environ:  # the launching process; torchrun workers skip the re-check
        draft_config = check_recipe(recipe, resolved.algorithm)
        os.makedirs(recipe.config.output_dir, exist_ok=True)
        draft_config.to_json_file(os.path.join(recipe.config.output_dir, DRAFT_CONFIG_FILE))
    if plan.kind != "worker":
        return run_commands(plan)
    for key, value in plan.worker_env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    install_length_head_lr(recipe.settings.length_head_lr_scale)
    install_progress_line()
    install_outlets_config(recipe.settings, recipe.config.output_dir)
    role_config = _config_for_role(resolved.config, plan.role)
    try:
        with _worker_signal_unwind():
            _train(bind_run(role_config, resolved.algorithm))
    except _WorkerTermination as received:
        return 128 + received.signum
    except ValueError as exc:
        refusal = trainer_refusal(exc, recipe.config)
        if refusal is None:
            raise
        raise refusal from None
    return 0


def resume_from_output_dir(cfg) -> str:
    """``training.resume_from=<newest checkpoint>`` when ``output_dir`` already holds complete checkpoints of
    this ``run_id`` and no resume source is given, else "": a rerun continues the run instead of training
    from step 0 over its checkpoints. A warm start from another draft into such a directory is refused."""
    from specforge_outlets.training.resumable import complete_checkpoints

    found = complete_checkpoints(cfg.output_dir, cfg.run_id)
    if not found or cfg.training.resume_from:
        return ""
    newest = max(found)
    if cfg.model.draft_checkpoint_path:
        raise OutletsError(
            f"output_dir={cfg.output_dir} already holds run {cfg.run_id!r} up to step {newest}, and "
            f"model.draft_checkpoint_path={cfg.model.draft_checkpoint_path} would start it again over those "
            "checkpoints; choose another output_dir or run_id, or drop model.draft_checkpoint_path to resume it"
        )
    print(f"outlets train: {cfg.output_dir} holds run {cfg.run_id!r} up to step {newest}: resuming from it "
          f"(training.resume_from={found[newest]}); choose another output_dir or run_id to start over",
          file=sys.stderr)
    return f"training.resume_from={found[newest]}"


# SpecForge's refusals of a training plan whose data and batch settings give no whole optimizer step
SCHEDULE_ERRORS = ("fixed training plan ends with incomplete gradient accumulation", "produces no optimizer step")


def trainer_refusal(exc: ValueError, cfg):
    """SpecForge's refusals raised inside the trainer, once the models are loaded (a schedule with no whole
    optimizer step, a checkpoint written with other settings than it resumes with), as one line naming
    the recipe fields to change; None for any other error."""
    text = str(exc)
    if any(part in text for part in SCHEDULE_ERRORS):
        return OutletsError(
            f"{text} (SpecForge counts whole batches of the feature files in data.hidden_states_path); change "
            "training.batch_size, training.accumulation_steps or training.num_epochs, or set training.max_steps"
        )
    source = cfg.training.resume_from
    if source and text.startswith(f"checkpoint {source} "):
        return OutletsError(f"training.resume_from={source}: {text}; or start over in another output_dir or run_id")
    return None
