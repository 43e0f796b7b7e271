"""The learning curve: one point per report and predictor, in training-set order, one test split only."""

import pytest

from specforge_outlets.errors import OutletsError
from specforge_outlets.evaluation.learning_curve import curve_points, plot_curve


def report(n_train, maes, features="/runs/features/test"):
    return {"features": features, "n_train_requests": n_train, "predictors": {
        name: {"static_mae": mae, "static_mae_ci": [mae - 5, mae + 5], "spearman": 0.4} for name, mae in maes.items()}}


def test_points_follow_training_size_and_skip_missing_predictors(tmp_path):
    reports = [report(1000, {"outlets": 120.0, "probe-mid": 130.0, "constant": 180.0}),
               report(250, {"probe-mid": 150.0, "probe-last": 155.0})]
    rows = curve_points(reports)
    assert [(r["train_responses"], r["predictor"]) for r in rows] == [
        (250, "probe-mid"), (250, "probe-last"), (1000, "outlets"), (1000, "probe-mid")]
    path = plot_curve(rows, 100.0, str(tmp_path / "curve.png"))
    assert (tmp_path / "curve.png").stat().st_size > 1000 and path.endswith("curve.png")


def test_reports_of_different_test_splits_are_refused():
    with pytest.raises(OutletsError, match="one test split"):
        curve_points([report(250, {"outlets": 1.0}), report(500, {"outlets": 1.0}, features="/other")])
