"""A study command's stages, named on its command line and run in order (all of them when none is named)."""

from __future__ import annotations

import argparse
from typing import Callable, Dict


def run_stages(parser: argparse.ArgumentParser, args: argparse.Namespace,
               stages: Dict[str, Callable[[argparse.Namespace], None]]) -> None:
    """Run ``args.stages`` (every stage, in order, if empty); an unknown name is the parser's error."""
    unknown = [stage for stage in args.stages if stage not in stages]
    if unknown:
        parser.error(f"unknown stage(s) {', '.join(unknown)}; of {', '.join(stages)}")
    for stage in args.stages or list(stages):
        stages[stage](args)
