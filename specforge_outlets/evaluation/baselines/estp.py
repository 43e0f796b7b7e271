"""ESTP (Ren et al., 2026): prefill states pooled by entropy x attention importance, CRPS + SmoothL1.

The second internal-state predictor of the seed papers. Where the paper is specific:

- a token's weight is its next-token entropy (as EGTP's, ``softmax(H)``) times its semantic
  importance: the attention the later prompt tokens pay it in the target's prefill
  self-attention, averaged over heads;
- position debiasing: under causal attention an early token can be attended by more queries, and
  a uniform attention pattern would give it ``sum_{j >= i} 1 / (j + 1)``; the importance is the
  attention received divided by that, so a token weighs more only if it is attended more than
  its position alone explains;
- the loss: CRPS of the predicted length distribution plus SmoothL1 of its expected log length.

Where it is silent, chosen here and written in docs/evaluation.md: the distribution (EGTP's 20
log-spaced bins, ``length_bins``), CRPS and SmoothL1 weighted alike, the depth (the middle or the
last captured depth, with that layer's attention, by validation loss), the head (the probes'
shared recipe). ESTP predicts before decoding only (its dynamic predictions are the countdown).
The target is run once per prompt to read its attention (the feature files keep no attention).
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch
import torch.nn as nn
from tqdm import tqdm

from specforge_outlets.errors import OutletsError
from specforge_outlets.evaluation.baselines.egtp import (DEFAULT_CAP, DEPTHS, SoftBinLoss, depth_states, entropy_cache,
                                                         fit_best_depth)
from specforge_outlets.evaluation.baselines.length_bins import LengthBins
from specforge_outlets.evaluation.baselines.pooled_states import entropy_weights, pool
from specforge_outlets.evaluation.predictor_api import Prediction, Predictor
from specforge_outlets.evaluation.requests import Split


def debiased_importance(attention: torch.Tensor) -> torch.Tensor:
    """[heads, T, T] causal attention of one prompt -> [T] attention received over a uniform pattern's."""
    received = attention.float().mean(0).sum(0)  # [T]: column sums, over the queries that can see each key
    positions = torch.arange(attention.shape[-1], dtype=torch.float32)
    uniform = torch.flip(torch.cumsum(torch.flip(1.0 / (positions + 1), [0]), 0), [0])  # sum_{j >= i} 1/(j+1)
    return received / uniform


class CrpsSmoothL1Loss(SoftBinLoss):
    """Discrete CRPS over the bins (width-weighted, in z) + SmoothL1 of E[z]; censored: both one-sided.

    It starts where EGTP's head starts (``SoftBinLoss.initialise``: the mean soft label)."""

    def __init__(self, bins: LengthBins) -> None:
        super().__init__(bins)
        self.upper = bins.centres() + bins.width / 2  # [K] each bin's upper edge in z

    def rows(self, out, y, censored):
        cdf = torch.cumsum(torch.softmax(out.float(), dim=-1), dim=-1)  # [N, K]
        at_or_below = (y.float()[:, None] <= self.upper[None, :]).float()
        # a censored length is above its bound: only mass below the bound is known to be wrong
        known = torch.where(censored[:, None], at_or_below == 0, torch.ones_like(cdf, dtype=torch.bool))
        crps = (((cdf - at_or_below) ** 2) * known).sum(-1) * self.bins.width
        error = self.bins.expected_z(out) - y.float()
        error = torch.where(censored, -nn.functional.relu(-error), error)
        return crps + nn.functional.smooth_l1_loss(error, torch.zeros_like(error), reduction="none")


class EstpPredictor(Predictor):
    name = "estp"
    description = ("ESTP: the target's prefill states pooled by entropy x position-debiased attention importance, "
                   "20-bin head trained with CRPS + SmoothL1, expectation")

    def _load(self) -> None:
        if hasattr(self, "target"):
            return
        if not self.context.target_path:
            raise OutletsError("the estp baseline runs the target for its attention and LM head: pass --target")
        from transformers import AutoModelForCausalLM

        self.target = AutoModelForCausalLM.from_pretrained(self.context.target_path, dtype=torch.float32,
                                                           attn_implementation="eager").eval()

    @torch.no_grad()
    def _importance(self, prompt_ids: torch.Tensor, layers: Dict[str, int]) -> Dict[str, torch.Tensor]:
        """Per depth, the debiased importance of each prompt token, from that depth's attention."""
        captured: Dict[int, torch.Tensor] = {}
        blocks = self.target.model.layers
        hooks = [blocks[index].self_attn.register_forward_hook(
            lambda _m, _i, output, index=index: captured.__setitem__(index, output[1][0]))
            for index in set(layers.values())]
        try:
            self.target.model(input_ids=prompt_ids[None], output_attentions=True)
        finally:
            for hook in hooks:
                hook.remove()
        return {depth: debiased_importance(captured[index]) for depth, index in layers.items()}

    def _layers(self, split: Split) -> Dict[str, int]:
        """The decoder layer whose attention goes with each depth's states."""
        fusion = split.manifest.get("fusion_layers")
        count = len(self.target.model.layers)
        middle = int(fusion[1]) if fusion else count // 2  # hidden_states[k] is the output of layer k - 1
        return {"mid": middle - 1, "last": count - 1}

    def _rows(self, split: Split) -> Tuple[Dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        self._load()
        layers = self._layers(split)
        cache = entropy_cache(self.context.target_path)
        pooled: Dict[str, List[torch.Tensor]] = {depth: [None] * len(split) for depth in DEPTHS}  # type: ignore[misc]
        for path, features, members in tqdm(split.by_file(), total=len(split.files()), desc="estp: attention",
                                            unit="file", disable=not self.context.progress, leave=False):
            entropies = cache.entropies(path, features["hidden_state"][0])
            for index, request in members:
                end = request.prompt_end + 1
                importance = self._importance(features["input_ids"][:end], layers)
                for depth in DEPTHS:
                    weights = entropy_weights(entropies[:end]) * importance[depth]
                    pooled[depth][index] = pool(depth_states(features, depth)[:end], weights)
        y = torch.log1p(torch.as_tensor(split.lengths, dtype=torch.float32))
        censored = torch.tensor([request.censored for request in split.requests])
        return {depth: torch.stack(rows) for depth, rows in pooled.items()}, y, censored

    def fit(self, train: Split) -> None:
        train = self.training_split(train)
        self.bins = LengthBins(self.context.max_new_tokens or DEFAULT_CAP)
        x, y, censored = self._rows(train)
        fit_best_depth(self, {depth: (x[depth], y, {"censored": censored}) for depth in DEPTHS},
                       CrpsSmoothL1Loss(self.bins), self.bins)

    @torch.no_grad()
    def predict(self, test: Split) -> List[Prediction]:
        x, _, _ = self._rows(test)
        return [Prediction(float(v)) for v in self.bins.expected_tokens(self.model(x[self.depth]))]

