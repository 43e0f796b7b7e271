"""Does the length head learn on a draft's states at a given learning rate? A fresh head on frozen states.

The OUTLETS draft trained jointly on the CPU recipe (draft lr 1e-3, ``length_head_lr_scale`` 10, so
the head at 1e-2) had its head at chance after 250 steps (validation Spearman -0.05) while a ridge
probe on the same draft's states reached 0.50: the states hold the length, the head did not read it.
This isolates the head's optimisation from the drafting loss: the draft is frozen at a checkpoint,
its TTT-step-0 states are computed once for the fit and validation files, and a fresh head
(SpecForge's init, bias at the mean log length, as ``outlets train`` starts it) is trained with the
training objective (``training.objective.fit_length``: per-response weighting, the static
position once more, censored responses one-sided) by AdamW at each learning rate, two responses a
step. Reported per checkpoint of that training: validation Spearman of r̂₀ on finished responses,
the P10-P90 of r̂₀ in tokens, and the share of the first ReLU layer's units active on validation
states (a head whose units die predicts one length).

    .venv/bin/python benchmarks/head_learning_rate.py --run RUN --export outlets-step250     # ~10 min, one thread

``RUN`` is ``benchmarks/convergence.py``'s (its ``convergence/exports/<name>`` and ``features/{fit,val}``).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
from typing import Dict, List

import numpy as np
import torch
from tqdm import tqdm

from specforge_outlets.atomic import write_text_atomic
from specforge_outlets.data.labels import NO_LABEL, shift_left
from specforge_outlets.data.targets import resolve_target
from specforge_outlets.evaluation.metrics import spearman
from specforge_outlets.evaluation.outlets_predictor import load_draft
from specforge_outlets.model.inference import draft_states
from specforge_outlets.model.target_features import captured_input
from specforge_outlets.model.length_head import LengthHead
from specforge_outlets.studies.committed_data import LABEL_SET, REPO
from specforge_outlets.training.objective import LengthWeighting, fit_length
from specforge_outlets.training.settings import OutletsSettings

OUTPUT = os.path.join(LABEL_SET, "convergence", "head-learning-rate.json")
FIGURE = os.path.join(REPO, "docs", "figures", "head-learning-rate.png")
CHECKPOINTS = (50, 150, 300, 600)  # head training steps at which it is scored
BATCH = 2  # responses per step, as the recipe's 1 x 2 accumulation


class Response:
    """One file's step-0 states and its labels, aligned (the state at j predicts the label at j + 1)."""

    def __init__(self, states: torch.Tensor, features: Dict[str, torch.Tensor]) -> None:
        self.states = states  # [T, H] bf16
        self.labels = shift_left(features["remaining_length"][None], 1)[0]  # [T]
        self.bounds = shift_left(features["remaining_lower_bound"][None], 1)[0]  # [T]
        known = (self.labels != NO_LABEL).nonzero()
        self.static = int(known[0]) if len(known) else None  # r̂₀'s position, finished responses only


def load_responses(draft, directory: str, limit: int) -> List[Response]:
    responses = []
    for path in tqdm(sorted(glob.glob(os.path.join(directory, "*.ckpt")))[:limit], desc=os.path.basename(directory)):
        features = torch.load(path, weights_only=False)
        if not ((features["remaining_length"] != NO_LABEL) | (features["remaining_lower_bound"] != NO_LABEL)).any():
            continue
        with torch.no_grad():
            states = draft.normalized_state(draft_states(draft, features["input_ids"][None], captured_input(features, draft.outlets)))
        responses.append(Response(states[0].to(torch.bfloat16), features))
    return responses


def fresh_head(draft, mean_log_length: float) -> LengthHead:
    head = LengthHead(draft.outlets.head_widths, draft.outlets.bucket_edges).float()
    head.apply(draft._init_weights)
    head.init_output_bias(torch.tensor([mean_log_length]))
    return head


def score(head: LengthHead, validation: List[Response]) -> Dict[str, object]:
    finished = [r for r in validation if r.static is not None]
    with torch.no_grad():
        z = np.array([float(head.log_remaining(head(r.states[r.static].float()[None, None]))[0, 0]) for r in finished])
        first = torch.cat([head.mlp[1](head.mlp[0](r.states.float())) for r in validation[:50]])
    truth = np.array([float(r.labels[r.static]) for r in finished])
    return {"spearman": spearman(z, truth), "r0_p10_p90": np.expm1(np.percentile(z, [10, 90])).round(1).tolist(),
            "first_layer_active": float((first > 0).float().mean())}


def train_head(draft, fit: List[Response], validation: List[Response], lr: float, weighting: LengthWeighting,
               mean_log_length: float, seed: int) -> List[Dict[str, object]]:
    torch.manual_seed(seed)
    head = fresh_head(draft, mean_log_length)
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    order = torch.Generator().manual_seed(seed)
    points = []
    for step in range(1, CHECKPOINTS[-1] + 1):
        chosen = torch.randint(len(fit), (BATCH,), generator=order).tolist()
        raw = [head(fit[i].states.float())[None] for i in chosen]  # each [1, T, 1]
        losses = [fit_length(head, [r], [fit[i].labels[None]], None, weighting, lower_bounds=[fit[i].bounds[None]]).loss
                  for r, i in zip(raw, chosen)]
        (sum(losses) / BATCH).backward()
        optimizer.step()
        optimizer.zero_grad()
        if step in CHECKPOINTS:
            points.append({"step": step, **score(head, validation)})
    return points


def plot(result: Dict[str, object], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for lr, points in result["runs"].items():
        ax.plot([p["step"] for p in points], [p["spearman"] for p in points], marker="o", label=f"head lr {lr}")
    ax.axhline(result["trained_head"]["spearman"], color="grey", ls=":", label="the checkpoint's own head")
    ax.set_xlabel("head training steps (2 responses each), draft frozen")
    ax.set_ylabel("validation Spearman of r̂₀")
    ax.set_title(f"A fresh length head on {result['export']}'s states", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="benchmarks/convergence.py's --run")
    parser.add_argument("--export", default="outlets-step250", help="a checkpoint export under RUN/convergence/exports")
    parser.add_argument("--fit-files", type=int, default=500, help="fit responses the head trains on")
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-2, 3e-3, 1e-3, 1e-4])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--output", default=OUTPUT)
    parser.add_argument("--figure", default=FIGURE)
    args = parser.parse_args()
    torch.set_num_threads(1)
    base = os.path.join(args.run, "convergence")
    draft = load_draft(os.path.join(base, "exports", args.export), resolve_target(args.target))
    fit = load_responses(draft, os.path.join(base, "features", "fit"), args.fit_files)
    validation = load_responses(draft, os.path.join(base, "features", "val"), 10**9)
    mean_log_length = float(np.mean([np.log1p(float(r.labels[r.static])) for r in fit if r.static is not None]))
    weighting = LengthWeighting.from_settings(OutletsSettings())
    result = {"export": args.export, "fit_responses": len(fit), "validation_responses": len(validation),
              "trained_head": score(draft.length_head.float(), validation), "runs": {}}
    for lr in args.lrs:
        result["runs"][f"{lr:g}"] = train_head(draft, fit, validation, lr, weighting, mean_log_length, seed=0)
        print(f"lr {lr:g}: " + ", ".join(f"step {p['step']} {p['spearman']:.3f}" for p in result["runs"][f"{lr:g}"]))
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    write_text_atomic(args.output, json.dumps(result, indent=2))
    plot(result, args.figure)
    print(f"wrote {args.output} and {args.figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
