"""The regime map: where a length prediction pays against SGLang's best prediction-free configuration.

Regimes (``REGIMES``): colocated (4 H100s, data-parallel, the GPU's own cache), PD decode-bound 2P+2D and the
paper's 1P+3D (SGLang's decode pre-allocation), each with Poisson arrivals; bursts above capacity (colocated and
2P+2D: ``arrivals.poisson_burst_arrival_times``); the Azure conversation trace's own timing (../shared or
$OUTLETS_SHARED_DIR, only when present); a memory-poor card (4 L4s, whose cache binds), Poisson and bursts; and
offline batches (N requests at once, and every sample of each prompt at once; makespan). Requests: the label
set's samples (the ladder's workload). Loads: 0.7, 0.9, 1.0 and 1.2 of each cluster's capacity, measured by a
bisection in the simulator (``capacity.json``; ``regime_map.capacity``), and a 16,000-request trace at capacity
(colocated, 2P+2D). Each cell runs SGLang's default and its best prediction-free configurations, and the plugin
layered on SGLang's default and on total_requests (its default order and admission, SJF, tail-safe by ranks,
longest-predicted-first in batches, its opt-in routing) with the ladder's rungs; r̂₀ acts from the end of prefill
(a batch: also from arrival, its prefill-only pass charged). TTFT as SGLang reports it (PD: the first decode
batch). Figures: whole trace and the steady window.

Stages, each resumable (a cell's JSON keeps its runs; a rerun simulates only what a cell lacks):

- ``simulate``: ``capacity.json``, then one JSON per (regime, shape, load, seed) under ``cells/``, seed 0 of every
  cell before any other seed;
- ``report``: ``map.json`` and ``map.md`` (ratios to the best prediction-free peer per cell and metric);
- ``plot``: ``docs/figures/regime-map.png``.

    OMP_NUM_THREADS=1 nice -n 15 .venv/bin/python benchmarks/regime_map.py --seeds 0      # the first pass
    .venv/bin/python benchmarks/regime_map.py report plot                                    # from the cells written

The study's parts are ``specforge_outlets.studies.regime_map``; this script is its command.
"""

from __future__ import annotations

import argparse
import os

from specforge_outlets.studies.committed_data import REPO
from specforge_outlets.studies.regime_map.cells import simulate
from specforge_outlets.studies.regime_map.plot import plot
from specforge_outlets.studies.regime_map.regimes import BATCH_SHAPES, LOADS, LONG_REQUESTS, ONLINE_REQUESTS, REGIMES
from specforge_outlets.studies.regime_map.report import report
from specforge_outlets.studies.stages import run_stages

OUTPUT = os.path.join(REPO, "benchmarks", "data", "regime-map")
FIGURE = os.path.join(REPO, "docs", "figures", "regime-map.png")
# the converged drafts' record, as issue 45's figures
RECORD = os.path.join(REPO, "benchmarks", "data", "sharegpt-smollm2", "convergence", "eval", "predictions.jsonl.gz")
STAGES = {"simulate": simulate, "report": report, "plot": plot}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stages", nargs="*", help=f"of {', '.join(STAGES)} (default: all, in order)")
    parser.add_argument("--regimes", nargs="+", choices=list(REGIMES), default=list(REGIMES))
    parser.add_argument("--loads", type=float, nargs="+", default=list(LOADS), help="fractions of capacity")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--requests", type=int, default=ONLINE_REQUESTS, help="per online run")
    parser.add_argument("--long-requests", type=int, default=LONG_REQUESTS,
                        help="the long trace's requests, at capacity, in the regimes that have one (0: none)")
    parser.add_argument("--batch-shapes", type=int, nargs="+", default=list(BATCH_SHAPES), help="requests at once")
    parser.add_argument("--output", default=OUTPUT)
    parser.add_argument("--record", default=RECORD, help="the evaluation record the learned rungs read")
    parser.add_argument("--figure", default=FIGURE)
    run_stages(parser, parser.parse_args(), STAGES)


if __name__ == "__main__":
    main()
