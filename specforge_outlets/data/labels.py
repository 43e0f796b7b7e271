"""Remaining-length labels: r_t = L - t for the t-th token of an L-token response.

Labels are derived from the loss-mask spans of the tokenised conversation (each maximal run of
assistant tokens is one response), not from the count reported at generation time: tokenising a
conversation through the chat template can merge or split tokens at the boundaries. A response
stopped by the token limit is right-censored: its true length is unknown, so it carries no label,
only a lower bound (``remaining_lower_bounds``: at least ``c - t`` tokens remain after ``t`` of
its ``c`` generated ones), which censoring-aware training uses as a one-sided target.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

NO_LABEL = -1  # positions without a length label: prompt, padding, censored responses


def response_spans(loss_mask: torch.Tensor) -> List[Tuple[int, int]]:
    """Maximal runs of 1 in a [T] loss mask, as half-open (start, end) intervals."""
    assert loss_mask.dim() == 1, f"expected a [T] loss mask, got {tuple(loss_mask.shape)}"
    mask = loss_mask.to(torch.int8)
    edges = torch.diff(mask, prepend=mask.new_zeros(1), append=mask.new_zeros(1))
    starts = torch.nonzero(edges == 1).flatten().tolist()
    ends = torch.nonzero(edges == -1).flatten().tolist()
    assert len(starts) == len(ends)
    return list(zip(starts, ends))


def remaining_length_labels(
    loss_mask: torch.Tensor, censored: Sequence[bool] | None = None
) -> torch.Tensor:
    """[T] int64 labels: L - t on the t-th token of each uncensored response, NO_LABEL elsewhere.

    ``censored[i]`` says whether the i-th response span (in order) was cut by the token limit.
    """
    return _countdowns(loss_mask, censored, want_censored=False)


def remaining_lower_bounds(loss_mask: torch.Tensor, censored: Sequence[bool]) -> torch.Tensor:
    """[T] int64: c - t on the t-th token of each censored response (c tokens generated), NO_LABEL elsewhere."""
    return _countdowns(loss_mask, censored, want_censored=True)


def _countdowns(loss_mask: torch.Tensor, censored: Sequence[bool] | None, want_censored: bool) -> torch.Tensor:
    spans = response_spans(loss_mask)
    censored = list(censored) if censored is not None else [False] * len(spans)
    if len(censored) != len(spans):
        raise ValueError(
            f"loss mask has {len(spans)} response spans but {len(censored)} censoring flags; "
            "pass one flag per assistant turn that survived tokenisation"
        )
    labels = torch.full(loss_mask.shape, NO_LABEL, dtype=torch.long)
    for (start, end), cut in zip(spans, censored):
        if cut == want_censored:
            labels[start:end] = torch.arange(end - start, 0, -1)  # L, L-1, ..., 1
    return labels


def shift_left(labels: torch.Tensor, steps: int) -> torch.Tensor:
    """Shift [B, T] labels ``steps`` positions to the left, filling the tail with NO_LABEL.

    This is SpecForge's target alignment: the draft state at position j (step k of
    training-time test) is trained to predict what follows token j + 1 + k.
    """
    assert steps >= 0
    if steps == 0:
        return labels
    tail = labels.new_full((*labels.shape[:-1], min(steps, labels.shape[-1])), NO_LABEL)
    return torch.cat((labels[..., steps:], tail), dim=-1)
