"""The shared fitting recipe of the learned baselines (evaluation/heads.py), on small synthetic data."""

import pytest
import torch

from specforge_outlets.errors import OutletsError
from specforge_outlets.evaluation.heads import CrossEntropy, HeadSettings, SquaredError, _train, fit_head, validation_rows


def test_output_starts_at_the_mean_training_target():
    x = torch.randn(40, 3)
    y = torch.arange(40.0)
    weights = torch.ones(40)
    weights[:20] = 3.0  # the weighted mean: (3 * 190 + 590) / 80 = 14.5
    model, _ = _train(x, y, weights, torch.zeros(len(x), dtype=torch.bool), HeadSettings(hidden=(8,)), SquaredError(), 0,
                      epochs=0)
    assert torch.allclose(model(x).squeeze(-1), torch.full((40,), 14.5))
    # a constant target: the start is exact, no epoch beats it on validation, so 0 epochs are kept
    fitted = fit_head(x, torch.full((40,), 7.0), HeadSettings(hidden=(8,), max_epochs=5), seed=0)
    assert fitted.epochs == 0 and torch.allclose(fitted.model(x).squeeze(-1), torch.full((40,), 7.0))


def test_classifier_starts_at_the_class_frequencies():
    y = torch.tensor([0, 0, 0, 1])  # 3 classes, Laplace-smoothed: (4, 2, 1) / 7
    model, _ = _train(torch.randn(4, 2), y, torch.ones(4), torch.zeros(4, dtype=torch.bool), HeadSettings(outputs=3),
                      CrossEntropy(3), 0,
                      epochs=0)
    probabilities = torch.softmax(model(torch.randn(1, 2)), -1)[0]
    assert torch.allclose(probabilities, torch.tensor([4.0, 2.0, 1.0]) / 7)


def test_epochs_are_chosen_on_validation_and_the_fit_is_seeded():
    torch.manual_seed(1)
    x = torch.randn(200, 4)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 0.0]) + 5
    settings = HeadSettings(max_epochs=40, patience=5, lr=1e-2, batch_size=32)
    fitted = fit_head(x, y, settings, seed=3)
    assert 0 < fitted.epochs <= 40 and fitted.validation_requests == 40
    assert ((fitted.model(x).squeeze(-1) - y) ** 2).mean() < 0.1 * y.var()  # learnt, not the mean
    again = fit_head(x, y, settings, seed=3)
    assert again.epochs == fitted.epochs and torch.equal(again.model(x), fitted.model(x))


def test_validation_keeps_a_request_s_rows_together():
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 3, 4])
    held = validation_rows(groups, 0.4, seed=0)
    for group in groups.unique():
        assert held[groups == group].all() or not held[groups == group].any()
    assert groups[held].unique().numel() == 2  # 40% of 5 requests
    assert torch.equal(held, validation_rows(groups, 0.4, seed=0))
    with pytest.raises(OutletsError, match="at least 2"):
        validation_rows(torch.zeros(5, dtype=torch.long), 0.2, seed=0)


def test_censored_rows_only_push_predictions_up_to_their_bound():
    """Regression, three clusters: exact at 1; censored at 5 only; exact at 8 mixed with censored at 5.

    One-sided, the second is learned as at least 5 and the third stays at 8 (a bound of 5 does not
    pull an 8 down); as exact targets, the third would sit near 6.5; dropped, the second near 1-8.
    """
    torch.manual_seed(0)
    centres = torch.tensor([[3.0, 0], [-3, 0], [0, 3]])
    x = torch.cat([torch.randn(300, 2) * 0.3 + centre for centre in centres])
    y = torch.cat([torch.full((300,), 1.0), torch.full((300,), 5.0), torch.tensor([8.0, 5.0]).repeat(150)])
    censored = torch.cat([torch.zeros(300), torch.ones(300), torch.tensor([0.0, 1.0]).repeat(150)]).bool()
    settings = HeadSettings(hidden=(16,), max_epochs=80, lr=1e-2)
    one_sided, exact = fit_head(x, y, settings, seed=0, censored=censored), fit_head(x, y, settings, seed=0)
    with torch.no_grad():
        predicted, as_exact = (fitted.model(x).squeeze(-1) for fitted in (one_sided, exact))
    assert abs(predicted[:300].mean() - 1) < 0.3
    assert predicted[300:600].mean() > 4.7
    assert abs(predicted[600:].mean() - 8) < 0.4 and abs(as_exact[600:].mean() - 6.5) < 0.4


def test_censored_rows_enter_a_classifier_as_the_bounds_class_or_above():
    """A cluster of exact class-3 rows mixed with rows censored at class 2: one-sided, it is class 3."""
    torch.manual_seed(0)
    x = torch.cat([torch.randn(200, 2) * 0.3 + 3, torch.randn(200, 2) * 0.3 - 3])
    y = torch.cat([torch.zeros(200), torch.tensor([3.0, 2.0]).repeat(100)]).long()
    censored = torch.cat([torch.zeros(200), torch.tensor([0.0, 1.0]).repeat(100)]).bool()
    settings = HeadSettings(hidden=(8,), outputs=4, max_epochs=60, lr=1e-2)
    one_sided, exact = fit_head(x, y, settings, seed=0, censored=censored), fit_head(x, y, settings, seed=0)
    with torch.no_grad():
        probabilities, as_exact = (fitted.model(x).softmax(-1) for fitted in (one_sided, exact))
    assert probabilities[200:, 3].mean() > 0.85 and as_exact[200:, 3].mean() < 0.6
    assert probabilities[:200, 0].mean() > 0.9
