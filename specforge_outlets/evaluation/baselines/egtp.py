"""EGTP (Xie et al., 2026): entropy-guided pooling of the target's states, a soft-label bin head.

The internal-state predictor the seed papers compare against. Where the paper is specific:

- the pooled state: the target's prefill hidden states weighted by ``softmax(H)``, ``H`` each
  token's next-token entropy (``pooled_states``);
- the head: a distribution over 20 length bins trained on soft labels with ``0.95 CE + 0.05 MSE``
  (the MSE on the distribution's expected log length), the prediction its expectation;
- the progressive variant: the pool grows over the tokens generated so far and the head
  re-predicts the remaining length at every position (dynamic predictions, like the probes').

Where it is silent, chosen here and written in docs/evaluation.md: the bins (``length_bins``:
log-spaced to the cap), the soft labels' width (one bin), the depth (the middle or the last of
the captured depths, whichever has the lower validation loss, as ``info.layer`` says), the head
(one hidden layer of 256, the probes' shared recipe, ``heads.fit_head``), and training positions
(``t = 0`` and up to 63 more per response, as the probes).
"""

from __future__ import annotations

import functools
from typing import Dict, List, Tuple

import torch
import torch.nn as nn
from tqdm import tqdm

from specforge_outlets.errors import OutletsError
from specforge_outlets.evaluation.baselines.length_bins import NUM_BINS, LengthBins
from specforge_outlets.evaluation.baselines.pooled_states import EntropyCache, entropy_weights, running_pool
from specforge_outlets.evaluation.baselines.probe import training_rows
from specforge_outlets.evaluation.heads import HeadLoss, HeadSettings, fit_head
from specforge_outlets.evaluation.predictor_api import DYNAMIC_MODEL, Prediction, Predictor
from specforge_outlets.evaluation.requests import Split
from specforge_outlets.model.length_head import tail_log_probability

CE_WEIGHT, MSE_WEIGHT = 0.95, 0.05  # EGTP's loss
SETTINGS = HeadSettings(hidden=(256,), outputs=NUM_BINS, max_epochs=60)  # the probes' recipe, 20 bins out
DEFAULT_CAP = 2048  # bins up to this many tokens when the regeneration's limit is unknown


@functools.lru_cache(maxsize=1)
def entropy_cache(target_path: str) -> EntropyCache:
    """One cache per target, shared by EGTP and ESTP in one `outlets eval`."""
    return EntropyCache(target_path)


def depth_states(features: Dict[str, torch.Tensor], depth: str) -> torch.Tensor:
    """[T, H] states of the middle captured depth (N/2) or the last hidden state."""
    hidden = features["hidden_state"].shape[-1]
    if depth == "last":
        return features["hidden_state"][0]
    return features["aux_hidden_state"][0, :, hidden : 2 * hidden]


DEPTHS = ("mid", "last")  # chosen by validation loss


def fit_best_depth(predictor: Predictor, rows: Dict[str, Tuple[torch.Tensor, torch.Tensor, Dict[str, torch.Tensor]]],
                   loss: HeadLoss, bins: LengthBins) -> None:
    """Fit the shared recipe on each depth's ``(x, y, fit_head options)``; keep the lower validation loss."""
    fitted = {depth: fit_head(x, y, SETTINGS, seed=predictor.context.seed, loss=loss, **options)
              for depth, (x, y, options) in rows.items()}
    predictor.depth = min(fitted, key=lambda depth: fitted[depth].validation_loss)
    predictor.model = fitted[predictor.depth].model
    predictor.info.update(layer=predictor.depth, bins=bins.count, cap=bins.cap, **fitted[predictor.depth].info(),
                          validation_loss_by_depth={d: round(f.validation_loss, 6) for d, f in fitted.items()})


class SoftBinLoss(HeadLoss):
    """``0.95 CE(soft labels) + 0.05 (E[z] - z)^2``; censored rows: the tail likelihood, and the MSE one-sided."""

    outputs = NUM_BINS

    def __init__(self, bins: LengthBins) -> None:
        self.bins = bins

    def rows(self, out, y, censored):
        log_p = nn.functional.log_softmax(out.float(), dim=-1)
        exact_ce = -(self.bins.soft_labels(y) * log_p).sum(-1)
        tail_ce = -tail_log_probability(log_p, self.bins.index(y))
        error = self.bins.expected_z(out) - y.float()
        squared = torch.where(censored, nn.functional.relu(-error), error) ** 2
        return CE_WEIGHT * torch.where(censored, tail_ce, exact_ce) + MSE_WEIGHT * squared

    def initialise(self, last, y, weights):
        mass = (weights[:, None] * self.bins.soft_labels(y)).sum(0) / weights.sum()
        last.bias.copy_(torch.log(mass.clamp_min(1e-4)))


class EgtpPredictor(Predictor):
    name = "egtp"
    description = ("EGTP: the target's states pooled by softmax(token entropy), 20-bin soft-label head "
                   "(0.95 CE + 0.05 MSE), expectation; progressive: re-pooled over the tokens generated so far")
    dynamic_source = DYNAMIC_MODEL

    def _cache(self) -> EntropyCache:
        if not self.context.target_path:
            raise OutletsError("the egtp baseline reads the target's LM head for token entropies: pass --target")
        return entropy_cache(self.context.target_path)

    def _pooled(self, path: str, features: Dict[str, torch.Tensor], depth: str) -> torch.Tensor:
        """[T, H]: row j pools positions 0..j by softmax(entropy)."""
        entropies = self._cache().entropies(path, features["hidden_state"][0])
        return running_pool(depth_states(features, depth), entropy_weights(entropies))

    def _rows(self, split: Split, depth: str) -> Tuple[torch.Tensor, torch.Tensor, Dict[str, torch.Tensor]]:
        rows = training_rows((self._pooled(path, features, depth), members) for path, features, members in tqdm(
            split.by_file(), total=len(split.files()), desc=f"egtp: pool ({depth})", unit="file",
            disable=not self.context.progress, leave=False))
        return rows.pop("x"), rows.pop("y"), rows

    def fit(self, train: Split) -> None:
        train = self.training_split(train)
        self.bins = LengthBins(self.context.max_new_tokens or DEFAULT_CAP)
        fit_best_depth(self, {depth: self._rows(train, depth) for depth in DEPTHS}, SoftBinLoss(self.bins), self.bins)

    @torch.no_grad()
    def predict(self, test: Split) -> List[Prediction]:
        out: List[Prediction] = [None] * len(test)  # type: ignore[list-item]
        for path, features, members in tqdm(test.by_file(), total=len(test.files()), desc="egtp: predict",
                                            unit="file", disable=not self.context.progress, leave=False):
            pooled = self._pooled(path, features, self.depth)
            for index, request in members:
                logits = self.model(pooled[request.prompt_end : request.prompt_end + request.length])
                remaining = self.bins.expected_tokens(logits).double().numpy()
                out[index] = Prediction(float(remaining[0]), remaining)
        return out
