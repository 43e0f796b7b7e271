"""EAGLE-3 training-time test with the length head read off the draft state at every step.

SpecForge's ``OnlineEagle3Model.forward`` runs the TTT unroll and returns only its drafting
losses and metrics. The draft state of each step is the output of the draft decoder layer
(``midlayer``), so a forward hook collects it while the unchanged EAGLE-3 forward runs. The head
and its L2 term are computed here, inside the module that FSDP wraps, so sharded parameters are
gathered when they are read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch
from specforge.algorithms.eagle3.model import OnlineEagle3Model

from specforge_outlets.data.labels import NO_LABEL, shift_left
from specforge_outlets.model.draft_config import HeadInput, TargetFeatures
from specforge_outlets.model.target_features import draft_input
from specforge_outlets.training.loss_rows import drafting_loss_at_rows
from specforge_outlets.training.objective import l2_penalty


@dataclass(frozen=True)
class LengthOutputs:
    raw: List[torch.Tensor]  # per TTT step: [B, T, out]
    labels: List[torch.Tensor]  # per TTT step: [B, T], aligned with ``raw``
    lower_bounds: List[torch.Tensor]  # per TTT step: [B, T], censored positions' bounds, aligned the same way
    l2: torch.Tensor  # ||theta_len||^2, over the quantile head too when there is one
    quantile_raw: Optional[List[torch.Tensor]] = None  # per TTT step: [B, T, K], with a quantile head


class OutletsEagle3Model(OnlineEagle3Model):
    def forward(self, *, remaining_length: torch.Tensor, remaining_lower_bound: Optional[torch.Tensor] = None,
                drafting: bool = True, last_hidden_state: Optional[torch.Tensor] = None, **eagle3_inputs):
        """SpecForge's seven EAGLE-3 outputs, then :class:`LengthOutputs`.

        ``drafting=False`` (LP-only: the drafting loss weighs 0) gives the drafting loss no row to
        read, so neither the teacher nor the draft's LM head runs; its outputs are then zeros.

        ``remaining_length`` and ``remaining_lower_bound`` [B, T] are aligned with the stored
        ``input_ids``; the state at
        position j of TTT step k has seen token j + 1 + k, so its label is shifted by 1 + k
        (SpecForge's one-position target shift plus one per step). ``last_hidden_state`` [B, T, H], the
        target's last layer at the same positions, is what a ``target_features: last_layer`` draft reads.
        """
        draft = self.draft_model
        if draft.outlets.target_features is not TargetFeatures.FUSED:
            assert last_hidden_state is not None, "a last_layer draft needs the batch's last hidden state"
            hidden = eagle3_inputs["hidden_states"]
            eagle3_inputs["hidden_states"] = draft_input(hidden, last_hidden_state.to(hidden.device),
                                                         draft.outlets.target_features)
        source = draft.midlayer if draft.outlets.head_input is HeadInput.DRAFT else draft.fc
        states: List[torch.Tensor] = []
        handle = source.register_forward_hook(lambda _module, _inputs, output: states.append(output))
        if not drafting:
            eagle3_inputs["loss_mask"] = torch.zeros_like(eagle3_inputs["loss_mask"])
        draft.defer_logits = True
        try:
            eagle3_outputs = super().forward(**eagle3_inputs)
        finally:
            handle.remove()
            draft.defer_logits = False
        expected = self.length if draft.outlets.head_input is HeadInput.DRAFT else 1
        assert len(states) == expected, f"collected {len(states)} draft states, expected {expected}"
        raw = [draft.length_outputs(state) for state in states]
        quantile_raw = [draft.quantile_outputs(state) for state in states] if draft.quantile_head is not None else None
        l2 = l2_penalty(draft.length_head) + (l2_penalty(draft.quantile_head) if quantile_raw is not None else 0.0)
        if remaining_lower_bound is None:  # a batch without censored responses
            remaining_lower_bound = torch.full_like(remaining_length, NO_LABEL)
        labels, bounds = ([shift_left(values.to(states[0].device), 1 + step) for step in range(len(states))]
                          for values in (remaining_length, remaining_lower_bound))
        return (*eagle3_outputs, LengthOutputs(raw, labels, bounds, l2, quantile_raw))

    def _acc_and_loss(self, *, logits: torch.Tensor, **step) -> tuple:
        """SpecForge's metric and loss at the step's loss-mask rows; ``logits`` are the deferred states [B, T, H]."""
        return drafting_loss_at_rows(super()._acc_and_loss, self.draft_model.logits_at, states=logits, **step)
