"""``outlets fit-quantile-head``: a quantile head fitted on a trained draft's frozen states, written into a copy of its export.

Why after training rather than with it: the head then costs minutes instead of a training run, leaves
drafting and the point head exactly as trained (the copy's config says ``quantile_mode: detached``: the
draft never saw its gradient), and is fitted on the state the converged draft actually computes.
Censored responses enter one-sided (``model.quantile_head.pinball_rows``), so an upper quantile is
free to pass the generation cap where the state says the response runs long; only then can a
censored response count as covered.

The fit is the probes' recipe (``evaluation.heads.fit_head`` at the probes' training positions, epochs
chosen on held-out requests), so this head and the probes' quantile heads differ only in the state
they read. Its input standardisation is folded into the first layer, so the export keeps the draft's
own ``QuantileHead`` and SGLang's plugin serves it unchanged.

A head fitted to the pinball loss is not calibrated where a scheduler reads it (the served length, at
every decoding step): with ``--calibration-features`` the copy's config gets the split-conformal shifts
of ``evaluation/calibration.py``, estimated on responses the draft never trained on, which every reader
adds (``QuantileHead.served_quantiles``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Callable, Dict, Optional, Tuple

import torch

from specforge_outlets.errors import OutletsError

REFIT_FILE = "quantile_refit.json"  # what the head was fitted on, next to the copy's config.json


def register(subparsers) -> None:
    from specforge_outlets.evaluation.eval_command import parse_levels
    from specforge_outlets.scheduling.length_distribution import DEFAULT_QUANTILE_LEVELS

    parser = subparsers.add_parser(
        "fit-quantile-head",
        help="fit a quantile head on a trained draft's frozen states; write the export with it to a new directory",
    )
    parser.add_argument("--draft", required=True, help="an `outlets export` directory")
    parser.add_argument("--features", required=True, help="captured training features (`outlets capture`)")
    parser.add_argument("--target", required=True, help="the target model, a directory or a known name such as smollm2-135m (the draft reads its token embedding)")
    parser.add_argument("--output", required=True, help="new export directory: the draft's files plus the quantile head")
    parser.add_argument("--levels", type=parse_levels, default=DEFAULT_QUANTILE_LEVELS,
                        help=f"quantile levels (default {','.join(map(str, DEFAULT_QUANTILE_LEVELS))}, the scheduler's)")
    parser.add_argument("--censored-training", choices=("one_sided", "drop"), default="one_sided",
                        help="censored responses: fitted as lower bounds (default) or left out")
    parser.add_argument("--calibration-features",
                        help="captured features of responses the draft never trained on: the served quantiles get "
                             "the split-conformal shift that brings their served-length coverage to each level")
    parser.add_argument("--max-epochs", type=int, default=60, help="epochs at most (chosen on held-out requests)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(func=run)


def run(args) -> int:
    from specforge_outlets.data.targets import resolve_target
    from specforge_outlets.evaluation.outlets_predictor import load_draft
    from specforge_outlets.evaluation.requests import load_split
    from specforge_outlets.model.plain_draft import OutletsLengthPredictor

    if os.path.abspath(args.output) == os.path.abspath(args.draft):
        raise OutletsError(f"--output {args.output} is --draft: write the copy to a new directory")
    if os.path.exists(args.output) and not args.overwrite:
        raise OutletsError(f"--output {args.output} exists; pass --overwrite to replace it")
    split = load_split(args.features, name="features")
    if args.censored_training == "one_sided":
        split = split.with_censored()
    predictor = OutletsLengthPredictor(args.draft, load_draft(args.draft, resolve_target(args.target)).embed_tokens)
    rows = draft_state_rows(predictor, split, progress=not args.no_progress)
    head, info = fit_quantile_head(rows, predictor.outlets.head_widths, args.levels, args.max_epochs, args.seed)
    info.update(draft=os.path.basename(os.path.normpath(args.draft)),  # names, not paths: the copy may be committed
                features=os.path.basename(os.path.normpath(args.features)),
                censored_training=args.censored_training, requests=len(split),
                censored_requests=sum(request.censored for request in split.requests))
    calibration = None
    if args.calibration_features:
        calibration = load_split(args.calibration_features, name="calibration features").with_censored()
    write_export(args.draft, args.output, head, args.levels, info,
                 calibrate=None if calibration is None else lambda partial: conformal_shifts_of(
                     partial, predictor.embed_tokens, calibration, args.levels, progress=not args.no_progress))
    print(f"quantile head at levels {list(args.levels)}: {info['epochs']} epochs, validation pinball "
          f"{info['validation_loss']:.4f} on {info['validation_requests']} held-out requests"
          + (f"; served shifts {[round(s, 3) for s in info['conformal']['shifts']]} from "
             f"{info['conformal']['requests']} calibration requests" if calibration is not None else "")
          + f" -> {args.output}")
    return 0


def conformal_shifts_of(export: str, embed_tokens, calibration, levels, progress: bool) -> Dict:
    """The served-length split-conformal shifts of ``export``'s quantile head on the calibration split, one per
    level, pooled over the static prediction and 25/50/75% of decoding (the scheduler reads both)."""
    from specforge_outlets.evaluation import calibration as conformal
    from specforge_outlets.evaluation.outlets_predictor import served_predictions
    from specforge_outlets.model.plain_draft import OutletsLengthPredictor

    predictions = served_predictions(OutletsLengthPredictor(export, embed_tokens), calibration,
                                     desc="calibration", progress=progress)
    points = conformal.pooled(list(conformal.calibration_points(calibration.requests, predictions).values()))
    return {"shifts": conformal.conformal_shifts(points, levels), "requests": len(calibration),
            "censored_requests": sum(request.censored for request in calibration.requests),
            "points": int(len(points.remaining))}


@torch.no_grad()
def draft_state_rows(predictor, split, progress: bool = True) -> Dict[str, torch.Tensor]:
    """The quantile head's training rows (the probes' ``training_rows``) on the draft's normalised states.

    ``predictor`` is the export's served forward (``model.plain_draft.OutletsLengthPredictor``): the
    states the plugin's heads read.
    """
    from tqdm import tqdm

    from specforge_outlets.data.labels import shift_left
    from specforge_outlets.evaluation.baselines.probe import training_rows
    from specforge_outlets.model.target_features import captured_input

    def states_by_file():
        for _, features, members in tqdm(split.by_file(), total=len(split.files()), desc="draft states",
                                         unit="file", disable=not progress):
            next_ids = shift_left(features["input_ids"][None], 1)[0].clamp_min(0)  # token j + 1 at position j
            states = predictor.states(captured_input(features, predictor.outlets)[0], next_ids)
            yield predictor.normalized_state(states).float(), members

    return training_rows(states_by_file())


def fit_quantile_head(rows: Dict[str, torch.Tensor], widths, levels, max_epochs: int, seed: int):
    """A ``QuantileHead`` of the draft's widths fitted by the probes' recipe; returns it and the fit's info."""
    from specforge_outlets.evaluation.baselines.probe import SETTINGS
    from specforge_outlets.evaluation.heads import Pinball, fit_head
    from specforge_outlets.model.quantile_head import QuantileHead

    pinball = Pinball(levels)
    settings = dataclasses.replace(SETTINGS, hidden=tuple(widths[1:]), outputs=pinball.outputs, max_epochs=max_epochs)
    fitted = fit_head(rows["x"], rows["y"], settings, seed=seed, groups=rows["groups"],
                      sample_weight=rows["sample_weight"], censored=rows["censored"], loss=pinball)
    head = QuantileHead(widths, levels)
    head.mlp.load_state_dict(fitted.model.folded().state_dict())
    return head, {**fitted.info(), "levels": list(levels), "training_positions": int(len(rows["x"]))}


def write_export(source: str, output: str, head: torch.nn.Module, levels: Tuple[float, ...], info: Dict,
                 calibrate: Optional[Callable[[str], Dict]] = None) -> None:
    """``source``'s files with the quantile head's weights added (in the export's dtype) and its config naming them;
    ``calibrate`` (the written export's directory -> ``conformal_shifts_of``) adds the served shifts to the config.

    Written to a temporary directory first and moved into place, so an interrupted run leaves no half export.
    """
    from safetensors.torch import load_file, save_file

    from specforge_outlets.atomic import directory_replaced

    with directory_replaced(output) as partial:
        shutil.copytree(source, partial)
        weights_path = os.path.join(partial, "model.safetensors")
        weights = {name: tensor for name, tensor in load_file(weights_path).items()
                   if not name.startswith("quantile_head.")}
        dtype = weights["fc.weight"].dtype
        weights.update({f"quantile_head.{name}": tensor.to(dtype).contiguous()
                        for name, tensor in head.state_dict().items()})
        save_file(weights, weights_path, metadata={"format": "pt"})
        config_path = os.path.join(partial, "config.json")
        with open(config_path, encoding="utf-8") as handle:
            config = json.load(handle)
        config["outlets_config"].update(quantile_levels=list(levels), quantile_mode="detached", quantile_shifts=None)
        with open(config_path, "w", encoding="utf-8") as handle:
            json.dump(config, handle, indent=2)
        if calibrate is not None:  # it reads the export written so far, then its shifts join the config
            info["conformal"] = calibrate(partial)
            config["outlets_config"]["quantile_shifts"] = info["conformal"]["shifts"]
            with open(config_path, "w", encoding="utf-8") as handle:
                json.dump(config, handle, indent=2)
        with open(os.path.join(partial, REFIT_FILE), "w", encoding="utf-8") as handle:
            json.dump(info, handle, indent=2)
