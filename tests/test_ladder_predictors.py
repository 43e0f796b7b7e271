"""The predictor ladder's reference rungs (simulation/predicted_lengths.py): a constant, shuffled values, the per-prompt ceiling."""

import numpy as np
import pytest

from specforge_outlets.errors import OutletsError
from specforge_outlets.evaluation.censoring import CensoredRequests, c_index
from specforge_outlets.simulation.predicted_lengths import (constant_predictions, mean_rescaled_predictions, per_prompt_ceiling,
                                                           shuffled_predictions)


def test_a_constant_ranks_nothing():
    lengths = CensoredRequests.of([10, 50, 300, 2048], [False, False, False, True])
    assert constant_predictions(216, 4) == [216.0] * 4
    assert c_index(lengths, constant_predictions(216, 4)) == 0.5
    with pytest.raises(OutletsError, match="positive number of tokens"):
        constant_predictions(0, 3)


def test_shuffling_keeps_the_values_and_loses_the_ranking():
    rng = np.random.default_rng(0)
    truth = rng.lognormal(5, 1, 2000)
    predicted = truth * rng.lognormal(0, 0.3, 2000)
    shuffled = shuffled_predictions(predicted, seed=3)
    assert sorted(shuffled) == sorted(predicted.tolist()) and shuffled != predicted.tolist()
    assert shuffled == shuffled_predictions(predicted, seed=3)  # seeded
    requests = CensoredRequests.of(truth, np.zeros(2000, bool))
    assert c_index(requests, predicted) > 0.85 and abs(c_index(requests, shuffled) - 0.5) < 0.03


def test_the_ceiling_predicts_each_sample_by_its_prompt_s_other_samples():
    assert per_prompt_ceiling([[100, 200, 300, 400], [10, 30]]) == [[300, 800 / 3, 700 / 3, 200], [30, 10]]
    with pytest.raises(OutletsError, match="two or more samples"):
        per_prompt_ceiling([[5]])


def test_the_ceiling_ranks_as_well_as_the_prompt_allows():
    """Prompts with a spread of mean lengths, draws around each: the ceiling ranks above chance, below the oracle."""
    rng = np.random.default_rng(1)
    means = rng.lognormal(5, 1, 300)
    samples = [rng.lognormal(np.log(mean), 0.6, 4) for mean in means]
    ceiling = np.concatenate(per_prompt_ceiling(samples))
    truth = np.concatenate(samples)
    requests = CensoredRequests.of(truth, np.zeros(truth.size, bool))
    assert 0.7 < c_index(requests, ceiling) < c_index(requests, truth) == 1.0


def test_mean_rescaled_keeps_the_order_at_the_true_mean():
    rescaled = mean_rescaled_predictions([100, 200, 300], [200, 400, 1200])  # mean 200 -> 600: x3
    assert rescaled == pytest.approx([300, 600, 900])
    assert mean_rescaled_predictions([5, 7], [5, 7]) == pytest.approx([5, 7])  # the oracle is its own scale
