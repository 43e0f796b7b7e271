"""The draft config SpecForge's own capture script takes, capturing OUTLETS' fusion layers.

SpecForge 0.2.0's ``scripts/prepare_hidden_states.py`` requires ``--draft-model-config`` and resolves
the layers it captures from that config's ``eagle_config.eagle_aux_hidden_state_layer_ids`` (else
its own default ``[1, N/2 - 1, N - 4]``, which is not OUTLETS' ``{2, N/2, N-2}``). It only knows
its stock EAGLE-3 architecture, so a recipe's draft config (``OutletsLlamaForCausalLMEagle3``) is
refused. This writes the recipe's draft config as a stock one whose capture layers are the fusion
layers ``outlets train`` will read (SpecForge's ids: hidden_states index - 1).
"""

from __future__ import annotations

import json
from typing import Sequence

from specforge_outlets.atomic import write_text_atomic
from specforge_outlets.data.fusion_layers import to_specforge_layer_ids
from specforge_outlets.errors import OutletsError

SPECFORGE_EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"


def write_specforge_draft_config(draft_config: str, fusion_layers: Sequence[int], output: str) -> str:
    """Write ``draft_config`` (a recipe's model.draft_model_config) for SpecForge's capture to ``output``."""
    try:
        with open(draft_config, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, json.JSONDecodeError) as exc:
        raise OutletsError(f"--specforge-draft-config {draft_config}: not a readable draft config JSON ({exc}); "
                           "give a recipe's model.draft_model_config, e.g. recipes/drafts/llama3.1-8b-outlets.json") from None
    config["architectures"] = [SPECFORGE_EAGLE3_ARCHITECTURE]
    config["eagle_config"] = {**(config.get("eagle_config") or {}),
                              "eagle_aux_hidden_state_layer_ids": to_specforge_layer_ids(fusion_layers)}
    config.pop("outlets_config", None)
    return write_text_atomic(output, json.dumps(config, indent=2) + "\n")
