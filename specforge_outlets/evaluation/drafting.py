"""Drafting quality: SpecForge's EAGLE-3 acceptance metrics of a draft on the test features.

The same computation as a training step, without gradients: the offline sample is normalised the
way ``outlets train`` reads it, the frozen target head turns the stored last hidden state into
the teacher distribution, and SpecForge's ``OnlineEagle3Model`` unrolls ``ttt_length`` draft steps
and returns, per step, the top-1 accuracy (``acces``) and the acceptance rate. Files are run one
at a time (batch 1) and the per-step figures are averaged with the step's token counts as weights.
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch
from tqdm import tqdm

DEFAULT_TTT_LENGTH = 3  # the CPU recipes' training.ttt_length


def load_target_head(target_path: str):
    """SpecForge's frozen target head in float32, read from the target's safetensors.

    Sharded (``*.index.json``) and single-file checkpoints both work; a target with tied
    embeddings (no ``lm_head.weight``) uses its token embedding, as it does when generating.
    """
    import os

    from safetensors import safe_open
    from specforge.modeling.target.target_head import TargetHead

    from specforge_outlets.errors import OutletsError
    from specforge_outlets.data.weight_index import read_weight_map

    weight_map = read_weight_map(target_path)
    key = next((k for k in ("lm_head.weight", "model.embed_tokens.weight") if k in weight_map), None)
    if key is None:
        raise OutletsError(f"--target {target_path}: no lm_head.weight or model.embed_tokens.weight in its safetensors")
    head = TargetHead(target_path)
    with safe_open(os.path.join(target_path, weight_map[key]), framework="pt") as f:
        weight = f.get_tensor(key)
    if tuple(weight.shape) != tuple(head.fc.weight.shape):
        raise OutletsError(f"--target {target_path}: {key} has shape {tuple(weight.shape)}, expected {tuple(head.fc.weight.shape)}")
    with torch.no_grad():
        head.fc.weight.copy_(weight.float())
    head.freeze_weights()
    return head.float().eval()


@torch.no_grad()
def drafting_metrics(draft, target_head, files: List[str], *, ttt_length: int = DEFAULT_TTT_LENGTH,
                     max_length: int = 4096, progress: bool = True, desc: str = "drafting") -> Dict[str, Any]:
    from specforge.algorithms.eagle3.model import OnlineEagle3Model

    from specforge_outlets.data.features import load_features
    from specforge_outlets.model.target_features import draft_input
    from specforge_outlets.training.algorithm import normalize_offline_sample
    from specforge_outlets.training.cpu_loss import install_cpu_loss

    install_cpu_loss()
    model = OnlineEagle3Model(draft_model=draft, length=ttt_length, attention_backend="sdpa").eval()
    correct = torch.zeros(ttt_length, dtype=torch.float64)
    denom = torch.zeros(ttt_length, dtype=torch.float64)
    accept = torch.zeros(ttt_length, dtype=torch.float64)
    for path in tqdm(files, desc=desc, unit="file", disable=not progress, leave=False):
        sample = normalize_offline_sample(load_features(path), max_length, "float32")
        input_ids, target, loss_mask = target_head.preprocess(sample["input_ids"], sample["target"], sample["loss_mask"])
        target = target_head(target)
        _, rates, _, corrects, denoms, _, _ = model(
            input_ids=input_ids,
            attention_mask=sample["attention_mask"],
            loss_mask=loss_mask,
            target=target,
            hidden_states=draft_input(sample["hidden_state"], sample["target"], draft.outlets.target_features),
        )
        for step in range(ttt_length):
            d = float(denoms[step])
            correct[step] += float(corrects[step])
            denom[step] += d
            accept[step] += float(rates[step]) * d
    safe = denom.clamp_min(1)
    acc = (correct / safe).tolist()
    rates = (accept / safe).tolist()
    return {
        "ttt_length": ttt_length,
        "files": len(files),
        "positions": int(denom[0]),
        "top1_acc_per_step": acc,
        "acceptance_rate_per_step": rates,
        "mean_top1_acc": sum(acc) / ttt_length,
        "mean_acceptance_rate": sum(rates) / ttt_length,
    }


def compare(outlets: Dict[str, Any], sd_only: Dict[str, Any]) -> Dict[str, float]:
    """Relative change of OUTLETS' mean acceptance rate and top-1 accuracy against the SD-only draft."""
    def relative(key: str) -> float:
        base = sd_only[key]
        return (outlets[key] - base) / base if base else float("nan")

    return {
        "acceptance_rate_relative_change": relative("mean_acceptance_rate"),
        "top1_acc_relative_change": relative("mean_top1_acc"),
    }
