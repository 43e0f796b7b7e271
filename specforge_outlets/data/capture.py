"""Teacher-forced feature capture with transformers: one SpecForge feature file per conversation.

The frozen target reads prompt and response in one forward pass; ``hidden_states[-1]`` (after the
final norm, what SGLang's capture calls the last hidden state) is the draft's distillation target
and the three fusion depths, concatenated low..high, are its input. Length labels come from the
loss-mask spans of exactly these tokens (see ``labels.py``).
"""

from __future__ import annotations

from typing import Any, Dict, Sequence

from specforge_outlets.data.chat_tokens import ChatTokens
from specforge_outlets.data.labels import remaining_length_labels, remaining_lower_bounds


class TargetCapture:
    def __init__(self, model: Any, fusion_layers: Sequence[int], dtype: Any) -> None:
        self.model = model.eval()
        self.fusion_layers = list(fusion_layers)
        self.dtype = dtype

    def features(self, tokens: ChatTokens) -> Dict[str, Any]:
        import torch

        input_ids = torch.tensor(tokens.input_ids, dtype=torch.long)
        loss_mask = torch.tensor(tokens.loss_mask, dtype=torch.long)
        device = next(self.model.parameters()).device
        with torch.no_grad():  # the decoder stack only: the vocabulary projection is not needed
            output = self.model.base_model(input_ids=input_ids[None].to(device), output_hidden_states=True)
        states = output.hidden_states
        return {
            "input_ids": input_ids,
            "loss_mask": loss_mask,
            "hidden_state": states[-1].to(self.dtype).cpu(),
            "aux_hidden_state": torch.cat([states[k] for k in self.fusion_layers], dim=-1).to(self.dtype).cpu(),
            "remaining_length": remaining_length_labels(loss_mask, tokens.censored),
            "remaining_lower_bound": remaining_lower_bounds(loss_mask, tokens.censored),
        }
