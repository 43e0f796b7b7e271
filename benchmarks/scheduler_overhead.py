"""What the plugin costs on SGLang's scheduler hot path, side by side with SGLang's own policies.

SGLang re-sorts its waiting list every scheduling round and its data-parallel controller picks a
rank for every request, so whatever the plugin adds there is paid at the server's round and
request rate. Measured in one process, interleaved, medians over repetitions (serve environment):

- **ordering**, per scheduling round at 100-16,000 waiting requests: ``--schedule-policy outlets``
  (``sjf`` and ``tail-safe``: the plugin's ``sort_waiting``, keys cached on the requests) against
  SGLang's own sort helpers for ``lof``, ``hrrn`` and ``shortest-prefill-first`` (``fcfs`` sorts
  nothing). A *steady* round is the list as the last round left it, 1% admitted from the front and
  1% new arrivals appended, as in a saturated server; the *first* sort is a list in arrival order
  whose keys nothing has cached yet.
- **routing**, per dispatch at 2-16 ranks: the ``outlets`` load-balance method's dispatch against
  SGLang's ``round_robin`` and ``total_tokens`` dispatch functions on the same controller object
  (sockets replaced by a no-op), and the predicted work the scheduler adds to each load snapshot it
  publishes (256 running requests, 0-4,000 waiting).
- **prediction** (predictor-only mode), per request and per prefill token: the OUTLETS draft over a
  prompt's captured features, on this CPU, one thread, if an ``outlets export`` directory is given
  (``--draft``; default: the ShareGPT benchmark's trained draft).

The requests are SGLang's own ``Req`` objects (about 160 attributes each, as the scheduler holds
them: an order that reads attributes pays for their size), and SGLang's functions and the plugin's
hooks are the real ones.

    .venv-serve/bin/python benchmarks/scheduler_overhead.py measure --output benchmarks/data/scheduler-overhead
    .venv/bin/python benchmarks/scheduler_overhead.py plot benchmarks/data/scheduler-overhead/result.json

``--parts ordering`` measures one part again and keeps the others' rows in the output's result.json
(each part records the command that measured it): the predictor's cost needs a trained draft that
not every checkout has.

The study's parts are ``specforge_outlets.studies.scheduler_overhead`` (requests, ordering, routing,
predictor, measure, report, plot); this script is its command.
"""

from __future__ import annotations

import argparse
import os

from specforge_outlets.studies.committed_data import REPO
from specforge_outlets.studies.scheduler_overhead.measure import PARTS, measure
from specforge_outlets.studies.scheduler_overhead.plot import plot
from specforge_outlets.studies.scheduler_overhead.predictor import DEFAULT_DRAFT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("measure", help="measure (serve environment: SGLang + the plugin)")
    run.add_argument("--output", default=os.path.join(REPO, "benchmarks", "data", "scheduler-overhead"))
    run.add_argument("--draft", default=DEFAULT_DRAFT, help="an `outlets export` directory for the predictor cost")
    run.add_argument("--quick", action="store_true", help="small sizes and 2 repetitions (a smoke run)")
    run.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                     help="measure only these; the others' rows are kept from the output's result.json")
    run.set_defaults(func=measure)
    figure = commands.add_parser("plot", help="draw the figure from result.json (needs matplotlib)")
    figure.add_argument("result")
    figure.add_argument("--figure", default=os.path.join(REPO, "docs", "figures", "scheduler-overhead.png"))
    figure.set_defaults(func=plot)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
