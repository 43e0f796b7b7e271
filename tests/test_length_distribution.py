"""Predicted length distributions (scheduling/length_distribution.py): interpolation, survival, Gittins, CVaR, KV budget."""

import math
from statistics import NormalDist

import pytest

from specforge_outlets.scheduling import (
    DEFAULT_QUANTILE_LEVELS,
    MIN_PREDICTED_REMAINING,
    NUM_ATOMS,
    LengthDistribution,
    SchedulingConfig,
    cvar_of,
    gittins_rank_of,
    predicted_output_budget,
    quantile_output_budget,
)
from specforge_outlets.scheduling.length_distribution import mean_of, quantile_of

Z = NormalDist().inv_cdf


def log_normal_total(mu, sigma, p):
    """The p-quantile of L where 1 + L is log-normal(mu, sigma)."""
    return math.expm1(mu + sigma * Z(p))


# --- interpolation ---------------------------------------------------------------------------------
@pytest.mark.parametrize("given", [(0.25, 0.75), (0.1, 0.9), (0.5, 0.9), DEFAULT_QUANTILE_LEVELS])
def test_a_log_normal_given_at_any_two_levels_is_reproduced_at_every_other(given):
    mu, sigma = math.log(300.0), 0.9
    distribution = LengthDistribution(given, tuple(log_normal_total(mu, sigma, p) for p in given))
    for p in (0.001, 0.01, 0.05, 0.1, 0.3, 0.5, 0.77, 0.9, 0.99, 0.999):  # inside and beyond the given levels
        assert distribution.quantile(p) == pytest.approx(log_normal_total(mu, sigma, p), rel=1e-9)
    # the atoms are the quantiles at (i + 0.5) / NUM_ATOMS
    assert len(distribution.atoms) == NUM_ATOMS
    for i in (0, 17, 50, NUM_ATOMS - 1):
        assert distribution.atoms[i] == pytest.approx(log_normal_total(mu, sigma, (i + 0.5) / NUM_ATOMS), rel=1e-9)
    # unconditioned readings of the atoms: the median and q0.9 at 1%, the mean within 3% (the atoms cut the far tail)
    assert distribution.quantile_remaining(0.5) == pytest.approx(math.exp(mu) - 1, rel=0.01)
    assert distribution.quantile_remaining(0.9) == pytest.approx(log_normal_total(mu, sigma, 0.9), rel=0.01)
    assert distribution.mean_remaining() == pytest.approx(math.exp(mu + sigma ** 2 / 2) - 1, rel=0.03)


def test_between_levels_the_log_length_is_linear_in_the_normal_score_not_in_p():
    distribution = LengthDistribution((0.1, 0.5, 0.9), (9.0, 99.0, 999.0))  # log(1 + L) = log 10, 2 log 10, 3 log 10
    # halfway in normal score between 0.5 and 0.9 (not halfway in p)
    p = NormalDist().cdf(Z(0.9) / 2)
    assert distribution.quantile(p) == pytest.approx(10 ** 2.5 - 1, rel=1e-12)
    assert distribution.quantile(0.7) != pytest.approx(10 ** 2.5 - 1, rel=1e-3)
    # a kink: different slopes on the two sides are each extended outwards
    kinked = LengthDistribution((0.1, 0.5, 0.9), (9.0, 99.0, 9999.0))
    assert kinked.quantile(0.99) == pytest.approx(10 ** (2 + 2 * Z(0.99) / Z(0.9)) - 1, rel=1e-9)
    assert kinked.quantile(0.01) == pytest.approx(10 ** (2 - Z(0.99) / Z(0.9)) - 1, rel=1e-9)


def test_the_lower_extrapolation_stops_at_zero_tokens_and_a_cap_bounds_every_atom():
    steep = LengthDistribution((0.5, 0.9), (2.0, 500.0))
    assert steep.quantile(0.001) == 0.0 and min(steep.atoms) == 0.0
    assert steep.atoms == tuple(sorted(steep.atoms))
    capped = LengthDistribution((0.5, 0.9), (2.0, 500.0), cap=300.0)
    assert max(capped.atoms) == 300.0 and capped.quantile(0.999) == 300.0
    assert capped.quantile(0.5) == pytest.approx(2.0)


@pytest.mark.parametrize("levels, quantiles, cap, message", [
    ((), (), None, "levels must be a non-empty"),
    ((0.0, 0.5), (1, 2), None, "levels must be a non-empty sequence of numbers strictly between 0 and 1"),
    ((0.5, 0.5), (1, 2), None, "levels must be strictly increasing"),
    ((0.1, 0.9), (1,), None, r"quantiles must give one value per level \(2\)"),
    ((0.1, 0.9), (0, 2), None, "quantiles must be positive"),
    ((0.1, 0.9), (1, float("nan")), None, "quantiles must be positive"),
    ((0.1, 0.9), (5, 2), None, "quantiles must be non-decreasing"),
    ((0.1, 0.9), (1, 2), 0, "cap must be None or a positive"),
])
def test_bad_distributions_are_refused_naming_the_field(levels, quantiles, cap, message):
    with pytest.raises(ValueError, match=message):
        LengthDistribution(levels, quantiles, cap)


def test_atoms_are_computed_once_and_do_not_enter_equality():
    one = LengthDistribution((0.1, 0.9), (10, 100))
    two = LengthDistribution([0.1, 0.9], [10.0, 100.0])
    assert one == two and hash(one) == hash(two)
    assert one.atoms is one.atoms and one.levels == (0.1, 0.9)
    assert one.remaining_atoms(3) is one.remaining_atoms(3)  # conditioned atoms memoised per survival point
    with pytest.raises(AttributeError):
        one.levels = (0.2, 0.8)


def test_a_re_prediction_of_remaining_quantiles_is_stored_as_totals():
    distribution = LengthDistribution.from_remaining((0.1, 0.5, 0.9), (10, 20, 30), num_generated=5)
    assert distribution.quantiles == (15.0, 25.0, 35.0)


def test_log_normal_constructor_puts_the_point_at_the_median():
    distribution = LengthDistribution.log_normal(200.0, 0.5)
    assert distribution.levels == DEFAULT_QUANTILE_LEVELS
    assert distribution.quantiles[2] == pytest.approx(200.0)
    assert distribution.quantiles[4] == pytest.approx(200.0 * math.exp(0.5 * Z(0.9)))
    assert LengthDistribution.log_normal(200.0, 0.0).quantiles == (200.0,) * 5


# --- survival -------------------------------------------------------------------------------------
def test_readings_are_conditioned_on_survival():
    distribution = LengthDistribution((0.1, 0.5, 0.9), (20.0, 100.0, 500.0))
    atoms = distribution.atoms
    for generated in (0, 30, 100, 400):
        left = [max(a - generated, MIN_PREDICTED_REMAINING) for a in atoms if a > generated]
        assert distribution.remaining_atoms(generated) == pytest.approx(left)
        assert distribution.mean_remaining(generated) == pytest.approx(sum(left) / len(left))
    # a request that survived long is expected to run longer in total: the tail is heavy
    totals = [g + distribution.mean_remaining(g) for g in (0, 50, 100, 200, 400)]
    assert totals == sorted(totals) and totals[-1] > 2 * totals[0]


def test_a_point_mass_reads_as_the_point_prediction_and_past_every_atom_as_the_floor():
    point = LengthDistribution.point(100.0)
    assert point.mean_remaining(30) == point.quantile_remaining(0.9, 30) == point.gittins_rank(30) == 70.0
    assert point.cvar_remaining(0.9, 30) == pytest.approx(70.0)
    assert point.mean_remaining(99.5) == MIN_PREDICTED_REMAINING  # 0.5 left: floored, as predicted_remaining
    for generated in (100, 150):  # no atom exceeds it: about to finish
        assert point.mean_remaining(generated) == point.gittins_rank(generated) == MIN_PREDICTED_REMAINING
    assert LengthDistribution.point(0.0).mean_remaining(0) == MIN_PREDICTED_REMAINING
    wide = LengthDistribution((0.1, 0.9), (10.0, 50.0))
    assert wide.mean_remaining(10_000) == wide.quantile_remaining(0.9, 10_000) == MIN_PREDICTED_REMAINING


# --- helpers on atoms, by hand ---------------------------------------------------------------------
def test_quantile_of_interpolates_between_atom_midpoints():
    values = [10.0, 20.0, 30.0, 40.0]  # atom i at p = (i + 0.5) / 4
    assert quantile_of(values, 0.5) == 25.0
    assert quantile_of(values, 0.125) == 10.0 and quantile_of(values, 0.0) == 10.0
    assert quantile_of(values, 0.875) == 40.0 and quantile_of(values, 1.0) == 40.0
    assert quantile_of(values, 0.75) == 35.0
    assert quantile_of([7.0], 0.3) == 7.0


def test_cvar_is_the_mean_of_the_upper_tail_with_a_partial_atom():
    assert cvar_of([float(v) for v in range(1, 101)], 0.9) == pytest.approx(95.5)  # mean of 91..100
    assert cvar_of([1.0, 2.0, 3.0, 4.0], 0.0) == 2.5  # the mean
    assert cvar_of([1.0, 2.0, 3.0, 4.0], 0.5) == 3.5
    assert cvar_of([1.0, 2.0, 3.0, 4.0], 0.6) == pytest.approx((4 + 0.6 * 3) / 1.6)  # 1.6 atoms of mass
    assert cvar_of([1.0, 2.0, 3.0, 4.0], 0.9) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="alpha must be in"):
        cvar_of([1.0], 1.0)


def test_gittins_rank_of_a_deterministic_job_is_its_length():
    assert gittins_rank_of([37.0] * 10) == pytest.approx(37.0)
    assert LengthDistribution.point(120.0).gittins_rank(20) == pytest.approx(100.0)


def test_gittins_prefers_a_likely_short_job_over_one_of_the_same_mean_that_cannot_finish_early():
    likely_short = [2.0] * 9 + [182.0]  # mean 20: 90% done after 2 tokens
    even = [10.0] * 5 + [30.0] * 5  # mean 20
    assert mean_of(likely_short) == mean_of(even) == 20.0  # the mean key cannot tell them apart
    # likely_short: D = 2 gives E[min(R, 2)] / P(R <= 2) = 2 / 0.9; D = 182 gives the mean, 20
    assert gittins_rank_of(likely_short) == pytest.approx(2 / 0.9)
    # even: D = 10 gives 10 / 0.5 = 20, D = 30 gives 20: its rank is its mean
    assert gittins_rank_of(even) == pytest.approx(20.0)
    # the risk key (E + CVaR_0.9) orders them the other way: the likely-short job's tail is 182
    assert 20 + cvar_of(likely_short, 0.9) == pytest.approx(202.0)
    assert 20 + cvar_of(even, 0.9) == pytest.approx(50.0)


def test_gittins_rank_never_exceeds_the_mean_and_equals_it_for_a_deterministic_job():
    for distribution in (LengthDistribution((0.1, 0.5, 0.9), (20.0, 100.0, 500.0)),
                         LengthDistribution.log_normal(300.0, 1.2), LengthDistribution((0.1, 0.9), (50.0, 60.0))):
        for generated in (0, 40, 200):
            assert distribution.gittins_rank(generated) <= distribution.mean_remaining(generated) + 1e-9
    # a heavy-tailed distribution's rank sits well below its mean
    heavy = LengthDistribution.log_normal(100.0, 1.5)
    assert heavy.gittins_rank() < 0.5 * heavy.mean_remaining()


def test_kv_footprint_is_the_kv_held_over_the_remaining_decode():
    # point mass: 10 tokens left after 1, prompt 100: (100 + 1 + 10 / 2) * 10
    assert LengthDistribution.point(11.0).kv_footprint(100, 1) == pytest.approx(1060.0)
    distribution = LengthDistribution((0.1, 0.5, 0.9), (20.0, 100.0, 500.0))
    left = distribution.remaining_atoms(5)
    expected = sum((1000 + 5 + r / 2) * r for r in left) / len(left)
    assert distribution.kv_footprint(1000, 5) == pytest.approx(expected)
    # a longer prompt costs more for the same output
    assert distribution.kv_footprint(4000, 5) > distribution.kv_footprint(1000, 5)


# --- KV budget ------------------------------------------------------------------------------------
def test_quantile_budget_reserves_the_quantile_of_the_remaining_length_capped():
    assert quantile_output_budget(LengthDistribution.point(100.0), 10, 0.9, 1000) == 90
    distribution = LengthDistribution.log_normal(200.0, 0.8)
    for generated in (1, 150, 600):
        expected = math.ceil(distribution.quantile_remaining(0.9, generated))
        assert quantile_output_budget(distribution, generated, 0.9, 10_000) == expected
    q90 = math.ceil(distribution.quantile_remaining(0.9, 1))
    assert q90 == pytest.approx(200 * math.exp(0.8 * Z(0.9)), rel=0.02)
    assert quantile_output_budget(distribution, 1, 0.9, 100) == 100
    # against the point rule: mean x 1.2 reserves less than q0.9 for an uncertain request, more for a sure one
    config = SchedulingConfig()
    assert predicted_output_budget(200.0, 1, 0.2, 10_000, config) < q90
    sure = LengthDistribution.log_normal(200.0, 0.05)
    assert quantile_output_budget(sure, 1, 0.9, 10_000) < predicted_output_budget(200.0, 1, 0.2, 10_000, config)


def test_quantile_remaining_read_in_place_equals_the_conditioned_atoms_quantile():
    """The O(log n) reading KV admission uses gives what the conditioned atoms give, floors included."""
    import random

    from specforge_outlets.scheduling.length_distribution import quantile_of

    rng = random.Random(0)
    for _ in range(3000):
        dist = LengthDistribution((0.1, 0.25, 0.5, 0.75, 0.9), tuple(sorted(rng.uniform(1, 2000) for _ in range(5))))
        generated, p = rng.randint(0, 2500), rng.random()
        assert dist.quantile_remaining(p, generated) == pytest.approx(
            quantile_of(dist.remaining_atoms(generated), p), rel=1e-12, abs=1e-12)
