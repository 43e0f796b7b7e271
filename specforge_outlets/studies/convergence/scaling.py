"""The scaling claim on the validation split: OUTLETS and the N/2 probe on nested subsets of the fit split.

OUTLETS is trained on each subset (``SCALING_FRACTIONS``) at the same relative budget as the full run's
point at ``SCALING_STEP`` (the schedule and the stop both scaled by the fraction, so each size sees the
same number of epochs at the same place in its schedule); the N/2 probe is fitted on the same subsets.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from typing import Any, Dict

from specforge_outlets.atomic import write_text_atomic
from specforge_outlets.demo.stages import written
from specforge_outlets.evaluation.checkpoint_curve import length_metrics, plot_scaling
from specforge_outlets.studies.convergence.curves import paths, read_curves, run_name
from specforge_outlets.studies.convergence.scoring import TEST_RUNS
from specforge_outlets.studies.convergence.training_runs import train

SCALING_FRACTIONS = (0.125, 0.25)  # nested subsets of the fit split's files; the whole split is the third size
SCALING_STEP = 1000  # the main OUTLETS run's point (about one epoch) whose relative budget each subset gets


def scale(args: argparse.Namespace) -> None:
    """OUTLETS and the N/2 probe on nested subsets of the fit split at one relative budget; resumable per size."""
    from specforge_outlets.data.feature_subset import subset_features
    from specforge_outlets.data.manifest import read_manifest

    where = paths(args.run)
    report = os.path.join(args.report, "scaling")
    total = len(read_manifest(where["fit"])["files"])
    points = []
    for fraction in (*SCALING_FRACTIONS, 1.0):
        files = round(fraction * total)
        if fraction < 1.0:
            fit = os.path.join(where["base"], "features", f"fit-{files}")
            if not written(os.path.join(fit, "manifest.json")):
                shutil.rmtree(fit, ignore_errors=True)  # a half-linked subset is linked again
                subset_features(where["fit"], fit, files, seed=0)
            until = round(SCALING_STEP * fraction)
            sized = argparse.Namespace(**{**vars(args), "fit": fit, "train_files": files, "report": report,
                                          "budget": round(args.budget * fraction), "first_step": until,
                                          "until_step": until, "draft": "outlets", "variant": None})
            train(sized)
            outlets_point = read_curves(sized)["drafts"][run_name("outlets", None, files)]["points"][-1]
        else:  # the full fit split: the main run's point at the same relative budget
            fit = where["fit"]
            outlets_point = next(point for point in read_curves(args)["drafts"][TEST_RUNS["outlets"]]["points"]
                                 if point["step"] == SCALING_STEP)
        points.append({"fraction": fraction, "train_files": files, "outlets": outlets_point,
                       "probe-mid": probe_point(args, fit, report, files)})
        write_text_atomic(os.path.join(report, "scaling.json"), json.dumps({"points": points}, indent=2))
    plot_scaling(points, os.path.join(report, "scaling.png"))
    print(f"scaling: {os.path.join(report, 'scaling.json')}")


def probe_point(args: argparse.Namespace, fit: str, report: str, files: int) -> Dict[str, Any]:
    """The N/2 probe fitted on ``fit`` (censored responses one-sided, as the drafts), scored on validation; kept once written."""
    from specforge_outlets.evaluation.baselines.probe import MidProbePredictor
    from specforge_outlets.evaluation.predictor_api import EvalContext
    from specforge_outlets.evaluation.requests import load_split

    path = os.path.join(report, "probes", f"probe-mid-{files}.json")
    if written(path):
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    probe = MidProbePredictor(EvalContext(progress=False, options={"censored_training": "one_sided"}))
    probe.fit(load_split(fit, name="fit"))
    validation = load_split(paths(args.run)["val"], name="validation")
    point = {**length_metrics(validation, probe.predict(validation.with_censored()), one_sided=True), **probe.info}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_text_atomic(path, json.dumps(point, indent=2))
    return point
