"""Remaining-length labels and their alignment with SpecForge's target shifts."""

import pytest
import torch

from specforge_outlets.data.labels import (NO_LABEL, remaining_length_labels, remaining_lower_bounds, response_spans,
                                          shift_left)


def test_labels_count_down_per_response_and_skip_prompts():
    #            prompt  | resp (3) | user | resp (2)
    loss_mask = torch.tensor([0, 0, 1, 1, 1, 0, 0, 1, 1])
    labels = remaining_length_labels(loss_mask)
    assert labels.tolist() == [-1, -1, 3, 2, 1, -1, -1, 2, 1]
    assert response_spans(loss_mask) == [(2, 5), (7, 9)]


def test_censored_responses_carry_no_label():
    loss_mask = torch.tensor([0, 1, 1, 0, 1, 1, 1])
    labels = remaining_length_labels(loss_mask, censored=[False, True])
    assert labels.tolist() == [-1, 2, 1, -1, -1, -1, -1]


def test_censored_responses_carry_a_lower_bound_and_nothing_else_does():
    mask = torch.tensor([0, 1, 1, 0, 1, 1, 1])
    bounds = remaining_lower_bounds(mask, [False, True])
    assert bounds.tolist() == [NO_LABEL, NO_LABEL, NO_LABEL, NO_LABEL, 3, 2, 1]  # at least c - t tokens remain
    labels = remaining_length_labels(mask, [False, True])
    assert ((labels == NO_LABEL) | (bounds == NO_LABEL)).all()  # a position has one or the other, never both


def test_censoring_flags_must_match_spans():
    with pytest.raises(ValueError, match="2 response spans but 1 censoring flags"):
        remaining_length_labels(torch.tensor([1, 0, 1]), censored=[False])


def test_shift_left_fills_with_no_label():
    labels = torch.tensor([[5, 4, 3, 2, 1]])
    assert shift_left(labels, 0).tolist() == [[5, 4, 3, 2, 1]]
    assert shift_left(labels, 2).tolist() == [[3, 2, 1, NO_LABEL, NO_LABEL]]
    assert shift_left(labels, 9).tolist() == [[NO_LABEL] * 5]
