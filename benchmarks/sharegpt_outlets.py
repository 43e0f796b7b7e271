"""The demo pipeline on real ShareGPT prompts: regenerate with SmolLM2, train OUTLETS, evaluate.

Reads ../shared/data/prompts/sharegpt_first_turn_2978.jsonl when present (never copied into the
repo). The file is sorted longest prompt first, so prompts are drawn at random (seeded). Writes
the evaluation report under the run directory and prints where.

    python benchmarks/sharegpt_outlets.py --prompts 120 --output runs/bench-sharegpt
"""

from __future__ import annotations

import argparse
import os
import sys

from specforge_outlets.cli import main

PROMPTS = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "prompts",
                       "sharegpt_first_turn_2978.jsonl")


def run() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=120)
    parser.add_argument("--output", default="runs/bench-sharegpt")
    args = parser.parse_args()
    if not os.path.isfile(PROMPTS):
        print(f"no ShareGPT prompts at {os.path.abspath(PROMPTS)}; nothing to benchmark", file=sys.stderr)
        return 1
    return main(["demo", "--prompts-file", os.path.abspath(PROMPTS), "--prompts", str(args.prompts),
                 "--output", args.output])


if __name__ == "__main__":
    raise SystemExit(run())
