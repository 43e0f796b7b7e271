"""SpecForge's EAGLE-3 drafting loss computed only at the rows it reads.

SpecForge applies the draft's LM head, the SD loss and the acceptance metric at every position of
every TTT step, and the frozen target head (49k tokens for SmolLM2) at every position, although
only loss-mask rows (response tokens) reach a loss or a metric: on a CPU profile that was 42% of
a step. Here both heads run at those rows only:

- the teacher (:func:`teacher_at_loss_rows`, in place of SpecForge's compact teacher
  ``compute_target_p_padded_from_hidden``) runs SpecForge's own ``compute_target_from_hidden`` on
  the loss-mask rows and leaves the rest at SpecForge's padding values, which no loss reads (their
  position mask is 0);
- the draft's logits (:func:`drafting_loss_at_rows`) are taken at the step's loss-mask rows,
  and SpecForge's own ``_acc_and_loss`` runs on them, its loss rescaled from a mean over the rows
  to SpecForge's mean over all B x T positions.

Loss, gradients and metrics equal SpecForge's (tests/test_training_cuts.py, on a padded batch
with a censored response), so a SpecForge upgrade that changes the math fails a test.
"""

from __future__ import annotations

from typing import Callable, Tuple

import torch
from specforge.algorithms.eagle3 import model as eagle3_model
from specforge.core.compact_teacher import DEFAULT_VOCAB_CHUNK_SIZE, compute_target_from_hidden


@torch.no_grad()
def teacher_at_loss_rows(
    hidden: torch.Tensor,  # [B, T, H] target's last hidden states
    lm_head_weight: torch.Tensor,  # [V, H]
    t2d: torch.Tensor,  # [V] bool
    loss_mask: torch.Tensor,  # [B, T, 1]
    length: int,
    *,
    chunk_size: int = DEFAULT_VOCAB_CHUNK_SIZE,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``compute_target_p_padded_from_hidden`` with the target head applied to loss-mask rows only."""
    batch, seq_len = loss_mask.shape[:2]
    rows = loss_mask.reshape(batch, seq_len).bool()  # [B, T]
    target_p, on_draft, token_ids, _ = compute_target_from_hidden(
        hidden[rows].unsqueeze(0), lm_head_weight, t2d, torch.ones_like(loss_mask[rows]).unsqueeze(0),
        chunk_size=chunk_size)  # [1, N, V'], [1, N, V'], [1, N]
    draft_vocab = target_p.shape[-1]
    # SpecForge's padding values (uniform teacher, zero on-draft mass, token 0) everywhere but the rows
    target_p_padded = target_p.new_full((batch, seq_len + length, draft_vocab), 1 / draft_vocab)
    on_draft_padded = on_draft.new_zeros((batch, seq_len + length, draft_vocab))
    token_ids_padded = token_ids.new_zeros((batch, seq_len + length))
    target_p_padded[:, :seq_len][rows] = target_p[0]
    on_draft_padded[:, :seq_len][rows] = on_draft[0]
    token_ids_padded[:, :seq_len][rows] = token_ids[0]
    position_mask = t2d[token_ids_padded[:, :seq_len]][..., None].int() * loss_mask  # [B, T, 1]
    return target_p_padded, on_draft_padded, token_ids_padded, position_mask


def install_loss_row_teacher() -> None:
    """Point SpecForge's EAGLE-3 forward at :func:`teacher_at_loss_rows` (idempotent; compact teacher only)."""
    eagle3_model.compute_target_p_padded_from_hidden = teacher_at_loss_rows


class RowShareAdapter:
    """SpecForge's backend adapter with the loss, a mean over N rows, rescaled to a mean over all B x T."""

    def __init__(self, adapter, share: float) -> None:
        self.adapter = adapter
        self.share = share

    def reduce_metrics(self, **counts):
        return self.adapter.reduce_metrics(**counts)

    def reduce_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return self.adapter.reduce_loss(loss * self.share)


def drafting_loss_at_rows(
    acc_and_loss: Callable[..., tuple],
    logits_at: Callable[[torch.Tensor], torch.Tensor],
    *,
    states: torch.Tensor,  # [B, T, H] draft states of one TTT step
    target_p: torch.Tensor,  # [B, T, V']
    target_p_on_draft: torch.Tensor,  # [B, T, V']
    target_token_ids: torch.Tensor,  # [B, T]
    position_mask: torch.Tensor,  # [B, T, 1]
    loss_mask: torch.Tensor,  # [B, T, 1]
    adapter,
) -> tuple:
    """SpecForge's ``_acc_and_loss`` (``acc_and_loss``) on the step's loss-mask rows only.

    ``logits_at`` is the draft's LM head on [N, H] states. A step without a loss row (LP-only, or a
    batch cut to nothing) still runs one masked row, so distributed reductions stay collective.
    """
    batch, seq_len = loss_mask.shape[:2]
    rows = loss_mask.reshape(batch, seq_len).bool()  # [B, T]
    if not rows.any():
        rows = rows.clone()
        rows[0, 0] = True  # its loss and position masks are 0: it adds nothing
    count = int(rows.sum())
    acc, acceptance_rate, loss, correct, denom, _, _ = acc_and_loss(
        logits=logits_at(states[rows]).unsqueeze(0),  # [1, N, V']
        target_p=target_p[rows].unsqueeze(0),
        target_p_on_draft=target_p_on_draft[rows].unsqueeze(0),
        target_token_ids=target_token_ids[rows].unsqueeze(0),
        position_mask=position_mask[rows].unsqueeze(0),
        loss_mask=loss_mask[rows].unsqueeze(0),
        adapter=RowShareAdapter(adapter, count / (batch * seq_len)),
    )
    loss_denom = torch.tensor(batch * seq_len, device=states.device, dtype=torch.float32)
    return acc, acceptance_rate, loss, correct, denom, loss.detach(), loss_denom
