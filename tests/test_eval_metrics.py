"""Length-prediction metrics against hand-computed values."""

import math

import numpy as np
import pytest

from specforge_outlets.evaluation import metrics


def test_static_mae_by_hand():
    # |4 - 2| = 2, |2 - 5| = 3
    assert metrics.static_mae([4, 2], [2.0, 5.0]) == pytest.approx(2.5)


def test_dynamic_mae_by_hand():
    # L = 4, r_hat = 4,4,4,4 vs true 4,3,2,1 -> errors 0,1,2,3 -> 1.5
    # L = 2, r_hat = 1,1 vs true 2,1 -> errors 1,0 -> 0.5; mean over requests 1.0
    dynamic = [np.array([4.0, 4, 4, 4]), np.array([1.0, 1])]
    assert metrics.dynamic_abs_errors(4, dynamic[0]).tolist() == [0, 1, 2, 3]
    assert metrics.dynamic_mae([4, 2], dynamic) == pytest.approx(1.0)
    # a perfect predictor scores zero; the requests weigh the same whatever their length
    assert metrics.dynamic_mae([3, 100], [np.array([3.0, 2, 1]), np.arange(100, 0, -1.0)]) == 0
    assert metrics.dynamic_mae([1, 100], [np.array([3.0]), np.arange(100, 0, -1.0)]) == pytest.approx(1.0)


def test_dynamic_needs_one_prediction_per_position():
    with pytest.raises(AssertionError):
        metrics.dynamic_abs_errors(3, [1.0, 2.0])


def test_mae_by_progress_by_hand():
    # L = 4: t = 0,1,2,3 fall in deciles 0, 2, 5, 7 with errors 0,1,2,3
    # L = 2: t = 0,1 fall in deciles 0, 5 with errors 1, 0
    dynamic = [np.array([4.0, 4, 4, 4]), np.array([1.0, 1])]
    by_progress = metrics.mae_by_progress([4, 2], dynamic)
    assert len(by_progress) == 10
    assert by_progress[0] == pytest.approx(0.5)
    assert by_progress[2] == pytest.approx(1.0)
    assert by_progress[5] == pytest.approx(1.0)
    assert by_progress[7] == pytest.approx(3.0)
    assert [by_progress[i] for i in (1, 3, 4, 6, 8, 9)] == [None] * 6


def test_mae_by_progress_averages_within_a_request_first():
    # L = 20: decile 0 holds t = 0, 1 with errors 2 and 4 -> request mean 3; other request L = 10 error 0
    pred20 = np.arange(20, 0, -1.0)
    pred20[0] += 2
    pred20[1] -= 4
    by_progress = metrics.mae_by_progress([20, 10], [pred20, np.arange(10, 0, -1.0)])
    assert by_progress[0] == pytest.approx(1.5)


def test_length_buckets_by_hand():
    assert [metrics.length_bucket(n) for n in (1, 199, 200, 500, 501)] == ["short", "short", "medium", "medium", "long"]
    lengths = [100, 300, 600, 700]
    static = [110.0, 300.0, 500.0, 900.0]
    buckets = metrics.mae_by_length_bucket(lengths, static)
    assert buckets["short"] == {"n_requests": 1, "static_mae": 10.0, "dynamic_mae": None}
    assert buckets["medium"]["static_mae"] == 0.0
    assert buckets["long"]["n_requests"] == 2 and buckets["long"]["static_mae"] == pytest.approx(150.0)
    empty = metrics.mae_by_length_bucket([5], [5.0], short_max=3, long_min=10)
    assert empty["short"]["n_requests"] == 0 and empty["short"]["static_mae"] is None
    assert empty["medium"]["static_mae"] == 0.0


def test_countdown_by_hand():
    assert metrics.countdown(3.5, 5).tolist() == [3.5, 2.5, 1.5, 1.0, 1.0]
    # a countdown from the true length is exact
    assert metrics.dynamic_mae([6], [metrics.countdown(6, 6)]) == 0
    assert not math.isnan(metrics.dynamic_mae([6], [metrics.countdown(0, 6)]))


def test_bootstrap_interval_contains_the_mean_and_is_seeded():
    errors = [1.0, 2.0, 3.0, 10.0, 4.0]
    low, high = metrics.bootstrap_interval(errors, seed=7)
    assert low <= np.mean(errors) == 4.0 <= high
    assert 1.0 <= low < high <= 10.0  # a resampled mean lies between the extremes
    assert metrics.bootstrap_interval(errors, seed=7) == (low, high)
    spread = np.arange(50.0)
    assert metrics.bootstrap_interval(spread, seed=1) != metrics.bootstrap_interval(spread, seed=2)
    assert metrics.bootstrap_interval([5.0, 5.0, 5.0]) == (5.0, 5.0)  # no spread, no interval


def test_per_request_errors_are_what_the_maes_average():
    assert metrics.static_abs_errors([4, 2], [2.0, 5.0]).tolist() == [2.0, 3.0]
    dynamic = [np.array([4.0, 4, 4, 4]), np.array([1.0, 1])]
    assert metrics.dynamic_request_errors([4, 2], dynamic).tolist() == [1.5, 0.5]


def test_spearman_on_known_data():
    assert metrics.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert metrics.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # y = 5,6,7,8,7 has ranks 1,2,3.5,5,3.5 (tie averaged); centred: x -2,-1,0,1,2 and
    # y -2,-1,0.5,2,0.5 -> sum of products 8, sums of squares 10 and 9.5 -> 8 / sqrt(95) = 0.8208
    assert metrics.spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(0.8208, abs=1e-4)
    assert metrics.ranks([3, 1, 3, 2]).tolist() == [3.5, 1.0, 3.5, 2.0]
    assert metrics.spearman([1, 2, 3], [7, 7, 7]) is None  # a constant predictor has no order


def test_calibration_quantiles_and_long_share():
    true = [100, 200, 800, 900]
    predicted = [150, 150, 799, 1000]
    result = metrics.calibration(true, predicted, levels=(0.5,), threshold=800)
    assert result["true_quantiles"] == [500.0] and result["predicted_quantiles"] == [474.5]
    assert result["true_share_at_or_above"] == 0.5  # 800 and 900
    assert result["predicted_share_at_or_above"] == 0.25  # only 1000: 799 is below
    assert len(metrics.calibration(true, predicted)["levels"]) == 19


def test_log_slope_and_long_predicted_long_by_hand():
    true = [10, 100, 1000]
    assert metrics.log_slope(true, [20, 200, 2000]) == pytest.approx(1.0)  # proportional: the full spread
    assert metrics.log_slope(true, [50, 50, 50]) == pytest.approx(0.0)  # a constant follows none of it
    assert metrics.log_slope(true, [100, 1000, 10 ** 3.5]) == pytest.approx(0.75)  # log10: 2, 3, 3.5
    # at or above 800: 800, 2048 (censored, at the cap) and 900; predicted above 500: 501 and 600
    share = metrics.long_predicted_long([100, 800, 2048, 900], [900, 501, 500, 600])
    assert share == pytest.approx(2 / 3)
    assert metrics.long_predicted_long([100, 200], [900, 900]) is None


def test_long_auc_by_hand():
    # long: 800, 2048 (censored, at the cap), 900; short: 100, 300. Pairs (long, short) with the long one's
    # r̂ larger: 600 > 500 and 100, 700 > both, 400 > 100 only: 5 of 6. Then a tie (500 / 500) counts half
    assert metrics.long_auc([800, 2048, 900, 100, 300], [600, 400, 700, 500, 100]) == pytest.approx(5 / 6)
    assert metrics.long_auc([800, 100, 900, 300], [500, 500, 700, 100]) == pytest.approx((1.5 + 2) / 4)
    assert metrics.long_auc([900, 1000], [1, 2]) is None and metrics.long_auc([9, 10], [1, 2]) is None
    lengths = np.random.default_rng(0).integers(1, 2000, 200)
    assert metrics.long_auc(lengths, lengths) == 1.0 and metrics.long_auc(lengths, -lengths) == 0.0


def test_noise_floor_by_hand():
    # prompt a: samples 10, 20, 60 -> medians of the others 40, 35, 15 -> errors 30, 15, 45 -> 30
    # prompt b: samples 5, 7 -> errors 2, 2 -> 2; prompt c has one sample: left out
    floor = metrics.noise_floor_errors({"a": [10, 20, 60], "b": [5, 7], "c": [9]})
    assert floor == {"a": pytest.approx(30.0), "b": pytest.approx(2.0)}
    assert np.mean(list(floor.values())) == pytest.approx(16.0)


def test_label_set_noise_floor_by_hand():
    from specforge_outlets.evaluation.label_stats import length_summary, noise_floor, samples_by_prompt

    def row(key, n, finish="stop"):
        return {"id": key, "conversations": [{"role": "user", "content": "q"},
                                             {"role": "assistant", "content": "a", "num_tokens": n,
                                              "finish_reason": finish}]}

    files = [[row("a", 10), row("b", 100)], [row("a", 20), row("b", 300)], [row("a", 30), row("b", 2048, "length")]]
    samples = samples_by_prompt(files)
    assert samples == {"a": [10.0, 20.0, 30.0], "b": [100.0, 300.0]}
    floor = noise_floor(samples)
    # a: |10-25| + |20-20| + |30-15| over 3 = 10; b: |100-300| and |300-100| = 200; mean over prompts 105.
    assert floor["floor_mae"] == pytest.approx(105.0) and floor["prompts"] == 2 and floor["samples"] == 5
    # global median of [10, 20, 30, 100, 300] = 30: a -> (20+10+0)/3 = 10, b -> (70+270)/2 = 170; mean 90.
    assert floor["constant"] == 30 and floor["constant_mae"] == pytest.approx(90.0)
    assert 0.5 < floor["icc_log_length"] < 1
    summary = length_summary({"a": files[2][0]["conversations"][1], "b": files[2][1]["conversations"][1]})
    assert (summary["finished"], summary["censored"], summary["censored_share"]) == (1, 1, 0.5)
