"""MLP probes on the frozen target's own hidden states (the internal-state family: TRAIL, ARES).

Two depths, two predictors: ``probe-mid`` reads the middle layer, as TRAIL does (the middle of
the three fusion depths in ``aux_hidden_state``: layer N/2 with capture's default
``{2, N/2, N-2}``; ``info.layer`` names the depth the features hold), and ``probe-last`` the last
hidden state (``hidden_state``, after the final norm). Each is trained at response positions to
regress ``log(1 + remaining)`` (``heads.fit_head``); the state at the last prompt position gives
the static prediction and every response position a dynamic one. A probe sees the target only,
no draft: it is OUTLETS' head without the draft's gated layer and fused depths. With
``outlets eval --quantile-levels`` each probe also fits a quantile head of the same output form and
loss as OUTLETS' (``heads.Pinball``: non-crossing softplus steps, pinball, censored one-sided) on the
same rows; its network is the probes' own (standardised inputs, one hidden layer of 256, AdamW).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Iterable, List, Tuple

import numpy as np
import torch
from tqdm import tqdm

from specforge_outlets.evaluation.heads import HeadSettings, Pinball, fit_head
from specforge_outlets.evaluation.predictor_api import DYNAMIC_MODEL, Prediction, Predictor
from specforge_outlets.evaluation.requests import Request, Split

POSITIONS_PER_REQUEST = 64  # training positions per response: t = 0 and up to 63 evenly spaced others
SETTINGS = HeadSettings(hidden=(256,), max_epochs=60)  # 64 rows per request: fewer epochs than the prompt heads


def training_positions(length: int, limit: int = POSITIONS_PER_REQUEST) -> np.ndarray:
    """``t = 0`` and evenly spaced positions of a response, at most ``limit``."""
    if length <= limit:
        return np.arange(length)
    return np.unique(np.linspace(0, length - 1, limit).round().astype(np.int64))


def training_rows(states_by_file: Iterable[Tuple[torch.Tensor, List[Tuple[int, Request]]]]) -> Dict[str, torch.Tensor]:
    """The rows a head on per-position states fits, from ``(states [T, H], [(request index, request), ...])``
    per file: each response's states at its ``training_positions``, the target ``log(1 + L - t)`` (a lower
    bound where the response is censored), one weight per response spread over its rows, its index as group.

    Position ``prompt_end + t`` has read token ``t`` of the response and predicts the ``L - t`` still to
    come, the pairing of OUTLETS' own head. The probes and ``outlets fit-quantile-head`` both fit on these.
    """
    xs, ys, weights, groups, censored = [], [], [], [], []
    for states, members in states_by_file:
        for index, request in members:
            t = training_positions(request.length)
            xs.append(states[request.prompt_end + t])
            ys.append(torch.log1p(torch.as_tensor(request.length - t, dtype=torch.float32)))
            weights.append(torch.full((len(t),), 1.0 / len(t)))  # each response weighs the same
            groups.append(torch.full((len(t),), index))
            censored.append(torch.full((len(t),), request.censored))  # then L - t is a lower bound
    return {"x": torch.cat(xs), "y": torch.cat(ys), "sample_weight": torch.cat(weights), "groups": torch.cat(groups),
            "censored": torch.cat(censored)}


class ProbePredictor(Predictor):
    """A probe on the depth ``states`` picks; subclasses name the depth."""

    dynamic_source = DYNAMIC_MODEL

    def states(self, features: Dict[str, torch.Tensor]) -> torch.Tensor:  # [T, H]
        raise NotImplementedError

    def layer(self, split: Split) -> str:
        raise NotImplementedError

    def fit(self, train: Split) -> None:
        train = self.training_split(train)
        rows = training_rows((self.states(features).float(), members) for _, features, members in tqdm(
            train.by_file(), total=len(train.files()), desc=f"{self.name}: read train", unit="file",
            disable=not self.context.progress, leave=False))
        x, y = rows.pop("x"), rows.pop("y")
        fitted = fit_head(x, y, SETTINGS, seed=self.context.seed, **rows)
        self.model = fitted.model
        self.info.update(layer=self.layer(train), training_positions=len(x), **fitted.info())
        self.quantile_levels = self.context.options.get("quantile_levels")
        if self.quantile_levels:
            pinball = Pinball(self.quantile_levels)
            quantile = fit_head(x, y, dataclasses.replace(SETTINGS, outputs=pinball.outputs), loss=pinball,
                                seed=self.context.seed, **rows)
            self.quantile_model = quantile.model
            self.info["quantile_head"] = quantile.info()

    @torch.no_grad()
    def predict(self, test: Split) -> List[Prediction]:
        out: List[Prediction] = [None] * len(test)  # type: ignore[list-item]
        for _, features, members in tqdm(test.by_file(), total=len(test.files()), desc=f"{self.name}: predict",
                                         unit="file", disable=not self.context.progress, leave=False):
            hidden = self.states(features)
            for index, request in members:
                states = hidden[request.prompt_end : request.prompt_end + request.length]
                remaining = torch.expm1(self.model(states).squeeze(-1)).clamp_min(0).double().numpy()
                quantiles = None
                if self.quantile_levels:
                    quantiles = torch.expm1(Pinball.quantiles(self.quantile_model(states))).clamp_min(0).double().numpy()
                out[index] = Prediction(float(remaining[0]), remaining, quantiles)
        return out


class MidProbePredictor(ProbePredictor):
    name = "probe-mid"
    description = "MLP probe on the frozen target's middle layer (N/2, as TRAIL; internal-state family)"

    def states(self, features):
        hidden = features["hidden_state"].shape[-1]
        return features["aux_hidden_state"][0, :, hidden : 2 * hidden]  # the middle of the three fusion depths

    def layer(self, split: Split) -> str:
        fusion = split.manifest.get("fusion_layers")
        if not fusion:
            return "middle fusion depth (manifest.json names no fusion_layers)"
        return f"hidden_states[{fusion[1]}] of a {split.manifest.get('num_hidden_layers')}-layer target"


class LastProbePredictor(ProbePredictor):
    name = "probe-last"
    description = "MLP probe on the frozen target's last hidden state (internal-state family: TRAIL, ARES)"

    def states(self, features):
        return features["hidden_state"][0]

    def layer(self, split: Split) -> str:
        return f"hidden_states[{split.manifest.get('num_hidden_layers', -1)}] (last, after the final norm)"
