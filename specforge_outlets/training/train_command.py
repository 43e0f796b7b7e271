"""``outlets train``: SpecForge's launcher and trainer with the ``eagle3-outlets`` algorithm.

One process, torchrun with many ranks, and several nodes all work the way ``specforge train``
does: the launch plan is SpecForge's, only its worker entry point is ours, so every rank
registers the algorithm before SpecForge resolves the run.
"""

from __future__ import annotations

import os
import sys

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

    recipe = load_recipe(args.config, args.overrides)
    resolved = resolve_run(recipe.config, outlets_registry(recipe.settings, recipe.config.model.torch_dtype))
    plan = build_launch_plan(
        resolved.config,
        algorithm=resolved.algorithm,
        config_path=args.config,
        overrides=args.overrides,
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
    return 0
