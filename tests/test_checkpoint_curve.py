"""The convergence protocol: doubling checkpoints, the stopping rule, the validation length loss."""

from types import SimpleNamespace

import numpy as np
import pytest

from specforge_outlets.evaluation.checkpoint_curve import (
    checkpoint_point, doubling_steps, draft_of, plot_scaling, relative_improvement, stop_reason, validation_length_loss)


def test_checkpoints_double_up_to_the_budget():
    assert doubling_steps(4000) == [250, 500, 1000, 2000, 4000]
    assert doubling_steps(3000) == [250, 500, 1000, 2000, 3000]  # the budget's own last checkpoint
    assert doubling_steps(4000, first=500) == [500, 1000, 2000, 4000]
    with pytest.raises(AssertionError):
        doubling_steps(100)


def test_a_draft_stops_only_when_every_objective_of_its_own_flattened():
    points = [{"step": 250, "length_loss": 1.0, "mean_acceptance_rate": 0.20},
              {"step": 500, "length_loss": 0.99, "mean_acceptance_rate": 0.25}]
    assert stop_reason(points[:1], "outlets") is None
    assert stop_reason(points, "lp-only") is not None  # length loss -1%: flat for LP-only
    assert stop_reason(points, "outlets") is None  # acceptance still +25%
    assert stop_reason(points, "sd-only") is None
    points.append({"step": 1000, "length_loss": 0.985, "mean_acceptance_rate": 0.252})
    reason = stop_reason(points, "outlets")
    assert reason.startswith("step 500 -> 1000") and "each under 2%" in reason
    assert relative_improvement(1.0, 1.2, higher_is_better=False) == pytest.approx(-0.2)  # worse is negative


def test_validation_length_loss_is_the_trained_objective_and_one_sided_on_censored():
    finished = SimpleNamespace(length=4, censored=False)
    censored = SimpleNamespace(length=3, censored=True)
    exact = np.array([4.0, 3, 2, 1])
    assert validation_length_loss([finished], [exact], one_sided=True) == 0.0
    off = exact * np.e - 1 + np.e  # log1p(off) = log1p(exact) + 1 everywhere: error 1
    assert validation_length_loss([finished], [off], one_sided=True) == pytest.approx(1.0)
    high, low = np.full(3, 1000.0), np.zeros(3)
    assert validation_length_loss([finished, censored], [exact, high], one_sided=True) == 0.0
    assert validation_length_loss([finished, censored], [exact, low], one_sided=True) > 0
    assert validation_length_loss([finished, censored], [exact, low], one_sided=False) == 0.0


def test_a_point_scores_spread_on_finished_responses_and_counts_censored_ones_as_long():
    lengths, censored = [50, 100, 900, 2048], [False, False, False, True]
    everything = SimpleNamespace(requests=[SimpleNamespace(length=n, censored=c) for n, c in zip(lengths, censored)],
                                 lengths=lengths)
    validation = SimpleNamespace(with_censored=lambda: everything)
    static = [100, 200, 1800, 300]  # the finished ones doubled; the censored one predicted short
    predictions = [SimpleNamespace(static=s, dynamic=None) for s in static]
    drafting = {"mean_acceptance_rate": 0.3, "acceptance_rate_per_step": [0.35, 0.3, 0.25]}
    point = checkpoint_point(1000, validation, predictions, drafting, one_sided=True)
    assert point["log_slope"] == pytest.approx(1.0)  # the censored response's 300 is left out of the slope
    assert point["long_predicted_long"] == pytest.approx(0.5)  # 900 predicted long, the censored one not
    assert (point["spearman"], point["validation_censored"]) == (pytest.approx(1.0), 1)


def test_a_run_is_drawn_under_its_draft():
    assert [draft_of(run) for run in ("outlets", "outlets-float32", "sd-only", "lp-only-head-lr-1x")] == [
        "outlets", "outlets", "sd-only", "lp-only"]


def test_a_subset_run_is_drawn_under_its_draft_and_the_scaling_figure_is_written(tmp_path):
    assert draft_of("outlets-n263") == "outlets"
    score = {"length_loss": 1.6, "spearman": 0.5, "c_index": 0.6}
    points = [{"train_files": n, "outlets": score, "probe-mid": {**score, "spearman": 0.55}} for n in (263, 526, 2104)]
    plot_scaling(points, str(tmp_path / "scaling.png"))
    assert (tmp_path / "scaling.png").stat().st_size > 0
