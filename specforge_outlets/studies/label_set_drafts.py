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
# the recipe's; SD-only drops the length loss, LP-only the drafting loss). SD-only keeps the head's
# earlier 10x rate, the one its run started with, so that its checkpoints resume (an untrained head:
# the rate changes nothing).
DRAFTS = {"outlets": (), "sd-only": ("outlets.length_loss_weight=0", "outlets.length_head_lr_scale=10"),
          "lp-only": ("outlets.sd_loss_weight=0",)}
# Variants of a draft's run, each under its own name (``outlets-float32``) and curve: one setting
# changed at equal steps. float32: bf16's effect; head-lr-1x: the length head at the draft's learning
# rate, 1e-3 (the recipe's since; the runs named ``outlets`` and ``lp-only`` in curves.json trained
# before, at 10x); head-lr-10x: the earlier rate again. The paper's ablations: plain-attention (EAGLE-3's
# attention without the gate), head-on-fused (the length head on the fused target features, not on
# the draft decoder's state), last-layer (the draft reads the target's last layer, not the three fused depths).
VARIANTS = {"float32": ("model.torch_dtype=float32",), "head-lr-1x": ("outlets.length_head_lr_scale=1",),
            "head-lr-10x": ("outlets.length_head_lr_scale=10",),
            "plain-attention": ("outlets.gated_attention=false",), "head-on-fused": ("outlets.head_input=fused",),
            "last-layer": ("outlets.target_features=last_layer",)}
