"""A tiny randomly initialised Llama target and synthetic OUTLETS features, built locally for tests."""

from __future__ import annotations

import json
import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specforge_outlets.data.features import save_features
from specforge_outlets.data.fusion_layers import default_fusion_layers
from specforge_outlets.data.labels import remaining_length_labels
from specforge_outlets.data.weight_index import write_weight_index

TINY_LAYERS = 6
TINY_HIDDEN = 32
TINY_VOCAB = 96
TINY_FUSION_LAYERS = default_fusion_layers(TINY_LAYERS)  # (2, 3, 4)
TINY_DRAFT_VOCAB = 64
DRAFT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                "max_position_embeddings", "rms_norm_eps", "hidden_act", "pad_token_id", "tie_word_embeddings")
LENGTH_BY_FIRST_TOKEN = {10: 3, 11: 8, 12: 20, 13: 45}  # learnable: the prompt says how long


def make_tiny_target(directory: str) -> str:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=TINY_VOCAB, hidden_size=TINY_HIDDEN, intermediate_size=64,
        num_hidden_layers=TINY_LAYERS, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, tie_word_embeddings=False, pad_token_id=0,
    )
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(directory, safe_serialization=True)
    write_weight_index(directory)
    write_draft_config(directory, os.path.join(directory, "draft_config.json"))
    return directory


def write_draft_config(target_dir: str, path: str) -> str:
    """A one-layer OUTLETS draft config shaped like the target saved in ``target_dir`` (its config.json)."""
    with open(os.path.join(target_dir, "config.json")) as f:
        config = json.load(f)
    draft = {key: config[key] for key in DRAFT_FIELDS}
    draft.update(architectures=["OutletsLlamaForCausalLMEagle3"], model_type="llama", num_hidden_layers=1,
                 draft_vocab_size=TINY_DRAFT_VOCAB)
    with open(path, "w") as f:
        json.dump(draft, f, indent=2)
    return path


@torch.no_grad()
def make_features(target_dir: str, out_dir: str, *, count: int, seed: int, censor_every: int = 0,
                  lengths=LENGTH_BY_FIRST_TOKEN) -> str:
    """Conversations [prompt | response]; every ``censor_every``-th response is cut by the limit.

    ``lengths`` maps a prompt's first token to its response length, or to an inclusive
    ``(low, high)`` range drawn from uniformly.
    """
    model = LlamaForCausalLM.from_pretrained(target_dir).eval()
    generator = torch.Generator().manual_seed(seed)
    first_tokens = list(lengths)
    for index in range(count):
        first = first_tokens[index % len(first_tokens)]
        prompt_len = int(torch.randint(3, 8, (1,), generator=generator))
        response_len = lengths[first]
        if isinstance(response_len, tuple):
            response_len = int(torch.randint(response_len[0], response_len[1] + 1, (1,), generator=generator))
        prompt = torch.cat([torch.tensor([first]), torch.randint(20, TINY_VOCAB, (prompt_len - 1,), generator=generator)])
        response = torch.randint(20, TINY_VOCAB, (response_len,), generator=generator)
        input_ids = torch.cat([prompt, response])
        loss_mask = torch.cat([torch.zeros(prompt_len), torch.ones(response_len)]).long()
        censored = bool(censor_every) and index % censor_every == censor_every - 1
        hidden = model(input_ids[None], output_hidden_states=True).hidden_states
        save_features(
            os.path.join(out_dir, f"conversation_{index:05d}.ckpt"),
            {
                "input_ids": input_ids,
                "loss_mask": loss_mask,
                "hidden_state": hidden[-1],
                "aux_hidden_state": torch.cat([hidden[k] for k in TINY_FUSION_LAYERS], dim=-1),
                "remaining_length": remaining_length_labels(loss_mask, [censored]),
            },
        )
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump({"fusion_layers": list(TINY_FUSION_LAYERS), "hidden_size": TINY_HIDDEN}, f)
    return out_dir


def write_recipe(path: str, target_dir: str, features_dir: str, output_dir: str, **sections) -> str:
    """A CPU recipe for the tiny target; ``sections`` update the YAML sections (dicts merge)."""
    import yaml

    recipe = {
        "model": {
            "target_model_path": target_dir,
            "draft_model_config": os.path.join(target_dir, "draft_config.json"),
            "torch_dtype": "float32",
        },
        "data": {"hidden_states_path": features_dir, "max_length": 128, "dataloader_num_workers": 0},
        "training": {
            "strategy": "eagle3-outlets", "attention_backend": "sdpa", "fsdp_sharding": "NO_SHARD",
            "batch_size": 4, "num_epochs": 4, "learning_rate": 0.02, "warmup_ratio": 0.0,
            "ttt_length": 3, "log_interval": 1, "seed": 0,
        },
        "tracking": {"report_to": "wandb", "wandb_offline": True, "wandb_project": "outlets-tests",
                     "wandb_dir": output_dir},
        "output_dir": output_dir,
        "run_id": "tiny",
        "outlets": {"length_loss_weight": 1.0},
    }
    for section, values in sections.items():
        if isinstance(values, dict):
            recipe.setdefault(section, {}).update(values)
        else:
            recipe[section] = values
    with open(path, "w") as f:
        yaml.safe_dump(recipe, f)
    return path
