"""EGTP's and ESTP's pieces: the length bins, the entropy pools, position debiasing, their losses."""

import math

import pytest
import torch

from specforge_outlets.evaluation.baselines.egtp import SoftBinLoss
from specforge_outlets.evaluation.baselines.estp import CrpsSmoothL1Loss, debiased_importance
from specforge_outlets.evaluation.baselines.length_bins import LengthBins
from specforge_outlets.evaluation.baselines.pooled_states import entropy_weights, pool, running_pool

BINS = LengthBins(2048)


def test_bins_are_even_in_log_length_and_soft_labels_peak_at_the_true_bin():
    centres = BINS.centres()
    assert centres.shape == (20,) and torch.allclose(centres.diff(), torch.full((19,), BINS.width))
    z = torch.log1p(torch.tensor([1.0, 30.0, 300.0, 2048.0, 10**6]))
    assert BINS.index(z).tolist()[0] == 0 and BINS.index(z).tolist()[-2:] == [19, 19]  # past the cap: the last bin
    labels = BINS.soft_labels(z)
    assert torch.allclose(labels.sum(-1), torch.ones(5))
    assert labels[1:4].argmax(-1).tolist() == BINS.index(z[1:4]).tolist()
    point = torch.full((1, 20), -1e4)
    point[0, 7] = 0
    assert BINS.expected_z(point).item() == pytest.approx(centres[7].item())
    assert BINS.expected_tokens(point).item() == pytest.approx(math.expm1(centres[7].item()), rel=1e-5)


def test_running_pool_is_the_pool_of_each_prefix():
    torch.manual_seed(0)
    states, entropies = torch.randn(6, 3), torch.rand(6) * 5
    weights = entropy_weights(entropies)
    rows = running_pool(states, weights)
    for j in range(6):
        softmax = torch.softmax(entropies[: j + 1], 0)  # softmax(H) over the pooled positions
        assert torch.allclose(rows[j], (softmax[:, None] * states[: j + 1]).sum(0), atol=1e-6)
        assert torch.allclose(rows[j], pool(states[: j + 1], weights[: j + 1]), atol=1e-6)


def test_uniform_causal_attention_gives_every_token_the_same_importance():
    size = 7
    uniform = torch.tril(torch.ones(size, size)) / torch.arange(1, size + 1)[:, None]
    assert torch.allclose(debiased_importance(uniform[None].repeat(2, 1, 1)), torch.ones(size))
    focused = uniform.clone()
    focused[3:, :] = 0
    focused[3:, 2] = 1.0  # every later query looks at token 2 only
    importance = debiased_importance(focused[None])
    assert importance.argmax().item() == 2


@pytest.mark.parametrize("loss", [SoftBinLoss(BINS), CrpsSmoothL1Loss(BINS)])
def test_losses_reward_the_true_bin_and_charge_censored_rows_only_below_their_bound(loss):
    z = torch.log1p(torch.tensor([300.0]))
    right, low, high = (torch.full((1, 20), -20.0) for _ in range(3))
    right[0, BINS.index(z)] = 20
    low[0, 2] = 20
    high[0, 18] = 20
    exact, cut = torch.tensor([False]), torch.tensor([True])
    assert loss.rows(right, z, exact) < loss.rows(low, z, exact)
    assert loss.rows(right, z, exact) < loss.rows(high, z, exact)
    assert loss.rows(high, z, cut) < 0.05 < loss.rows(low, z, cut)  # above the bound may be right
