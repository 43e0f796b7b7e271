"""Run in the TRAINING environment (.venv, which has SpecForge): make an OUTLETS export for a target
and compute offline what the exported draft predicts: r̂_0 for given prompts, or the estimate at every
output token of given responses (the r̂_t of EAGLE-3 mode).

    python -m tests.sglang_harness.offline_reference export TARGET OUT_DIR [LEVELS]  (LEVELS "0.1,0.5,0.9": a quantile head)
    python -m tests.sglang_harness.offline_reference predict EXPORT TARGET CASES.json  -> JSON on stdout
    python -m tests.sglang_harness.offline_reference predict-quantiles EXPORT TARGET CASES.json  -> JSON on stdout
    python -m tests.sglang_harness.offline_reference trajectory EXPORT TARGET CASES.json  -> JSON on stdout

The export goes through `outlets export` (``export_draft``) from a training state of a randomly
initialised OUTLETS draft (seeded): the serving tests need a real export, not a trained one. The
offline prediction is ``specforge_outlets.model.inference.predict_log_remaining`` on features
captured from the Hugging Face target: the input is the prompt followed by the first sampled
token, and r̂_0 is read at the last prompt position (z = log(1 + r), tokens = expm1(z)).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Prompts (token ids of the tiny chat target) whose predictions the serving tests compare with this reference.
PROMPTS = [[5, 17, 40, 99, 123, 7, 8], [1, 200, 201, 202], [9, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41]]
TRAIN_PYTHON = os.environ.get("OUTLETS_TRAIN_PYTHON", os.path.join(REPO, ".venv", "bin", "python"))


def training_env() -> dict:
    """This process's environment without the serve environment's interpreter settings."""
    return {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}


def in_training_env(*args) -> str:
    """Called from the serve environment's tests: run this module in the training environment; its
    last stdout line. Skips the calling test when the training environment is not built."""
    import pytest

    if not os.path.exists(TRAIN_PYTHON):
        pytest.skip(f"the training environment ({TRAIN_PYTHON}) is needed for the offline reference (make install)")
    result = subprocess.run([TRAIN_PYTHON, "-m", "tests.sglang_harness.offline_reference", *args], cwd=REPO,
                            env=training_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def offline_r0(export: str, target: str, served: list, directory: str) -> list:
    """The export's offline r̂_0 for each served ``(prompt_ids, first_token, ...)``, from the training environment."""
    cases = os.path.join(directory, "cases.json")
    with open(cases, "w") as handle:
        json.dump([{"prompt_ids": prompt, "first_token": first} for prompt, first, *_ in served], handle)
    return json.loads(in_training_env("predict", export, target, cases))


def offline_quantiles(export: str, target: str, served: list, directory: str) -> list:
    """The export's offline total-length quantiles at prefill for each served ``(prompt_ids, first_token, ...)``."""
    cases = os.path.join(directory, "quantile-cases.json")
    with open(cases, "w") as handle:
        json.dump([{"prompt_ids": prompt, "first_token": first} for prompt, first, *_ in served], handle)
    return json.loads(in_training_env("predict-quantiles", export, target, cases))


def make_export(target: str, out: str, quantile_levels=None) -> str:
    import torch
    from transformers import AutoConfig, LlamaConfig

    from specforge_outlets.model.draft import DRAFT_ARCHITECTURE, OutletsLlamaForCausalLMEagle3
    from specforge_outlets.data.fusion_layers import default_fusion_layers, to_specforge_layer_ids
    from specforge_outlets.training.algorithm import ALGORITHM_NAME
    from specforge_outlets.training.export_command import export_draft

    target_config = AutoConfig.from_pretrained(target)
    hidden = target_config.hidden_size
    fusion = list(default_fusion_layers(target_config.num_hidden_layers))
    draft = LlamaConfig(
        vocab_size=target_config.vocab_size, hidden_size=hidden, intermediate_size=target_config.intermediate_size,
        num_attention_heads=target_config.num_attention_heads, num_key_value_heads=target_config.num_key_value_heads,
        max_position_embeddings=target_config.max_position_embeddings, rms_norm_eps=target_config.rms_norm_eps,
        hidden_act="silu", pad_token_id=0, tie_word_embeddings=False, num_hidden_layers=1,
        draft_vocab_size=target_config.vocab_size,
    )
    draft.architectures = [DRAFT_ARCHITECTURE]
    draft.outlets_config = {"fusion_layers": fusion, "gated_attention": True, "head_input": "draft",
                            "head_widths": [hidden, hidden // 2, hidden // 4], "bucket_edges": None}
    if quantile_levels:  # a quantile head (issue 27) at these levels
        draft.outlets_config["quantile_levels"] = [float(level) for level in quantile_levels]
    draft.eagle_config = {"eagle_aux_hidden_state_layer_ids": to_specforge_layer_ids(fusion)}
    torch.manual_seed(1234)
    model = OutletsLlamaForCausalLMEagle3(draft).float()
    with torch.no_grad():  # a head whose output varies visibly with the input
        for module in model.length_head.mlp:
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(0.0, 0.5)
                module.bias.fill_(0.3)
        if model.quantile_head is not None:  # quantiles that vary with the input, the lowest around e^3
            for module in model.quantile_head.mlp:
                if isinstance(module, torch.nn.Linear):
                    module.weight.normal_(0.0, 0.5)
                    module.bias.fill_(0.3)
            model.quantile_head.mlp[-1].bias[0] = 3.0
    run = os.path.join(out + ".run")
    step = os.path.join(run, "step1")
    os.makedirs(step, exist_ok=True)
    draft.to_json_file(os.path.join(run, "draft_config.json"))
    torch.save({"strategy": ALGORITHM_NAME, "draft_state_dict": model.state_dict(), "global_step": 1, "epoch": 0},
               os.path.join(step, "training_state.pt"))
    return export_draft(os.path.join(step, "training_state.pt"), out, os.path.join(run, "draft_config.json"))


def trajectories(export: str, target: str, cases: list) -> list:
    """Per case, the draft's estimate at each output token: entry k is read by the state that sees
    output token k + 1 (entry 0 is r̂_0: the last prompt position, which reads the first token)."""
    import torch
    from transformers import AutoModelForCausalLM

    from specforge_outlets.model.draft import OutletsLlamaForCausalLMEagle3
    from specforge_outlets.model.inference import predict_log_remaining
    from specforge_outlets.model.length_head import log_remaining_to_tokens

    draft = OutletsLlamaForCausalLMEagle3.from_export(export, target_model_path=target)
    fusion = draft.outlets.fusion_layers
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    results = []
    for case in cases:
        prompt, output = list(case["prompt_ids"]), [int(token) for token in case["output_ids"]]
        ids = torch.tensor([prompt + output])
        with torch.no_grad():
            hidden = model(ids[:, :-1], output_hidden_states=True).hidden_states
        aux = torch.cat([hidden[k] for k in fusion], dim=-1)  # [1, n, 3H]
        # position j reads token j + 1, so the reference gets every id and the features of all but
        # the last position (the last id only feeds position n - 1).
        z = predict_log_remaining(draft, ids, torch.cat([aux, aux[:, -1:]], dim=1))[0, len(prompt) - 1:-1]
        results.append([float(value) for value in log_remaining_to_tokens(z)])
    return results


def predict_quantiles(export: str, target: str, cases: list) -> list:
    """The total-length quantiles at prefill per case (tokens): the quantile head at the last prompt position,
    which reads the first sampled token, as r̂_0."""
    import torch
    from transformers import AutoModelForCausalLM

    from specforge_outlets.model.draft import OutletsLlamaForCausalLMEagle3
    from specforge_outlets.model.inference import draft_states

    draft = OutletsLlamaForCausalLMEagle3.from_export(export, target_model_path=target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    results = []
    for case in cases:
        prompt = list(case["prompt_ids"])
        ids = torch.tensor([prompt + [int(case["first_token"])]])
        with torch.no_grad():
            hidden = model(ids[:, :-1], output_hidden_states=True).hidden_states
            aux = torch.cat([hidden[k] for k in draft.outlets.fusion_layers], dim=-1)
            states = draft_states(draft, ids, torch.cat([aux, aux[:, -1:]], dim=1))
            z = draft.predict_log_remaining_quantiles(states)[0, len(prompt) - 1]
        results.append([float(value) for value in torch.expm1(z.float()).clamp_min(0.0)])
    return results


def predict(export: str, target: str, cases: list) -> list:
    """r̂_0 per case: the prompt followed by its first sampled token."""
    cases = [{"prompt_ids": case["prompt_ids"], "output_ids": [case["first_token"]]} for case in cases]
    return [trajectory[0] for trajectory in trajectories(export, target, cases)]


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "export":
        levels = [float(level) for level in sys.argv[4].split(",")] if len(sys.argv) > 4 else None
        print(make_export(sys.argv[2], sys.argv[3], levels))
    elif command == "predict":
        with open(sys.argv[4]) as handle:
            cases = json.load(handle)
        print(json.dumps(predict(sys.argv[2], sys.argv[3], cases)))
    elif command == "predict-quantiles":
        with open(sys.argv[4]) as handle:
            cases = json.load(handle)
        print(json.dumps(predict_quantiles(sys.argv[2], sys.argv[3], cases)))
    elif command == "trajectory":
        with open(sys.argv[4]) as handle:
            cases = json.load(handle)
        print(json.dumps(trajectories(sys.argv[2], sys.argv[3], cases)))
    else:
        raise SystemExit(f"unknown command {command}")
