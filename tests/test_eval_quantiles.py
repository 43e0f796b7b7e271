"""`outlets eval` of quantile predictors (issue 27): OUTLETS' quantile head and the probe given the same head,
coverage and PIT, the split-conformal correction, and the quantiles in the complete record."""

import gzip
import json

import numpy as np
import pytest

from specforge_outlets.cli import main
from specforge_outlets.data.feature_subset import split_validation
from specforge_outlets.evaluation import calibration as calib
from specforge_outlets.evaluation.predictor_api import Prediction
from specforge_outlets.evaluation.requests import Request
from tests.test_eval import chat, make_export  # noqa: F401  (module fixture)

LEVELS = (0.1, 0.5, 0.9)


def request(length, censored=False, index=0):
    return Request(id=f"r{index}", file=f"f{index}", start=10, length=length, messages=None, censored=censored)


def prediction(quantiles, length):
    rows = np.tile(np.asarray(quantiles, np.float64), (length, 1))
    return Prediction(float(quantiles[1]), np.full(length, float(quantiles[1])), rows)


def test_coverage_counts_censored_requests_only_where_they_are_known():
    requests = [request(50, index=0), request(150, index=1), request(100, True, 2), request(300, True, 3)]
    predictions = [prediction((40, 100, 200), r.length) for r in requests]
    obs = calib.observations(requests, predictions)
    q90 = calib.coverage(obs, LEVELS)[2]
    # finished 50 and 150 are under q90 = 200; censored at 300 is known above; censored at 100 is unknown
    assert (q90["undetermined"], q90["coverage"], q90["lower"], q90["upper"]) == (1, 2 / 3, 0.5, 0.75)
    # served, the upper end: the one cut at 100 ran to 100, under q90; the one cut at 300 did not
    pit = calib.pit_histogram(obs, LEVELS)
    assert pit["n"] == 3 and pit["observed"] == pytest.approx([0, 1 / 3, 1 / 3, 1 / 3])
    assert pit["expected"] == pytest.approx([0.1, 0.4, 0.4, 0.1])


def test_dynamic_points_read_the_row_after_that_share_of_the_response():
    r = request(8)
    rows = np.arange(8, dtype=np.float64)[:, None].repeat(3, 1)  # row k holds k
    obs = calib.observations([r], [Prediction(0.0, None, rows)], fraction=0.5)
    assert obs.remaining.tolist() == [4] and obs.quantiles.tolist() == [[4, 4, 4]]


def test_conformal_shift_brings_an_overconfident_head_to_its_level():
    rng = np.random.default_rng(0)
    lengths = np.exp(rng.normal(5, 1, 2000)).round().astype(int) + 1
    half = len(lengths) // 2
    requests = [request(int(n), index=i) for i, n in enumerate(lengths)]
    # a head that predicts the median for every level: far too narrow
    median = float(np.median(lengths))
    predictions = [prediction((median, median, median), r.length) for r in requests]
    shifts = calib.calibrate(requests[:half], predictions[:half], LEVELS)
    corrected = [calib.shifted(p, shifts["static"], shifts["dynamic"]) for p in predictions[half:]]
    before = [c["coverage"] for c in calib.coverage(calib.observations(requests[half:], predictions[half:]), LEVELS)]
    after = [c["coverage"] for c in calib.coverage(calib.observations(requests[half:], corrected), LEVELS)]
    assert before[0] > 0.4 and before[2] < 0.6
    assert after == pytest.approx(list(LEVELS), abs=0.04)
    assert all(np.all(np.diff(p.dynamic_quantiles, axis=1) >= 0) for p in corrected)


def test_eval_scores_outlets_and_the_probe_quantiles_with_a_conformal_correction(chat, tmp_path):  # noqa: F811
    target, train_dir, test_dir = chat
    draft = make_export(target, tmp_path / "draft", quantile_levels=LEVELS)
    fit, held = split_validation(train_dir, str(tmp_path / "fit"), str(tmp_path / "held"), 0.3)
    out = tmp_path / "report"
    assert main(["eval", "--draft", draft, "--features", test_dir, "--train-features", fit, "--calibration-features",
                 held, "--target", target, "--baselines", "probe-mid", "--quantile-levels", "0.1,0.5,0.9",
                 "--no-drafting", "--timing-repeats", "2", "--no-progress", "--output", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert set(report["calibration"]) == {"outlets", "probe-mid"}
    for entry in report["calibration"].values():
        assert entry["levels"] == list(LEVELS) and entry["calibration_requests"] > 0
        assert set(entry["raw"]) == set(entry["conformal"]) == {"static", "at_25", "at_50", "at_75"}
        for point in entry["conformal"].values():
            assert all(0 <= c["lower"] <= c["upper"] <= 1 for c in point["coverage"])
    markdown = (out / "report.md").read_text()
    assert "## Predicted length quantiles: coverage and PIT" in markdown and (out / "pit.png").exists()
    with gzip.open(out / "predictions.jsonl.gz", "rt") as handle:
        rows = [json.loads(line) for line in handle]
    for row in rows:
        assert row["quantile_levels"] == list(LEVELS)
        assert set(row["quantiles"]) == {"outlets", "outlets+conformal", "probe-mid", "probe-mid+conformal"}
        assert row["static"]["outlets+conformal"] == row["static"]["outlets"]  # the correction moves quantiles only
        for entry in row["quantiles"].values():
            assert len(entry["dynamic"]) == row["true_output_len"] and entry["static"] == entry["dynamic"][0]
            assert all(a <= b for q in entry["dynamic"] for a, b in zip(q, q[1:]))


def test_eval_refuses_levels_that_differ_from_the_drafts(chat, tmp_path, capsys):  # noqa: F811
    target, train_dir, test_dir = chat
    draft = make_export(target, tmp_path / "draft", quantile_levels=LEVELS)
    code = main(["eval", "--draft", draft, "--features", test_dir, "--train-features", train_dir, "--target", target,
                 "--baselines", "probe-mid", "--quantile-levels", "0.25,0.75", "--no-drafting", "--no-progress",
                 "--output", str(tmp_path / "report")])
    assert code == 2 and "quantile levels" in capsys.readouterr().err


def test_censored_responses_count_at_their_bound_in_served_coverage_and_the_conformal_shift():
    """A response cut at the cap ran to it: a quantile at or past the bound covers it, one below misses it (no
    request is undetermined). The conformal shift calibrates that served coverage, with 4 of 20 censored."""
    requests = [request(100 + i, index=i) for i in range(16)] + [request(2048, True, i) for i in range(16, 20)]
    predictions = [prediction((50, 100, 150), r.length) for r in requests]
    q90 = calib.coverage(calib.observations(requests, predictions), LEVELS)[2]
    assert q90["upper"] == q90["coverage"] == pytest.approx(16 / 20) and q90["undetermined"] == 0
    at_cap = [prediction((50, 100, 2048), r.length) for r in requests]
    assert calib.coverage(calib.observations(requests, at_cap), LEVELS)[2]["upper"] == 1.0
    shifts = calib.calibrate(requests, predictions, LEVELS)
    # rank ceil(21 x 0.9) = 19 of 20 lands on a censored score: q90 shifted up to the cap, every request served
    assert np.expm1(np.log1p(150) + shifts["static"][2]) == pytest.approx(2048)
    corrected = [calib.shifted(p, shifts["static"], shifts["dynamic"]) for p in predictions]
    assert calib.coverage(calib.observations(requests, corrected), LEVELS)[2]["upper"] == pytest.approx(1.0)


def test_eval_refuses_calibration_without_a_quantile_predictor(chat, tmp_path, capsys):  # noqa: F811
    target, train_dir, test_dir = chat
    fit, held = split_validation(train_dir, str(tmp_path / "fit"), str(tmp_path / "held"), 0.3)
    code = main(["eval", "--features", test_dir, "--train-features", fit, "--calibration-features", held,
                 "--target", target, "--baselines", "constant", "--no-progress", "--output", str(tmp_path / "r")])
    assert code == 2 and "no predictor gave quantiles" in capsys.readouterr().err
