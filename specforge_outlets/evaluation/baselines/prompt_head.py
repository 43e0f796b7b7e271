"""Fitting a head on one embedding per prompt: what the prompt-only baselines (``bert``, ``lm-classifier``) share.

They differ in the embedding (``predictor.embeddings``) and in what the head learns from the
lengths (``targets``: log lengths, length buckets); the fit itself, on the predictor's training
split with its censored responses fitted one-sided, is the same.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from specforge_outlets.evaluation.heads import HeadSettings, fit_head
from specforge_outlets.evaluation.requests import Split


def fit_prompt_head(predictor, train: Split, targets: Callable[[Sequence[float]], torch.Tensor],
                    settings: HeadSettings) -> None:
    """Fit ``predictor.model`` on the embeddings of its training split, the lengths turned into ``targets``."""
    train = predictor.training_split(train)
    x = predictor.embeddings(train, f"{predictor.name}: embed train")
    fitted = fit_head(x, targets(train.lengths), settings, seed=predictor.context.seed,
                      censored=torch.tensor([r.censored for r in train.requests]))
    predictor.model = fitted.model
    predictor.info.update(fitted.info())
