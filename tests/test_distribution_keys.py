"""Order keys, tail-safe classes and queues that read a predicted distribution (issue 27), and their fallbacks."""

import random
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Optional, Tuple

import pytest

from specforge_outlets.scheduling import (
    DEFAULT_RISK_BETA,
    LengthDistribution,
    OrderKey,
    QueuePolicy,
    SchedulingConfig,
    admission_order,
    create_request_queue,
    is_predicted_long,
    predicted_remaining,
    request_prompt_len,
    sjf_sort_key,
)

from tests.test_scheduling import Req as PointReq

LEVELS = (0.1, 0.25, 0.5, 0.75, 0.9)


@dataclass
class Req(PointReq):
    """test_scheduling's request with the distribution fields."""

    predicted_output_quantiles: Optional[Tuple[float, ...]] = None
    prompt_len: Optional[int] = None


def drain(queue, now=100.0):
    return [queue.pop_request(now).name for _ in range(len(queue))]


def config(**kwargs):
    return SchedulingConfig(**kwargs)


# --- backward compatibility: no distribution, or the point key ----------------------------------------
def test_the_point_key_ignores_quantiles_and_is_unchanged():
    rng = random.Random(3)
    default = SchedulingConfig()
    assert default.order_key is OrderKey.POINT and default.long_class_quantile is None
    assert not default.uses_distribution
    for _ in range(200):
        predicted = rng.choice([None, 0.0, 5.0, 300.0, 2000.0])
        generated, arrival = rng.choice([0, 1, 40, 600]), rng.uniform(0, 100)
        quantiles = tuple(sorted(rng.uniform(1, 3000) for _ in LEVELS))
        remaining = predicted_remaining(predicted, generated, default.prior_output_len)
        assert sjf_sort_key(predicted, generated, arrival, default) == (remaining + 10.0 * arrival, arrival)
        assert sjf_sort_key(predicted, generated, arrival, default, quantiles, 5000) == (
            remaining + 10.0 * arrival, arrival)
        assert is_predicted_long(predicted, generated, default, quantiles) == (remaining >= 800)


@pytest.mark.parametrize("order_key", ["mean", "gittins"])
def test_without_quantiles_mean_and_gittins_keys_are_the_point_key(order_key):
    rng = random.Random(5)
    point, by_distribution = SchedulingConfig(), SchedulingConfig(order_key=order_key)
    for _ in range(300):
        predicted = rng.choice([None, 0.0, 3.0, 300.0, 1500.7])
        generated, arrival = rng.choice([0, 1, 2, 299, 300, 301, 2000]), rng.uniform(0, 50)
        expected = sjf_sort_key(predicted, generated, arrival, point)
        assert sjf_sort_key(predicted, generated, arrival, by_distribution) == pytest.approx(expected, rel=1e-12)


def test_without_quantiles_risk_and_footprint_keys_read_the_point_as_a_point_mass():
    risk, footprint = SchedulingConfig(order_key="risk"), SchedulingConfig(order_key="kv-footprint")
    assert sjf_sort_key(300.0, 100, 2.0, risk) == pytest.approx(((1 + DEFAULT_RISK_BETA) * 200 + 20.0, 2.0))
    assert sjf_sort_key(None, 0, 0.0, risk) == pytest.approx(((1 + DEFAULT_RISK_BETA) * 256, 0.0))  # the prior
    # (prompt + g + R/2) R / 1024 tokens, then aging
    assert sjf_sort_key(300.0, 100, 2.0, footprint, None, 924) == pytest.approx(((924 + 100 + 100) * 200 / 1024 + 20, 2))


def test_bad_distribution_settings_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="order_key must be one of point, mean, risk, gittins, kv-footprint"):
        SchedulingConfig(order_key="cvar")
    with pytest.raises(ValueError, match="long_class_quantile must be None or strictly between 0 and 1"):
        SchedulingConfig(long_class_quantile=1.0)
    with pytest.raises(ValueError, match="quantile_levels: levels must be strictly increasing"):
        SchedulingConfig(quantile_levels=(0.9, 0.1))
    with pytest.raises(ValueError, match="risk_beta must be >= 0"):
        SchedulingConfig(risk_beta=-1.0)
    with pytest.raises(ValueError, match="footprint_context_tokens must be a positive number"):
        SchedulingConfig(footprint_context_tokens=0.0)
    with pytest.raises(ValueError, match="quantiles must give one value per level"):
        sjf_sort_key(100.0, 0, 0.0, SchedulingConfig(order_key="mean"), (1.0, 2.0))
    assert SchedulingConfig(order_key="gittins").order_key is OrderKey.GITTINS


# --- keys with a distribution -------------------------------------------------------------------
def test_mean_key_reads_the_distribution_not_the_point():
    wide = LengthDistribution.log_normal(100.0, 1.0)  # median 100, mean about 165
    keys = SchedulingConfig(order_key="mean", aging_tokens_per_s=0.0)
    key = sjf_sort_key(100.0, 0, 0.0, keys, wide.quantiles)[0]
    assert key == pytest.approx(wide.mean_remaining(0)) and key > 150
    # the point key puts the median-100 request before a sure 140; the mean key after it
    queue = [Req("wide", 0.0, 100.0, 0, wide.quantiles), Req("sure", 0.0, 140.0)]
    assert [r.name for r in admission_order(queue, QueuePolicy.SJF, SchedulingConfig(aging_tokens_per_s=0.0))] == [
        "wide", "sure"]
    assert [r.name for r in admission_order(queue, QueuePolicy.SJF, keys)] == ["sure", "wide"]


def test_risk_and_gittins_keys_disagree_on_a_likely_short_heavy_tailed_request():
    """Most of the mass low, a long tail: Gittins serves it first (it will probably finish soon), the risk key last."""
    tailed = (3.0, 4.0, 6.0, 40.0, 2000.0)  # median 6 tokens, q0.9 2000
    distribution = LengthDistribution(LEVELS, tailed)
    sure_len = 150.0
    assert distribution.gittins_rank(0) < sure_len < distribution.mean_remaining(0) + distribution.cvar_remaining(0.9)
    requests = [Req("sure", 0.0, sure_len), Req("tailed", 0.0, 6.0, 0, tailed)]
    orders = {key: [r.name for r in admission_order(requests, QueuePolicy.SJF, SchedulingConfig(
        order_key=key, aging_tokens_per_s=0.0))] for key in ("point", "risk", "gittins")}
    assert orders == {"point": ["tailed", "sure"], "risk": ["sure", "tailed"], "gittins": ["tailed", "sure"]}


def test_distribution_keys_age_linearly_with_arrival():
    quantiles = (20.0, 40.0, 60.0, 120.0, 400.0)
    for key in ("mean", "risk", "gittins", "kv-footprint"):
        keys = SchedulingConfig(order_key=key, aging_tokens_per_s=10.0)
        early = sjf_sort_key(60.0, 1, 0.0, keys, quantiles, 500)[0]
        late = sjf_sort_key(60.0, 1, 3.5, keys, quantiles, 500)[0]
        assert late - early == pytest.approx(35.0), key


def test_risk_beta_weighs_the_tail():
    quantiles = (20.0, 40.0, 60.0, 120.0, 400.0)
    distribution = LengthDistribution(LEVELS, quantiles)
    for beta in (0.0, 1.0, 3.0):
        keys = SchedulingConfig(order_key="risk", risk_beta=beta, aging_tokens_per_s=0.0)
        expected = distribution.mean_remaining(1) + beta * distribution.cvar_remaining(0.9, 1)
        assert sjf_sort_key(60.0, 1, 0.0, keys, quantiles)[0] == pytest.approx(expected)


def test_kv_footprint_key_orders_by_the_cache_held_not_the_output():
    quantiles = (50.0, 80.0, 100.0, 130.0, 200.0)
    keys = SchedulingConfig(order_key="kv-footprint", aging_tokens_per_s=0.0)
    requests = [Req("long prompt", 0.0, 100.0, 0, quantiles, prompt_len=12_000),
                Req("short prompt", 1.0, 100.0, 0, quantiles, prompt_len=300),
                Req("short output", 2.0, 10.0, 0, None, prompt_len=12_000)]
    order = [r.name for r in admission_order(requests, QueuePolicy.SJF, keys)]
    point_order = [r.name for r in admission_order(requests, QueuePolicy.SJF, SchedulingConfig(aging_tokens_per_s=0.0))]
    assert point_order == ["short output", "long prompt", "short prompt"]
    # about 107 x 353 token-steps < 10 x 12,005 < about 107 x 12,053: where KV binds, the short output with a
    # long prompt holds more cache than a 10x longer output with a short prompt
    assert order == ["short prompt", "short output", "long prompt"]


def test_prompt_length_comes_from_prompt_len_or_sglang_input_ids():
    assert request_prompt_len(SimpleNamespace(prompt_len=7, origin_input_ids=[1, 2])) == 7
    assert request_prompt_len(SimpleNamespace(origin_input_ids=[1, 2, 3])) == 3
    assert request_prompt_len(SimpleNamespace()) == 0


# --- tail-safe class by an upper quantile ------------------------------------------------------------
def test_long_class_by_an_upper_quantile():
    quantiles = (100.0, 200.0, 400.0, 700.0, 1500.0)  # point (median) 400: short by the point rule
    by_point, by_q90 = SchedulingConfig(), SchedulingConfig(long_class_quantile=0.9)
    assert not is_predicted_long(400.0, 0, by_point, quantiles)
    assert is_predicted_long(400.0, 0, by_q90, quantiles)
    assert not is_predicted_long(400.0, 0, SchedulingConfig(long_class_quantile=0.5), quantiles)
    # without quantiles the point rule, the prior without a point
    assert not is_predicted_long(400.0, 0, by_q90) and is_predicted_long(900.0, 0, by_q90)
    assert not is_predicted_long(None, 0, by_q90)
    # conditioned on what was generated: q0.9 of the remaining length shrinks as a light tail is used up
    light = (100.0, 200.0, 400.0, 700.0, 900.0)
    assert is_predicted_long(400.0, 0, by_q90, light)  # q0.9 of 900 left
    assert not is_predicted_long(400.0, 500, by_q90, light)  # about 600 left at q0.9
    queue = create_request_queue(QueuePolicy.TAIL_SAFE, SchedulingConfig(long_class_quantile=0.9, long_holdback=1.0))
    for request in (Req("uncertain", 0.0, 400.0, 0, quantiles), Req("short", 1.0, 400.0)):
        queue.add_request(request)
    assert drain(queue) == ["short", "uncertain"]  # the uncertain one is held back as long


# --- queues agree with the admission order ----------------------------------------------------------
def queue_order(requests, policy, config, now):
    queue = create_request_queue(policy, config)
    for request in requests:
        queue.add_request(request)
    return [queue.pop_request(now) for _ in range(len(requests))]


@pytest.mark.parametrize("policy", [QueuePolicy.SJF, QueuePolicy.TAIL_SAFE])
@pytest.mark.parametrize("settings", [dict(order_key="mean"), dict(order_key="risk"), dict(order_key="gittins"),
                                      dict(order_key="kv-footprint"), dict(long_class_quantile=0.9)])
def test_admission_order_equals_the_queue_with_distributions(policy, settings):
    rng = random.Random(17)
    shapes = [None, (20.0, 40.0, 60.0, 120.0, 400.0), (300.0, 500.0, 700.0, 900.0, 1400.0), (5.0, 6.0, 8.0, 50.0, 3000.0)]
    for trial in range(60):
        requests = [Req(f"{trial}-{i}", float(rng.randint(0, 20)), rng.choice([None, 20.0, 300.0, 900.0]),
                        rng.choice([0, 0, 50]), rng.choice(shapes), rng.choice([10, 1000, 12_000]))
                    for i in range(rng.randint(0, 30))]
        keys = SchedulingConfig(long_holdback=rng.choice([0.0, 0.4]), aging_tokens_per_s=rng.choice([0.0, 10.0]),
                                **settings)
        now = rng.uniform(20, 60)
        assert admission_order(requests, policy, keys, now) == queue_order(requests, policy, keys, now)
