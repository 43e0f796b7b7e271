"""OUTLETS as a predictor: the exported draft's length head over the test features.

One draft step over each whole sequence (``model.plain_draft``, the forward predictor-only serving
runs): the state at position ``j`` predicts
the remaining length after token ``j + 1``, so the state at the last prompt position gives
``r_hat_0`` and the response positions give ``r_hat_t``. Nothing is fitted on the train split:
the draft was trained by ``outlets train``. The LP-only ablation (``--lp-only-draft``: the same
draft trained with ``outlets.sd_loss_weight=0``, length prediction only) is this predictor under
another name.
"""

from __future__ import annotations

import json
import os
from typing import List

import torch
from tqdm import tqdm

from specforge_outlets.data.manifest import manifest_path
from specforge_outlets.errors import OutletsError
from specforge_outlets.evaluation.predictor_api import DYNAMIC_MODEL, Prediction, Predictor
from specforge_outlets.evaluation.requests import Split


def load_draft(directory: str, target_path: str | None, option: str = "--draft"):
    """An ``outlets export`` directory as a float32 draft; errors name the option and directory."""
    from specforge_outlets.model.draft import OutletsLlamaForCausalLMEagle3

    if not os.path.isfile(os.path.join(directory, "config.json")):
        raise OutletsError(f"{option} {directory}: no config.json; pass an `outlets export` directory")
    try:
        return OutletsLlamaForCausalLMEagle3.from_export(directory, target_model_path=target_path)
    except OutletsError as exc:
        raise OutletsError(f"{os.path.join(directory, 'config.json')}: {exc}") from exc


def draft_target_hidden_size(draft) -> int:
    """The target hidden size the draft's fusion layer reads (its input is three target depths)."""
    return int(draft.fc.in_features) // 3


def check_features_match_draft(draft, directory: str, split: Split) -> None:
    _check_target_hidden_size(draft_target_hidden_size(draft), directory, split)


def _check_target_hidden_size(expected: int, directory: str, split: Split) -> None:
    if split.hidden_size != expected:
        raise OutletsError(
            f"{split.requests[0].file}: hidden size {split.hidden_size} does not match the draft {directory}, "
            f"whose fusion layer reads 3 x {expected} target features; these features were captured from "
            "another target model"
        )


def check_export_matches_features(directory: str, option: str, split: Split) -> None:
    """Refuse an export whose config.json does not fit itself or the features, before loading it: the draft
    would otherwise fail on an assertion, or score features captured at other depths as if they were its own."""
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        return  # load_draft names it
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, json.JSONDecodeError) as exc:
        raise OutletsError(f"{path}: not readable JSON ({exc}); export the checkpoint again with `outlets export`") from None
    outlets = config.get("outlets_config") or {}  # none: load_draft names the missing length head
    hidden, widths = config.get("hidden_size"), outlets.get("head_widths")
    if hidden and widths and widths[0] != hidden:
        raise OutletsError(f"{path}: outlets_config.head_widths {widths} must start at hidden_size {hidden} (the "
                           "length head reads the draft state); export the checkpoint again with `outlets export`")
    _check_target_hidden_size(int(config.get("target_hidden_size") or hidden or split.hidden_size), directory, split)
    captured, fused = split.manifest.get("fusion_layers"), outlets.get("fusion_layers")
    if captured and fused and list(captured) != list(fused) and outlets.get("target_features") != "last_layer":
        raise OutletsError(
            f"{option} {directory}: the draft fuses target layers {list(fused)} but {manifest_path(split.directory)} "
            f"says these features were captured at {list(captured)}; capture them again with --fusion-layers "
            f"{','.join(map(str, fused))}, or pass the draft trained on features captured at {list(captured)}"
        )


LP_ONLY = ("lp-only", "OUTLETS' draft and head trained without the drafting loss (sd_loss_weight 0): length prediction only")


class OutletsPredictor(Predictor):
    name = "outlets"
    description = "OUTLETS: the EAGLE-3 draft's length head (draft state after the gated draft layer)"
    dynamic_source = DYNAMIC_MODEL

    def __init__(self, context, draft=None, draft_dir: str = "", name: str = name, description: str = description) -> None:
        super().__init__(context)
        self.draft, self.draft_dir = draft, draft_dir
        self.name, self.description = name, description

    def fit(self, train: Split) -> None:
        pass

    @torch.no_grad()
    def predict(self, test: Split) -> List[Prediction]:
        from specforge_outlets.model.plain_draft import OutletsLengthPredictor

        check_features_match_draft(self.draft, self.draft_dir, test)
        # The forward predictor-only serving runs (on the export, with the target's embedding), so that
        # these predictions are the served ones; it equals SpecForge's draft step (tests/test_sglang_predictor.py).
        served = OutletsLengthPredictor(self.draft_dir, self.draft.embed_tokens)
        if served.quantile_head is not None:
            self.quantile_levels = served.quantile_head.levels
        return served_predictions(served, test, desc=f"{self.name}: predict", progress=self.context.progress)


@torch.no_grad()
def served_predictions(served, split: Split, *, desc: str, progress: bool) -> List[Prediction]:
    """Every request's served r̂₀, trajectory and (with a quantile head) quantiles from an export's forward
    (``model.plain_draft.OutletsLengthPredictor``)."""
    from specforge_outlets.data.labels import shift_left
    from specforge_outlets.model.length_head import log_remaining_to_tokens
    from specforge_outlets.model.target_features import captured_input

    out: List[Prediction] = [None] * len(split)  # type: ignore[list-item]
    for _, features, members in tqdm(split.by_file(), total=len(split.files()), desc=desc, unit="file",
                                     disable=not progress, leave=False):
        next_ids = shift_left(features["input_ids"][None], 1)[0].clamp_min(0)  # token j + 1 at position j
        states = served.states(captured_input(features, served.outlets)[0], next_ids)
        remaining = log_remaining_to_tokens(served.log_remaining(states)).double()
        quantiles = (None if served.quantile_head is None
                     else log_remaining_to_tokens(served.log_remaining_quantiles(states)).double())  # [T, K]
        for index, request in members:
            response = slice(request.prompt_end, request.prompt_end + request.length)
            dynamic = remaining[response].numpy()
            out[index] = Prediction(float(dynamic[0]), dynamic, None if quantiles is None else quantiles[response].numpy())
    return out
