"""Each rung's prediction quality on a workload: its censoring-aware C-index (``quality-<workload>.json``)."""

from __future__ import annotations

import json
import os

import numpy as np

from specforge_outlets.atomic import write_text_atomic
from specforge_outlets.evaluation.censoring import CensoredRequests, c_index
from specforge_outlets.studies.predictor_ladder.cells import LOADS
from specforge_outlets.studies.predictor_ladder.rungs import RUNGS, workloads

QUALITY_REQUESTS = 3000  # C-index pairs grow as the square: a trace's first requests suffice


def quality_path(output: str, workload: str) -> str:
    return os.path.join(output, f"quality-{workload}.json")


def quality(args) -> None:
    """Each rung's C-index (censoring-aware: a response cut at the cap is only known to be at least that long) on
    requests of the workload's knee (seed 0), as the simulator gives them; no prediction ranks nothing (0.5)."""
    for name, make in workloads(args.workloads, args.record).items():
        path = quality_path(args.output, name)
        scores = {}
        if os.path.exists(path):
            with open(path) as handle:
                scores = json.load(handle)["c_index"]
        if all(rung in scores for rung in RUNGS):
            continue
        work = make()
        trace, drawn = work.trace(LOADS[(name, "100k")][0], QUALITY_REQUESTS, 0)
        censored = work.censored[drawn] if drawn is not None else np.zeros(len(trace), bool)
        requests = CensoredRequests.of(trace.output_lens, censored)
        for rung, predict in [(rung, predict) for rung, predict in RUNGS.items() if rung not in scores]:
            predictions = predict(work, trace, drawn, 0)
            scores[rung] = 0.5 if predictions[0] is None else round(c_index(requests, predictions), 4)
        write_text_atomic(path, json.dumps({"workload": name, "requests": len(trace), "censored": int(censored.sum()),
                                            "c_index": scores}, indent=1))
        print(f"{name}: " + ", ".join(f"{rung} {score:.3f}" for rung, score in scores.items()), flush=True)
