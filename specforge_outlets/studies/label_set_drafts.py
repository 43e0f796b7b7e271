"""The ShareGPT label set's drafts: the recipe they train on, the ablations, the extra samples.

Shared by the benchmarks that build the label set and train on it (``benchmarks/sharegpt_outlets.py``),
train its drafts to convergence (``benchmarks/convergence.py``) and rescore its evaluation
(``benchmarks/rescore_committed_eval.py``), so that each reads the same settings.
"""

from __future__ import annotations

import os

from specforge_outlets.studies.committed_data import REPO

RECIPE = os.path.join(REPO, "recipes", "smollm2-135m-cpu-outlets.yaml")
# Seeds of the extra samples of the noise subset; the main run samples with seed 0.
NOISE_SEEDS = (1, 2, 3)
# The drafts trained on the full train split: OUTLETS and its two ablations (the method's lambda is
# the recipe's; SD-only drops the length loss, LP-only the drafting loss).
DRAFTS = {"outlets": (), "sd-only": ("outlets.length_loss_weight=0",), "lp-only": ("outlets.sd_loss_weight=0",)}
