"""OUTLETS, SD-only and LP-only drafts trained until their validation curves flatten (or a stated budget).

Runs on the ShareGPT label set's captured features (``benchmarks/sharegpt_outlets.py --until
capture``). Three subcommands, each resumable:

    python benchmarks/convergence.py --run RUN split                 # validation split by prompt group
    python benchmarks/convergence.py --run RUN train --draft outlets # train; killed or stopped, rerun it
    python benchmarks/convergence.py --run RUN curve                 # evaluate new checkpoints only
    python benchmarks/convergence.py --run RUN test                  # the chosen checkpoints on the test split
    python benchmarks/convergence.py --run RUN scale                 # OUTLETS and the N/2 probe on nested subsets

``train`` runs ``outlets train`` on one thread (a core stays free) to ``--budget`` optimizer steps
with a checkpoint every ``--first-step`` (250); restarted, it resumes from the newest complete checkpoint
(``training/resumable.py``). While it trains, every checkpoint at a doubling step (250, 500, 1,000,
...) and the budget's last one is evaluated on the validation split (``evaluation/checkpoint_curve.py``) and the draft is
stopped once the last doubling improved each of its own objectives by under 2%. Curves go to
``--report`` (default ``benchmarks/data/sharegpt-smollm2/convergence/``: ``curves.json`` and
``curves.png``, committed). Only ``test`` reads the test split: ``outlets eval`` of each draft's chosen
checkpoint (its last evaluated one, or ``--step``) against every baseline fitted on the drafts' own
training responses (the fit split, censored ones one-sided as the drafts trained), into
``--report``/``eval/``; the OUTLETS draft is scored with a quantile head fitted on its frozen states
(``outlets fit-quantile-head``) whose served shifts the validation split calibrates (the export then
goes to ``--report``/draft-outlets/), the probes with their own heads, calibrated by eval on the same split.
Keep ``--run`` outside the work tree: checkpoints are large and must outlive a fresh checkout.

``scale`` answers the scaling claim on the validation split: OUTLETS trained on nested subsets of the
fit split (``SCALING_FRACTIONS``) at the same relative budget as the full run's point at
``SCALING_STEP`` (the schedule and the stop both scaled by the fraction, so each size sees the same
number of epochs at the same place in its schedule), and the N/2 probe fitted on the same subsets.
Runs and points go to ``--report``/``scaling/`` (``scaling.json``, ``scaling.png``).

The study's parts are ``specforge_outlets.studies.convergence`` (curves, training_runs, scoring,
scaling); this script is its command.
"""

from __future__ import annotations

import argparse

from specforge_outlets.evaluation.checkpoint_curve import FIRST_STEP
from specforge_outlets.studies.convergence.curves import DEFAULT_BUDGET, REPORT, recorded_budget
from specforge_outlets.studies.convergence.scaling import scale
from specforge_outlets.studies.convergence.scoring import TEST_BASELINES, draft_step, test
from specforge_outlets.studies.convergence.training_runs import curve, split, train
from specforge_outlets.studies.label_set_drafts import DRAFTS, VARIANTS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="the sharegpt_outlets.py output (features/train)")
    parser.add_argument("--budget", type=int,
                        help=f"optimizer steps at most per draft (default: the budget --report's curves.json records, "
                             f"else {DEFAULT_BUDGET}; it sets the runs' cosine schedule and their evaluated checkpoints)")
    parser.add_argument("--first-step", type=int, default=FIRST_STEP,
                        help="the first evaluated checkpoint, then every doubling (and the checkpoint interval)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: a core stays free)")
    parser.add_argument("--max-length", type=int, default=2048, help="training sequence length (tokens)")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--report", default=REPORT, help="where curves.json and curves.png go")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("split")
    trainer = sub.add_parser("train")
    trainer.add_argument("--draft", choices=list(DRAFTS), required=True)
    trainer.add_argument("--variant", choices=list(VARIANTS),
                         help="a variant run: one setting changed (its own name and curve)")
    trainer.add_argument("--until-step", type=int,
                         help="stop once the checkpoint at this step is evaluated (the schedule stays --budget's)")
    curver = sub.add_parser("curve")
    curver.add_argument("--fill", action="store_true",
                        help="also rescore the length side of points scored before a length metric existed")
    curver.add_argument("--runs", nargs="*", help="only these runs (e.g. outlets-head-lr-1x; default: every run)")
    sub.add_parser("scale")
    tester = sub.add_parser("test")
    tester.add_argument("--step", nargs="*", type=draft_step, default=[], metavar="DRAFT=STEP",
                        help="a draft's checkpoint to score (default: its last evaluated one)")
    tester.add_argument("--baselines", type=lambda text: text.split(","), default=list(TEST_BASELINES),
                        help=f"outlets eval's --baselines (default: {','.join(TEST_BASELINES)}); another list "
                             "writes test-report-<names> and --report/eval-<names>")
    parser.set_defaults(fit=None, train_files=None, until_step=None, variant=None)  # scale's subset runs set them
    args = parser.parse_args()
    if args.budget is None:  # a curve or test call without --budget keeps the runs' own
        args.budget = recorded_budget(args.report)
    {"split": split, "train": train, "curve": curve, "test": test, "scale": scale}[args.command](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
