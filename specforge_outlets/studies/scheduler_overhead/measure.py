"""``measure``: the parts measured in one process, into result.json and report.md (``--parts`` keeps the others)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from specforge_outlets.atomic import write_text_atomic
from specforge_outlets.studies.committed_data import REPO
from specforge_outlets.studies.scheduler_overhead.ordering import QUEUE_SIZES, measure_ordering
from specforge_outlets.studies.scheduler_overhead.predictor import PROMPT_LENS, measure_predictor
from specforge_outlets.studies.scheduler_overhead.report import report
from specforge_outlets.studies.scheduler_overhead.routing import RANKS, SNAPSHOT_WAITING, measure_routing, measure_snapshot

REPETITIONS = 7
PARTS = ("ordering", "routing", "snapshot", "predictor")


def measure(args: argparse.Namespace) -> None:
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    from sglang.srt.plugins import load_plugins

    load_plugins()
    quick = args.quick
    repetitions = 2 if quick else REPETITIONS
    path = os.path.join(args.output, "result.json")
    result = {"commands": {}, "machines": {}}
    if set(args.parts) != set(PARTS) and os.path.isfile(path):
        with open(path) as handle:
            result = json.load(handle)
    measured = {
        "ordering": lambda: measure_ordering(QUEUE_SIZES[:2] if quick else QUEUE_SIZES, repetitions),
        "routing": lambda: measure_routing(RANKS, repetitions),
        "snapshot": lambda: measure_snapshot(SNAPSHOT_WAITING, repetitions),
        "predictor": lambda: measure_predictor(args.draft, PROMPT_LENS[:1] if quick else PROMPT_LENS, repetitions),
    }
    for part in args.parts:
        if part == "predictor" and not os.path.isfile(os.path.join(args.draft, "config.json")):
            print(f"predictor: skipped, no outlets export at {args.draft} (run benchmarks/sharegpt_outlets.py, "
                  "or pass --draft DIR from `outlets export`)", flush=True)
            continue
        if part == "predictor":
            result["draft"] = os.path.relpath(args.draft, REPO)
        result[part] = measured[part]()
        result["commands"][part] = "python benchmarks/scheduler_overhead.py measure " + " ".join(sys.argv[2:])
        result["machines"][part] = f"{os.cpu_count()} cores, python {sys.version.split()[0]}"
    write_text_atomic(path, json.dumps(result, indent=1))
    with open(os.path.join(args.output, "report.md"), "w") as handle:
        handle.write(report(result))
    print(report(result))
