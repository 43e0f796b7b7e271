"""The ladder of predictors: does better prediction give better serving, against SGLang at its best?

Rungs (``RUNGS``), from no information to all of it: none; a constant (the train split's median,
261 tokens); OUTLETS r̂₀ shuffled across requests (its values, no per-request information); the
learned predictors' r̂₀ (the MiniLM regressor ``bert``, OUTLETS, the N/2 probe ``probe-mid``); the
per-prompt ceiling (each sample predicted by the mean of its prompt's other samples: the best a
predictor of the prompt alone can do, up to the noise of three samples); the oracle. Each rung runs
under every scheduler configuration that reads predictions (``CONFIGS``), beside the peers that read
none (``PEERS``): SGLang's and vLLM's defaults and SGLang tuned by its own knobs (a grid of
``--schedule-conservativeness``, ``SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR`` and
``SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS`` with ``total_requests`` / ``total_tokens`` balancing).

Workloads: the label set with its four samples per prompt (the test response and three regenerated
ones, ``noise-seed*.jsonl.gz``: 253 prompts of the evaluation record, every rung's values known per
sample, requests drawn uniformly from the 1,012 samples), and ``serving_study_sharegpt.py``'s
``sharegpt-chatgpt`` and ``azure-conv`` (../shared, read, never copied), where each rung's values
carry the errors it made on the label set's samples at a similar true length (``with_measured_errors``).
Azure's recorded arrivals are one trace: a seed takes its own window of ``--requests`` requests.
Caches (``REGIMES``): 4 colocated H100 instances of 100,000 KV tokens (the cache binds, as
``admission_study.py``) or of the GPU's own (454k tokens). Loads: each workload's knee and past it.

Stages, each resumable (a cell's JSON is kept and skipped; delete it to run again):

- ``simulate``: one JSON per (workload, cache, load, seed) under ``cells/``, every run in it (written after each
  run; a rerun simulates only the runs a cell lacks);
- ``quality``: each rung's censoring-aware C-index per workload (``quality-<workload>.json``);
- ``report``: ``report.md``, every ratio to the best SGLang peer at that load (mean [range] over seeds);
- ``plot``: ``docs/figures/predictor-ladder.png``, gain against prediction quality, one line per configuration.

    OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python benchmarks/predictor_ladder.py          # every stage
    .venv/bin/python benchmarks/predictor_ladder.py report plot                             # from the cells written

The converged drafts' rungs (``convergence.py test``'s record; the trace draws from its prompts, so
every run of a cell, peers too, is its own):

    .venv/bin/python benchmarks/predictor_ladder.py --workloads sharegpt-smollm2 --regimes 100k \
        --record benchmarks/data/sharegpt-smollm2/convergence/eval/predictions.jsonl.gz \
        --output benchmarks/data/predictor-ladder-converged --figure docs/figures/predictor-ladder-converged.png

The study's parts are ``specforge_outlets.studies.predictor_ladder`` (rungs, cells, quality, report, plot);
this script is its command.
"""

from __future__ import annotations

import argparse
import os

from specforge_outlets.studies.committed_data import EVAL_RECORD, REPO
from specforge_outlets.studies.predictor_ladder.cells import LOAD_NAMES, REGIMES, simulate
from specforge_outlets.studies.predictor_ladder.plot import plot
from specforge_outlets.studies.predictor_ladder.quality import quality
from specforge_outlets.studies.predictor_ladder.report import report
from specforge_outlets.studies.stages import run_stages

OUTPUT = os.path.join(REPO, "benchmarks", "data", "predictor-ladder")
FIGURE = os.path.join(REPO, "docs", "figures", "predictor-ladder.png")
STAGES = {"simulate": simulate, "quality": quality, "report": report, "plot": plot}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stages", nargs="*", help=f"of {', '.join(STAGES)} (default: all, in order)")
    parser.add_argument("--workloads", nargs="+", default=["sharegpt-smollm2", "sharegpt-chatgpt", "azure-conv"])
    parser.add_argument("--regimes", nargs="+", choices=list(REGIMES), default=list(REGIMES))
    parser.add_argument("--loads", nargs="+", choices=LOAD_NAMES, default=list(LOAD_NAMES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--output", default=OUTPUT)
    parser.add_argument("--record", default=EVAL_RECORD,
                        help="the evaluation record the learned rungs read (default: the committed label-set eval's)")
    parser.add_argument("--figure", default=FIGURE)
    args = parser.parse_args()
    if os.path.abspath(args.record) != EVAL_RECORD and os.path.abspath(args.output) == OUTPUT:
        parser.error(f"--record {args.record}: give it its own --output (the cells under {OUTPUT} are the committed "
                     "record's; a cell keeps the runs it has)")
    run_stages(parser, args, STAGES)


if __name__ == "__main__":
    main()
