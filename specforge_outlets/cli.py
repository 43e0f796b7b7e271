"""``outlets``: one console script, one sub-command per stage of the pipeline.

Each command lives in its own module exposing ``register(subparsers)``; heavy imports stay inside
the command functions so that ``outlets --help`` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

from specforge_outlets.errors import OutletsError

# Stage order: data -> training -> evaluation -> serving studies.
COMMAND_MODULES = (
    "specforge_outlets.data.prepare_command",
    "specforge_outlets.data.regenerate_command",
    "specforge_outlets.data.capture_command",
    "specforge_outlets.training.train_command",
    "specforge_outlets.training.export_command",
    "specforge_outlets.evaluation.quantile_refit_command",
    "specforge_outlets.evaluation.eval_command",
    "specforge_outlets.simulation.simulate_command",
    "specforge_outlets.simulation.fit_step_time_command",
    "specforge_outlets.loadgen.bench_command",
    "specforge_outlets.loadgen.compare_command",
    "specforge_outlets.demo.demo_command",
    "specforge_outlets.recipes_command",
)
DISTRIBUTION = "specforge-outlets"  # setup.py's name


# An optional dependency a command imports -> the install that brings it (setup.py's extras).
INSTALL_FOR_MODULE = {
    "specforge": "SpecForge 0.2.0: pip install 'specforge-outlets[train]' (in a checkout: make install)",
    "wandb": "wandb: pip install wandb (both the train and the serve extra bring it; in a checkout: make install, "
             "make serve-env)",
    "sglang": "SGLang 0.5.23, in its own environment: pip install 'specforge-outlets[serve]' (in a checkout: make serve-env)",
    "gguf": "gguf: pip install 'specforge-outlets[data]' (in a checkout: make install)",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="outlets",
        description="OUTLETS: output-length prediction from EAGLE-3 draft states (SpecForge + SGLang).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in COMMAND_MODULES:
        importlib.import_module(module).register(subparsers)
    return parser


def version() -> str:
    """The installed distribution's version (setup.py's), as pip reports it."""
    from importlib.metadata import PackageNotFoundError, version as installed_version

    try:
        return installed_version(DISTRIBUTION)
    except PackageNotFoundError:  # imported from a checkout that was never installed
        return "unknown (not installed: pip install -e .)"


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except OutletsError as exc:
        print(f"outlets {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        install = INSTALL_FOR_MODULE.get((exc.name or "").split(".")[0])
        if install is None:
            raise
        print(f"outlets {args.command}: error: {exc.name} is not installed; this command needs {install}",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
