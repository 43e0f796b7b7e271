"""The learning curve: one point per report and predictor, in training-set order, one test split only."""

import pytest

from specforge_outlets.errors import OutletsError
from specforge_outlets.evaluation.learning_curve import curve_points, plot_curve
from specforge_outlets.evaluation.report_file import EvalReport, PredictorScore, read_report, recorded_path, write_report


def report(n_train, maes, features="/runs/features/test"):
    return EvalReport("report.json", features, 100, n_train, {
        name: PredictorScore(mae, (mae - 5, mae + 5), None, 0.4) for name, mae in maes.items()}, None)


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


def test_the_report_is_read_typed_and_a_stale_or_broken_one_is_named(tmp_path):
    raw = {"version": 2, "features": "/f", "n_requests": 8, "n_train_requests": 16, "noise_floor": {"static_mae": 3.5},
           "predictors": {"outlets": {"static_mae": 40.0, "static_mae_ci": [30.0, 50.0], "dynamic_mae": 20.0,
                                      "spearman": 0.5}}}
    write_report(str(tmp_path), raw)
    read = read_report(str(tmp_path))
    assert read.predictors["outlets"] == PredictorScore(40.0, (30.0, 50.0), 20.0, 0.5)
    assert (read.n_requests, read.n_train_requests, read.noise_floor_static_mae) == (8, 16, 3.5)
    write_report(str(tmp_path), {**raw, "version": 1})
    with pytest.raises(OutletsError, match=r"report\.json: report version 1, this package reads 2"):
        read_report(str(tmp_path))
    write_report(str(tmp_path), {**raw, "predictors": {"outlets": {"spearman": 0.5}}})
    with pytest.raises(OutletsError, match=r"report\.json: malformed report \(KeyError"):
        read_report(str(tmp_path))


def test_a_report_records_its_inputs_without_a_machine_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert recorded_path(str(tmp_path / "runs" / "features" / "test")) == "runs/features/test"
    assert recorded_path("runs/features/test") == "runs/features/test"
    assert recorded_path("/root/.cache/specforge-outlets/smollm2-135m") == "specforge-outlets/smollm2-135m"
    assert recorded_path("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"  # a hub id
    assert recorded_path(None) is None
