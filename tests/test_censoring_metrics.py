"""Censoring-aware scores and the ranking ceiling, against hand computations and simulated truth."""

import math

import numpy as np
import pytest

from specforge_outlets.evaluation.ceiling import icc_oneway, ranking_ceiling
from specforge_outlets.evaluation.censoring import (
    CensoredRequests, c_index, censored_said_long, censored_scores, dynamic_error_bounds, paired_differences,
    static_error_bounds)


def test_c_index_counts_only_pairs_whose_order_is_known():
    # lengths 10 (done), 20 (done), 30 (cut at 30), 5 (done), 20 (cut at 20)
    requests = CensoredRequests.of([10, 20, 30, 5, 20], [False, False, True, False, True])
    comparable = requests.comparable()
    known = {(0, 1), (0, 2), (1, 2), (3, 0), (3, 1), (3, 2), (0, 4), (1, 4), (3, 4)}  # (shorter, longer)
    assert {tuple(map(int, pair)) for pair in np.argwhere(comparable)} == known
    predicted = [1, 2, 3, 0, 2]  # every known pair right; (1, 4) tied in the prediction
    assert c_index(requests, predicted) == pytest.approx((8 + 0.5) / 9)
    assert c_index(requests, [-p for p in predicted]) == pytest.approx(0.5 / 9)
    assert c_index(CensoredRequests.of([5, 5], [False, False]), [1, 2]) is None  # no known order


def test_error_bounds_never_charge_a_censored_response_for_predicting_long():
    requests = CensoredRequests.of([100, 50], [False, True])
    assert static_error_bounds(requests, [80, 70]).tolist() == [20, 0]  # at least 50 tokens: 70 may be right
    assert static_error_bounds(requests, [80, 20]).tolist() == [20, 30]
    dynamic = [np.full(100, 10.0), np.full(50, 5.0)]
    bounds = dynamic_error_bounds(requests, dynamic)
    remaining = np.arange(50, 0, -1)
    assert bounds[1] == pytest.approx(np.maximum(remaining - 5.0, 0).mean())
    assert bounds[0] == pytest.approx(np.abs(np.arange(100, 0, -1) - 10.0).mean())


def test_censored_said_long_is_the_share_above_the_predictors_own_p90():
    requests = CensoredRequests.of(list(range(1, 21)), [False] * 18 + [True] * 2)
    predicted = list(range(1, 21))  # the two censored ones are the two largest predictions
    assert censored_said_long(requests, predicted) == 1.0
    assert censored_said_long(requests, predicted[::-1]) == 0.0
    assert censored_said_long(CensoredRequests.of([1, 2], [False, False]), [1, 2]) is None


def test_paired_differences_are_zero_for_a_copy_and_exclude_zero_for_a_real_gap():
    rng = np.random.default_rng(0)
    true = rng.lognormal(5, 1, 300)
    censored = true > np.quantile(true, 0.85)
    lengths = np.where(censored, np.quantile(true, 0.85), true)
    requests = CensoredRequests.of(lengths, censored)
    good, bad = true * rng.lognormal(0, 0.2, 300), true * rng.lognormal(0, 1.5, 300)
    static = {"ref": good, "copy": good.copy(), "worse": bad}
    dynamic = {name: static_error_bounds(requests, values) for name, values in static.items()}
    out = paired_differences(requests, static, dynamic, "ref", resamples=200)
    assert set(out) == {"copy", "worse"}
    for metric, entry in out["copy"].items():
        assert entry == {"difference": 0.0, "low": 0.0, "high": 0.0}, metric
    assert out["worse"]["c_index"]["difference"] == pytest.approx(c_index(requests, bad) - c_index(requests, good))
    worse = out["worse"]
    assert worse["c_index"]["high"] < 0 and worse["spearman"]["high"] < 0
    assert worse["static_mae"]["low"] > 0 and worse["static_mae_censored"]["low"] > 0
    row = censored_scores(requests, good, dynamic["ref"])
    assert row["n_censored"] == int(censored.sum()) and row["c_index"] > 0.8


def test_paired_differences_survive_resamples_without_two_finished_requests():
    # The quick demo's test split: three requests, two cut at the cap; most resamples hold one finished request.
    requests = CensoredRequests.of([40, 64, 64], [False, True, True])
    static = {"ref": np.array([30.0, 50.0, 70.0]), "other": np.array([60.0, 20.0, 10.0])}
    dynamic = {name: static_error_bounds(requests, values) for name, values in static.items()}
    out = paired_differences(requests, static, dynamic, "ref", resamples=50)
    assert out["other"]["spearman"] is None  # one finished request has no rank order, in the set or any resample
    assert out["other"]["static_mae"]["difference"] == pytest.approx(20.0 - 10.0)
    assert out["other"]["c_index"]["difference"] == pytest.approx(0.0 - 1.0)


def test_icc_recovers_the_simulated_share_of_variance_between_prompts():
    rng = np.random.default_rng(1)
    rho = 0.6
    prompts = rng.normal(0, math.sqrt(rho), 3000)
    groups = [mean + rng.normal(0, math.sqrt(1 - rho), rng.integers(2, 6)) for mean in prompts]
    assert icc_oneway(groups) == pytest.approx(rho, abs=0.03)


def test_corrected_ceiling_matches_the_correlation_with_the_prompts_true_mean():
    rng = np.random.default_rng(2)
    rho, count = 0.55, 4000
    means = rng.normal(5, math.sqrt(rho), count)
    samples = {f"p{i}": np.expm1(means[i] + rng.normal(0, math.sqrt(1 - rho), 4)).tolist() for i in range(count)}
    rows = list(samples)
    out = ranking_ceiling(samples, rows)
    truth = np.corrcoef(np.argsort(np.argsort([np.log1p(samples[r][0]) for r in rows])), np.argsort(np.argsort(means)))[0, 1]
    assert out["spearman_naive"] < truth - 0.05  # the naive ceiling is attenuated
    assert out["spearman_corrected"] == pytest.approx(truth, abs=0.03)
    assert out["spearman_from_icc"] == pytest.approx(truth, abs=0.03)
