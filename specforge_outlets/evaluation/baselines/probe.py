"""MLP probe on the frozen target's own last hidden state (the internal-state family: TRAIL, ARES).

Trained on ``hidden_state`` (the target's last layer, stored in every feature file) at response
positions to regress ``log(1 + remaining)``; the state at the last prompt position gives the
static prediction and every response position a dynamic one. The probe sees the target only, no
draft: it is OUTLETS' head without the draft's gated layer and fused depths.
"""

from __future__ import annotations

from typing import List

import numpy as np
import torch
from tqdm import tqdm

from specforge_outlets.evaluation.heads import train_head
from specforge_outlets.evaluation.predictor import DYNAMIC_MODEL, Prediction, Predictor
from specforge_outlets.evaluation.requests import Split

POSITIONS_PER_REQUEST = 64  # training positions per response: t = 0 and up to 63 evenly spaced others
HIDDEN = (256,)
EPOCHS = 60


def training_positions(length: int, limit: int = POSITIONS_PER_REQUEST) -> np.ndarray:
    """``t = 0`` and evenly spaced positions of a response, at most ``limit``."""
    if length <= limit:
        return np.arange(length)
    return np.unique(np.linspace(0, length - 1, limit).round().astype(np.int64))


class ProbePredictor(Predictor):
    name = "probe"
    description = "MLP probe on the frozen target's last hidden state (internal-state family: TRAIL, ARES)"
    dynamic_source = DYNAMIC_MODEL

    def fit(self, train: Split) -> None:
        xs, ys, ws = [], [], []
        for _, features, members in tqdm(train.by_file(), total=len(train.files()), desc="probe: read train",
                                         unit="file", disable=not self.context.progress, leave=False):
            hidden = features["hidden_state"][0].float()
            for _, request in members:
                t = training_positions(request.length)
                xs.append(hidden[request.prompt_end + t])
                ys.append(torch.log1p(torch.as_tensor(request.length - t, dtype=torch.float32)))
                ws.append(torch.full((len(t),), 1.0 / len(t)))  # each response weighs the same
        x, y, w = torch.cat(xs), torch.cat(ys), torch.cat(ws)
        self.model = train_head(x, y, hidden=HIDDEN, epochs=EPOCHS, lr=1e-3, weight_decay=1e-2,
                                seed=self.context.seed, sample_weight=w)
        self.info["training_positions"] = len(x)

    @torch.no_grad()
    def predict(self, test: Split) -> List[Prediction]:
        out: List[Prediction] = [None] * len(test)  # type: ignore[list-item]
        for _, features, members in tqdm(test.by_file(), total=len(test.files()), desc="probe: predict",
                                         unit="file", disable=not self.context.progress, leave=False):
            hidden = features["hidden_state"][0]
            for index, request in members:
                states = hidden[request.prompt_end : request.prompt_end + request.length]
                remaining = torch.expm1(self.model(states).squeeze(-1)).clamp_min(0).double().numpy()
                out[index] = Prediction(float(remaining[0]), remaining)
        return out
