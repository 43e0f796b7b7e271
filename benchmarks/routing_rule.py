"""Routing rules side by side on the regime map's colocated cluster: round robin, total_requests, total_tokens
(SGLang's, prediction-free), least predicted work and least requests then work (with every rung).

Stages, resumable (a cell's JSON keeps its runs; a rerun simulates only what a cell lacks):

- ``simulate``: one JSON per (load, seed) under ``cells/``;
- ``report``: ``result.json`` and ``table.md`` (ratios to the best prediction-free peer per load and metric).

    OMP_NUM_THREADS=1 nice -n 15 .venv/bin/python benchmarks/routing_rule.py

The study is ``specforge_outlets.studies.routing_rule``; this script is its command.
"""

from __future__ import annotations

import argparse
import os

from specforge_outlets.studies import routing_rule
from specforge_outlets.studies.committed_data import REPO
from specforge_outlets.studies.regime_map.regimes import LOADS, ONLINE_REQUESTS
from specforge_outlets.studies.stages import run_stages

OUTPUT = os.path.join(REPO, "benchmarks", "data", "routing-rule")
CAPACITY = os.path.join(REPO, "benchmarks", "data", "regime-map", "capacity.json")
# the converged drafts' record, as the regime map's
RECORD = os.path.join(REPO, "benchmarks", "data", "sharegpt-smollm2", "convergence", "eval", "predictions.jsonl.gz")


def simulate(args) -> None:
    from specforge_outlets.studies.label_set_samples import LabelSetSamples

    routing_rule.simulate(args, LabelSetSamples(args.record))


STAGES = {"simulate": simulate, "report": routing_rule.report}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stages", nargs="*", help=f"of {', '.join(STAGES)} (default: all, in order)")
    parser.add_argument("--loads", type=float, nargs="+", default=list(LOADS), help="fractions of capacity")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--requests", type=int, default=ONLINE_REQUESTS, help="per run")
    parser.add_argument("--stacks", nargs="+", choices=list(routing_rule.STACKS), default=list(routing_rule.STACKS),
                        help="queue and admission of the predicted routings, the first simulated first")
    parser.add_argument("--capacity", default=CAPACITY, help="the regime map's capacity.json")
    parser.add_argument("--output", default=OUTPUT)
    parser.add_argument("--record", default=RECORD, help="the evaluation record the learned rungs read")
    run_stages(parser, parser.parse_args(), STAGES)


if __name__ == "__main__":
    main()
