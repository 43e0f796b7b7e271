"""Predicted length distributions in the SGLang plugin (issue 27), in-process on SGLang 0.5.23's own classes
and stand-in requests (serve environment): the flags and their refusals, where quantiles come from (the
client, the running EAGLE-3 draft, a PD prefill), the waiting-queue order by every order key of the core,
the tail-safe class by a quantile, KV admission by a quantile, and ``meta_info``. On a real server:
tests/test_sglang_quantiles_server.py; the predictor-only and EAGLE-3 heads: tests/test_sglang_eagle3_draft.py.
"""

from __future__ import annotations

import math
import os
import random
from types import SimpleNamespace

import pytest

pytest.importorskip("sglang", reason="SGLang tests run in the serve environment (make test)")

from specforge_outlets.scheduling import (  # noqa: E402
    DEFAULT_QUANTILE_LEVELS, KVAdmission, LengthDistribution, OrderKey, QueuePolicy, SchedulingConfig, admission_order,
    predicted_output_budget, quantile_output_budget,
)
from sglang_patches import (  # noqa: E402
    kv_admission, meta_info, order_keys, ordering, pd_transfer, predictions as P, speculative, state,
)
from sglang_patches.client_predictions import assign_external_prediction  # noqa: E402
from sglang_patches.settings import (  # noqa: E402
    ENV_DRAFT, ENV_KV_ADMISSION, ENV_KV_QUANTILE, ENV_LONG_CLASS_QUANTILE, ENV_ORDER, ENV_ORDER_KEY, ENV_QUANTILE_LEVELS,
    QUANTILES_PARAM_KEY, OutletsSettingsError, read_settings,
)
from tests.sglang_harness.config_dirs import write_export, write_target  # noqa: E402
from tests.sglang_harness.stand_in import StandInReq, fresh_view, real_request, request  # noqa: E402
from tests.sglang_harness.fixtures import keep_logging, no_outlets_settings, plugins_loaded  # noqa: F401  (fixtures)
from tests.sglang_harness.request_input import generate_input  # noqa: E402

LEVELS = tuple(DEFAULT_QUANTILE_LEVELS)  # 0.1, 0.25, 0.5, 0.75, 0.9
TAILED = (3.0, 4.0, 6.0, 40.0, 2000.0)  # median 6, a long tail: Gittins serves it early, the risk key late
SURE = (148.0, 149.0, 150.0, 151.0, 152.0)


def use_env(monkeypatch, **values):
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    state.reset_settings()
    return state.settings()


# --- flags ------------------------------------------------------------------------------------------


def test_defaults_are_todays_behaviour():
    current = read_settings({})
    assert current.scheduling == SchedulingConfig()  # point key, no long-class quantile, the default levels
    assert current.scheduling.order_key is OrderKey.POINT and current.scheduling.long_class_quantile is None
    assert current.kv_admission is KVAdmission.SGLANG and current.order is QueuePolicy.TAIL_SAFE  # SGLang's admission
    assert (current.kv_margin, current.kv_quantile) == (0.2, 0.9)
    assert not current.scheduling.uses_distribution


def test_cli_carries_the_distribution_flags_to_spawned_processes(plugins_loaded, tmp_path):
    from sglang.srt.server_args import prepare_server_args

    prepare_server_args(["--model-path", str(tmp_path), "--schedule-policy", "outlets", "--outlets-order", "sjf",
                         "--outlets-order-key", "kv-footprint", "--outlets-kv-admission", "quantile",
                         "--outlets-kv-quantile", "0.8",
                         "--outlets-quantile-levels", "0.1,0.5,0.9"])
    assert (os.environ[ENV_ORDER_KEY], os.environ[ENV_KV_ADMISSION], os.environ[ENV_KV_QUANTILE],
            os.environ[ENV_QUANTILE_LEVELS]) == ("kv-footprint", "quantile", "0.8", "0.1,0.5,0.9")
    current = read_settings()
    assert current.scheduling.order_key is OrderKey.KV_FOOTPRINT and current.kv_quantile == 0.8
    assert current.scheduling.quantile_levels == (0.1, 0.5, 0.9) and current.order is QueuePolicy.SJF
    os.environ.pop(ENV_ORDER_KEY), os.environ.pop(ENV_ORDER)
    prepare_server_args(["--model-path", str(tmp_path), "--schedule-policy", "outlets",
                         "--outlets-long-class-quantile", "0.9"])
    assert read_settings().scheduling.long_class_quantile == 0.9


@pytest.mark.parametrize("env, message", [
    ({ENV_ORDER: "sjf", ENV_ORDER_KEY: "median"},
     r"--outlets-order-key\)='median': choose one of point, mean, risk, gittins, kv-footprint"),
    ({ENV_ORDER_KEY: "gittins"}, r"--outlets-order-key\)='gittins' sets what the sjf order sorts by.*--outlets-order sjf"),
    ({ENV_LONG_CLASS_QUANTILE: "1.5"}, r"--outlets-long-class-quantile\)='1.5': give a level strictly between 0 and 1"),
    ({ENV_LONG_CLASS_QUANTILE: "high"}, r"--outlets-long-class-quantile\)='high'"),
    ({ENV_ORDER: "sjf", ENV_LONG_CLASS_QUANTILE: "0.9"}, r"--outlets-long-class-quantile\) sets the tail-safe"),
    ({ENV_KV_QUANTILE: "0"}, r"--outlets-kv-quantile\)='0': give a level strictly between 0 and 1"),
    ({ENV_KV_ADMISSION: "predicted", ENV_KV_QUANTILE: "0.9"},
     r"--outlets-kv-quantile\) is read by --outlets-kv-admission quantile or peak, not by OUTLETS_KV_ADMISSION=predicted"),
    ({ENV_QUANTILE_LEVELS: "0.5,0.1"}, r"--outlets-quantile-levels\)='0.5,0.1': levels must be strictly increasing"),
    ({ENV_QUANTILE_LEVELS: "0.1,1.2"}, r"--outlets-quantile-levels\)='0.1,1.2': levels must be .*between 0 and 1"),
    ({ENV_QUANTILE_LEVELS: "low,high"}, r"--outlets-quantile-levels\)='low,high': not a comma-separated list"),
])
def test_bad_distribution_settings_are_refused_naming_the_flag(env, message):
    with pytest.raises(OutletsSettingsError, match=message):
        read_settings(env)


def test_a_bad_value_on_the_command_line_refuses_to_start(plugins_loaded, tmp_path, capsys):
    from sglang.srt.server_args import prepare_server_args

    with pytest.raises(SystemExit):
        prepare_server_args(["--model-path", str(tmp_path), "--schedule-policy", "outlets",
                             "--outlets-order-key", "risk"])
    assert "error: OUTLETS_ORDER_KEY (--outlets-order-key)='risk' sets what the sjf order sorts by" in (
        capsys.readouterr().err)
    with pytest.raises(SystemExit):
        prepare_server_args(["--model-path", str(tmp_path), "--outlets-kv-quantile", "lots"])
    assert "--outlets-kv-quantile: invalid float value: 'lots'" in capsys.readouterr().err


def test_the_levels_are_the_drafts_when_it_has_a_quantile_head(tmp_path):
    head = write_export(tmp_path / "head", levels=(0.2, 0.5, 0.8))
    plain = write_export(tmp_path / "plain")
    assert read_settings({ENV_DRAFT: head}).scheduling.quantile_levels == (0.2, 0.5, 0.8)
    assert read_settings({ENV_DRAFT: head, ENV_QUANTILE_LEVELS: "0.2,0.5,0.8"}).scheduling.quantile_levels == (
        0.2, 0.5, 0.8)
    assert read_settings({ENV_DRAFT: plain}).scheduling.quantile_levels == LEVELS
    assert read_settings({ENV_DRAFT: plain, ENV_QUANTILE_LEVELS: "0.3,0.6"}).scheduling.quantile_levels == (0.3, 0.6)
    with pytest.raises(OutletsSettingsError, match=r"--outlets-quantile-levels\)='0.1,0.5,0.9' differs from the "
                                                   r"quantile levels of --outlets-draft-path .*head, 0.2,0.5,0.8"):
        read_settings({ENV_DRAFT: head, ENV_QUANTILE_LEVELS: "0.1,0.5,0.9"})


def test_a_level_mismatch_with_the_draft_refuses_to_start_in_both_draft_modes(plugins_loaded, tmp_path, capsys):
    from sglang.srt.server_args import prepare_server_args

    export = write_export(tmp_path / "export", levels=(0.2, 0.5, 0.8))
    target = write_target(tmp_path / "target")
    with pytest.raises(SystemExit):
        prepare_server_args(["--model-path", target, "--outlets-draft-path", export, "--disable-radix-cache",
                             "--schedule-policy", "outlets", "--outlets-quantile-levels", "0.1,0.5,0.9"])
    assert "differs from the quantile levels of --outlets-draft-path" in capsys.readouterr().err
    os.environ.pop(ENV_QUANTILE_LEVELS), os.environ.pop(ENV_DRAFT)
    eagle3 = ["--model-path", target, "--schedule-policy", "outlets", "--speculative-algorithm", "EAGLE3",
              "--speculative-draft-model-path", export]
    with pytest.raises(SystemExit):
        prepare_server_args(eagle3 + ["--outlets-quantile-levels", "0.1,0.5,0.9"])
    assert "differs from the quantile levels of --speculative-draft-model-path" in capsys.readouterr().err
    os.environ.pop(ENV_QUANTILE_LEVELS)
    prepare_server_args(eagle3)  # EAGLE-3 mode: the draft's levels reach every process through the environment
    assert read_settings().scheduling.quantile_levels == (0.2, 0.5, 0.8)


def test_eagle3_mode_refuses_a_draft_at_other_levels_than_the_servers(monkeypatch):
    """``sglang.Engine`` users have no command line: the draft worker's hook checks the levels."""
    draft = SimpleNamespace(outlets_config=SimpleNamespace(quantile_levels=(0.2, 0.5, 0.8)))
    with pytest.raises(OutletsSettingsError, match=r"predicts at levels 0.2,0.5,0.8, the server's quantile levels "
                                                   r"are 0.1,0.25,0.5,0.75,0.9: set OUTLETS_QUANTILE_LEVELS"):
        speculative.check_draft_levels(draft)
    use_env(monkeypatch, **{ENV_QUANTILE_LEVELS: "0.2,0.5,0.8"})
    speculative.check_draft_levels(draft)
    speculative.check_draft_levels(SimpleNamespace(outlets_config=SimpleNamespace(quantile_levels=None)))


# --- the client's quantiles ---------------------------------------------------------------------------


def scheduled(sampling_params: dict, config: SchedulingConfig):
    """A stand-in request carrying SGLang's ``SamplingParams`` of the body, after the scheduler's arrival hook."""
    from sglang.srt.sampling.sampling_params import SamplingParams

    req = StandInReq(rid="s", output_ids=[], customized_info=None, sampling_params=SamplingParams(**sampling_params))
    assign_external_prediction(req, config)
    return req


def test_client_quantiles_in_custom_params_or_labels_reach_the_request(plugins_loaded, monkeypatch):
    monkeypatch.setattr(state, "plugin_active", lambda: True)
    config = SchedulingConfig()
    direct = generate_input({"custom_params": {QUANTILES_PARAM_KEY: [10, 20, 40, 80, 160]}})
    labelled = generate_input({}, {QUANTILES_PARAM_KEY: "10,20,40,80,160", "team": "a"})  # through the router
    assert labelled.custom_labels == {"team": "a"}
    for obj in (direct, labelled):
        req = scheduled(obj.sampling_params, config)
        assert P.predicted_output_quantiles(req) == (10.0, 20.0, 40.0, 80.0, 160.0)
        # without a point prediction, the point is their median (the level 0.5 here)
        assert P.predicted_output_len(req) == pytest.approx(40.0) and P.prediction(req).source == "external"
        assert req.customized_info["predicted_output_quantiles"] == [[10.0, 20.0, 40.0, 80.0, 160.0]]
    both = scheduled(generate_input({"custom_params": {"outlets_predicted_output_len": 30,
                                                       QUANTILES_PARAM_KEY: "[10, 20, 40, 80, 160]"}}).sampling_params,
                     config)
    assert (P.predicted_output_len(both), P.predicted_output_quantiles(both)) == (30.0, (10.0, 20.0, 40.0, 80.0, 160.0))
    point = scheduled(generate_input({"custom_params": {"outlets_predicted_output_len": 30}}).sampling_params, config)
    assert (P.predicted_output_len(point), P.predicted_output_quantiles(point)) == (30.0, None)  # a point mass
    assert not assign_external_prediction(request("none"), config)


@pytest.mark.parametrize("value, reason", [
    ([10, 20, 40], r"3 values for the server's 5 quantile levels \(0.1,0.25,0.5,0.75,0.9\)"),
    ([10, 20, 40, 30, 160], "the quantiles decrease"),
    ([10, 20, 0, 80, 160], "0 is not a positive number of tokens"),
    ([10, 20, -4, 80, 160], "-4 is not a positive number of tokens"),
    ([10, 20, "nan", 80, 160], "'nan' is not a positive number of tokens"),
    ([10, 20, True, 80, 160], "True is not a number"),
    ("10,20,forty,80,160", "'forty' is not a number"),
    (42, "not a list of token counts"),
])
def test_malformed_client_quantiles_are_refused_naming_the_request(plugins_loaded, monkeypatch, value, reason):
    monkeypatch.setattr(state, "plugin_active", lambda: True)
    with pytest.raises(ValueError, match=rf"request q-1: {QUANTILES_PARAM_KEY} = .* is not usable \({reason}"):
        generate_input({"custom_params": {QUANTILES_PARAM_KEY: value}}, rid="q-1")
    if isinstance(value, list):  # the same through custom_labels, as sglang-router sends it
        with pytest.raises(ValueError, match=rf"request q-2: {QUANTILES_PARAM_KEY} = .* is not usable"):
            generate_input({}, {QUANTILES_PARAM_KEY: ",".join(map(str, value))}, rid="q-2")
    with pytest.raises(ValueError, match="request b: "):
        generate_input([{}, {"custom_params": {QUANTILES_PARAM_KEY: value}}], text=["x", "y"], rid=["a", "b"])
    # a scheduler that gets one anyway (no tokenizer check in front of it) falls back to the prior, counted
    before = state.PLUGIN.fallbacks.count
    req = request("bad", custom={QUANTILES_PARAM_KEY: value})
    assert assign_external_prediction(req, SchedulingConfig())
    assert P.prediction(req).source == "prior" and P.predicted_output_quantiles(req) is None
    assert state.PLUGIN.fallbacks.count == before + 1


def test_without_an_outlets_feature_client_quantiles_are_not_read(plugins_loaded, monkeypatch):
    monkeypatch.setattr(state, "plugin_active", lambda: False)
    obj = generate_input({}, {QUANTILES_PARAM_KEY: "1,2"})
    assert obj.sampling_params["custom_params"] == {QUANTILES_PARAM_KEY: "1,2"}


def test_client_quantiles_are_checked_against_the_servers_levels(plugins_loaded, monkeypatch):
    monkeypatch.setattr(state, "plugin_active", lambda: True)
    use_env(monkeypatch, **{ENV_QUANTILE_LEVELS: "0.1,0.5,0.9"})
    generate_input({"custom_params": {QUANTILES_PARAM_KEY: [5, 10, 20]}})
    with pytest.raises(ValueError, match=r"5 values for the server's 3 quantile levels \(0.1,0.5,0.9\)"):
        generate_input({"custom_params": {QUANTILES_PARAM_KEY: [5, 10, 20, 30, 40]}})


# --- the waiting-queue order -------------------------------------------------------------------------


def make_policy(monkeypatch):
    from sglang.srt.managers import schedule_policy
    from sglang.srt.managers.schedule_policy import SchedulePolicy

    monkeypatch.setattr(schedule_policy, "get_disagg", lambda: SimpleNamespace(disaggregation_mode="null"))
    monkeypatch.setattr(schedule_policy, "get_memory", lambda: SimpleNamespace(radix_eviction_policy="lru"))
    tree_cache = SimpleNamespace(disable=True, supports_fast_match_prefix=lambda: False,
                                 supports_prefix_sharing=lambda: False)
    return SchedulePolicy("outlets", tree_cache, False, False, False)


def test_each_order_key_orders_sglangs_queue_as_the_core_says(plugins_loaded, monkeypatch):
    """A sure 150, a likely-short heavy tail, a point prediction, the prior: every key through SGLang's calc_priority."""
    orders = {}
    for key in OrderKey:
        use_env(monkeypatch, **{ENV_ORDER: "sjf", ENV_ORDER_KEY: key.value, "OUTLETS_AGING_TOKENS_PER_S": "0"})
        policy = make_policy(monkeypatch)
        queue = [request("sure", 150.0, SURE, arrival=1.0), request("tailed", 6.0, TAILED, arrival=2.0),
                 request("point", 100.0, arrival=3.0, prompt_len=3000), request("prior", arrival=4.0)]
        expected = [view.rid for view in admission_order([fresh_view(r) for r in queue], QueuePolicy.SJF,
                                                         policy.outlets_config)]
        policy.calc_priority(queue)
        orders[key.value] = [r.rid for r in queue]
        assert orders[key.value] == expected, key
    assert orders["point"] == ["tailed", "point", "sure", "prior"]
    assert orders["gittins"][0] == "tailed" and orders["risk"][-1] == "tailed"  # the keys do differ
    assert orders["kv-footprint"].index("point") > orders["kv-footprint"].index("sure")  # its 3,000-token prompt


def test_the_tail_safe_class_by_an_upper_quantile(plugins_loaded, monkeypatch):
    """Median 6 but a q0.9 of 2,000: short by the point prediction, long by the 0.9 quantile."""
    for quantile, long_first in ((None, False), ("0.9", True)):
        env = {"OUTLETS_LONG_HOLDBACK": "0"}  # FCFS within and across the classes' heads: the class is what differs
        if quantile:
            env[ENV_LONG_CLASS_QUANTILE] = quantile
        use_env(monkeypatch, **env)
        config = state.settings().scheduling
        keys = order_keys.CachedOrderKeys(config)
        req = request("tailed", 6.0, TAILED)
        assert keys.predicted_long([req]) == ([req] if long_first else [])


@pytest.mark.parametrize("key", ["mean", "risk", "gittins", "kv-footprint"])
@pytest.mark.parametrize("order", ["sjf", "tail-safe"])
def test_cached_distribution_keys_order_as_keys_read_afresh_over_many_rounds(plugins_loaded, monkeypatch, key, order):
    """New arrivals with or without quantiles, new predictions while waiting, retractions with more tokens."""
    env = {ENV_ORDER: order, "OUTLETS_LONG_HOLDBACK": "0.3", "OUTLETS_LONG_OUTPUT_LEN": "500"}
    env.update({ENV_ORDER_KEY: key} if order == "sjf" else {ENV_LONG_CLASS_QUANTILE: "0.75"})
    use_env(monkeypatch, **env)
    config = state.settings().scheduling
    rng = random.Random(11)
    clock = [1000.0]
    monkeypatch.setattr(ordering, "time", SimpleNamespace(monotonic=lambda: clock[0]))

    def quantiles():
        if rng.random() < 0.3:
            return None
        return tuple(LengthDistribution.log_normal(rng.uniform(5, 900), rng.uniform(0, 1.5)).quantiles)

    def sglang_request(rid):
        q = quantiles()
        return real_request(rid, rng.choice([None, rng.uniform(1, 900)]) if q is None else q[2], q,
                            arrival=round(clock[0] - rng.uniform(0, 3), 1), prompt_len=rng.randint(1, 4000))

    queue, count = [], 0
    for _ in range(40):
        clock[0] += rng.uniform(0, 2)
        for _ in range(rng.randint(0, 12)):
            count += 1
            queue.append(sglang_request(str(count)))
        for req in rng.sample(queue, k=min(3, len(queue))):
            if rng.random() < 0.5:  # a new prediction with (or without) new quantiles while it waits
                q = quantiles()
                P.set_predicted_output_len(req, rng.uniform(1, 900) if q is None else q[2], "draft", q)
            else:  # admitted, ran, retracted (SGLang's own reset), back with more tokens
                queue.remove(req)
                req.output_ids.extend([0] * rng.randint(1, 300))
                req.reset_for_retract()
                queue.append(req)
        expected = [view.rid for view in admission_order([fresh_view(r) for r in queue], QueuePolicy(order), config,
                                                         now=clock[0])]
        ordering.sort_waiting(queue, config)
        assert [r.rid for r in queue] == expected
        del queue[:rng.randint(0, 6)]


def test_a_distribution_key_is_computed_once_per_stay(plugins_loaded, monkeypatch):
    use_env(monkeypatch, **{ENV_ORDER: "sjf", ENV_ORDER_KEY: "gittins"})
    config = state.settings().scheduling
    calls = []
    real = order_keys.sjf_sort_key
    monkeypatch.setattr(order_keys, "sjf_sort_key", lambda *args: calls.append(args) or real(*args))
    queue = [request(str(i), 100.0 + i, tuple(LengthDistribution.log_normal(100.0 + i, 0.8).quantiles), arrival=i)
             for i in range(50)]
    for _ in range(3):
        ordering.sort_waiting(queue, config)
    assert len(calls) == 50
    P.set_predicted_output_len(queue[7], 5.0, "draft", (1.0, 2.0, 5.0, 9.0, 30.0))  # a new distribution: new key, one call
    ordering.sort_waiting(queue, config)
    assert len(calls) == 51 and queue[0].rid == "7"


# --- KV admission by a quantile ------------------------------------------------------------------------


def test_kv_admission_by_a_quantile_charges_the_cores_quantile_budget(plugins_loaded, monkeypatch):
    from sglang.srt.managers.schedule_policy import PrefillAdder

    monkeypatch.setattr(state, "schedule_policy_is_outlets", lambda: True)
    offset = PrefillAdder._get_running_request_total_token_offset
    adder = SimpleNamespace(new_token_ratio=0.5)
    wide = tuple(LengthDistribution.log_normal(300.0, 1.0).quantiles)
    running = request("wide", 300.0, wide, generated=100)
    point = request("point", 300.0, generated=100)
    use_env(monkeypatch, **{ENV_KV_ADMISSION: "predicted"})
    config = state.settings().scheduling
    margin_charge = predicted_output_budget(300.0, 100, 0.2, 3900, config)
    assert offset(adder, running) == offset(adder, point) == margin_charge == 240  # the charge: (300 - 100) x 1.2
    use_env(monkeypatch, **{ENV_KV_ADMISSION: "quantile", ENV_KV_QUANTILE: "0.9"})
    adder = SimpleNamespace(new_token_ratio=0.5)  # a new round: the strategy is kept on its PrefillAdder
    expected = quantile_output_budget(LengthDistribution(LEVELS, wide), 100, 0.9, 3900)
    assert offset(adder, running) == expected and expected > 600  # the wide distribution's upper tail
    assert offset(adder, point) == 200  # no quantiles: a point mass, its remaining without a margin
    assert offset(adder, request("unknown", None, generated=100)) == 0.5 * 3900  # no prediction: SGLang's
    use_env(monkeypatch, **{ENV_KV_ADMISSION: "quantile", ENV_KV_QUANTILE: "0.5"})
    adder = SimpleNamespace(new_token_ratio=0.5)
    assert offset(adder, running) == quantile_output_budget(LengthDistribution(LEVELS, wide), 100, 0.5, 3900)
    capped = request("capped", 300.0, wide, generated=100)
    capped.sampling_params.max_new_tokens = 150
    use_env(monkeypatch, **{ENV_KV_QUANTILE: "0.9"})
    adder = SimpleNamespace(new_token_ratio=0.5)
    assert offset(adder, capped) == 50  # at most what is left of max_new_tokens

    seen = []

    def original(adder, req, has_chunked_req, truncation_align_size):
        seen.append(req.sampling_params.max_new_tokens)

    waiting = request("waiting", 300.0, wide)
    kv_admission.add_one_req_around(original, adder, waiting, False, None)
    assert seen == [quantile_output_budget(LengthDistribution(LEVELS, wide), 0, 0.9, 4000)]
    assert waiting.sampling_params.max_new_tokens == 4000


# --- meta_info, EAGLE-3 re-reads, PD ----------------------------------------------------------------------


def test_meta_info_reports_the_latest_quantiles_as_one_list(plugins_loaded):
    meta = {"predicted_output_len": [None, 40.0], "predicted_output_quantiles": [None, [1.0, 2.0, 40.0, 50.0, 90.0]],
            "predicted_remaining_quantiles": [None, [0.0, 1.0, 30.0, 40.0, 80.0], None, [0.0, 0.0, 20.0, 30.0, 70.0]]}
    meta_info.update_meta_info_after(None, None, meta, None, {}, 0, None)
    assert meta == {"predicted_output_len": 40.0, "predicted_output_quantiles": [1.0, 2.0, 40.0, 50.0, 90.0],
                    "predicted_remaining_quantiles": [0.0, 0.0, 20.0, 30.0, 70.0]}
    meta_info.update_meta_info_after(None, None, meta, None, {}, 0, None)  # read again: unchanged
    assert meta["predicted_output_quantiles"] == [1.0, 2.0, 40.0, 50.0, 90.0]
    none = {"predicted_output_quantiles": [None, None]}
    meta_info.update_meta_info_after(None, None, none, None, {}, 0, None)
    assert none == {}


def step(reqs, estimates, quantiles, new_tokens):
    """One EAGLE-3 step through the auxiliary-output channel (device -> host copy -> consume after the commit)."""
    import torch
    from sglang.srt.managers.auxiliary_output import CommittedTokens

    z = torch.log1p(torch.tensor(estimates, dtype=torch.float32))
    zq = torch.log1p(torch.tensor(quantiles, dtype=torch.float32))
    host = speculative.DraftLengthEstimates(z, zq).copy_to_host(lambda tensor: tensor.clone())
    commits = []
    for req, n in zip(reqs, new_tokens):
        start = len(req.output_ids)
        req.output_ids += [7] * n
        commits.append(CommittedTokens(output_index=start, token_ids=tuple(req.output_ids[start:])) if n else None)
    host.consume(SimpleNamespace(reqs=reqs), commits)


def test_eagle3_quantiles_are_re_read_after_each_verify_step_and_refresh_the_keys(plugins_loaded, monkeypatch):
    use_env(monkeypatch, **{ENV_ORDER: "sjf", ENV_ORDER_KEY: "gittins", "OUTLETS_AGING_TOKENS_PER_S": "0"})
    config = state.settings().scheduling
    a, b = request("a"), request("b")
    step([a, b], [40.0, 40.0], [[2.0, 5.0, 40.0, 60.0, 900.0], [30.0, 35.0, 40.0, 45.0, 50.0]], new_tokens=[1, 1])
    # prefill: total quantiles = the remaining ones (the estimate counts the first token), reported beside r̂_0
    assert P.predicted_output_quantiles(a) == pytest.approx((2.0, 5.0, 40.0, 60.0, 900.0), rel=1e-5)
    assert a.customized_info["predicted_output_quantiles"][0] == pytest.approx([2.0, 5.0, 40.0, 60.0, 900.0])
    keys = order_keys.CachedOrderKeys(config)
    assert admission_order([b, a], QueuePolicy.SJF, config, keys=keys) == [a, b]  # a likely-short tail first
    # a verify step: a accepted 2 tokens (3 generated) and now looks long for sure; b 1 token (2 generated)
    step([a, b], [300.0, 10.0], [[290.0, 295.0, 300.0, 305.0, 310.0], [1.0, 2.0, 10.0, 20.0, 400.0]], new_tokens=[2, 1])
    assert P.predicted_output_quantiles(a) == pytest.approx((292.0, 297.0, 302.0, 307.0, 312.0), rel=1e-5)  # 2 + r_q
    assert P.predicted_output_quantiles(b) == pytest.approx((2.0, 3.0, 11.0, 21.0, 401.0), rel=1e-5)
    assert a.customized_info["predicted_remaining_quantiles"][2] == pytest.approx([289.0, 294.0, 299.0, 304.0, 309.0],
                                                                                   abs=2e-3)
    assert admission_order([a, b], QueuePolicy.SJF, config, keys=keys) == [b, a]  # the new quantiles, not the old keys
    # a draft whose quantiles come back not finite: the request keeps its last prediction and quantiles
    before = state.PLUGIN.fallbacks.count
    step([a], [5.0], [[1.0, 2.0, 3.0, float("inf"), float("inf")]], new_tokens=[1])
    assert P.predicted_output_quantiles(a) == pytest.approx((292.0, 297.0, 302.0, 307.0, 312.0), rel=1e-5)
    assert state.PLUGIN.fallbacks.count == before + 1
    client = request("client", 80.0, (10.0, 20.0, 80.0, 90.0, 99.0))  # the client's prediction wins
    step([client], [5.0], [[1.0, 2.0, 3.0, 4.0, 5.0]], new_tokens=[1])
    assert P.predicted_output_quantiles(client) == (10.0, 20.0, 80.0, 90.0, 99.0)


def test_a_prefill_instances_quantiles_ride_the_metadata_row_to_the_decode(plugins_loaded, monkeypatch):
    import torch
    from sglang.srt.disaggregation.utils import MetadataBuffers

    monkeypatch.setattr(state, "plugin_active", lambda: True)
    buffers = MetadataBuffers(3, hidden_size=8, hidden_states_dtype=torch.float32, max_sampling_mask_tokens=1)
    sent = StandInReq(rid="p0", metadata_buffer_index=0)
    P.set_predicted_output_len(sent, 40.0, "draft", (2.0, 5.0, 40.0, 60.0, 900.0))
    point = StandInReq(rid="p1", metadata_buffer_index=1)
    P.set_predicted_output_len(point, 40.0, "draft")
    for req in (sent, point):
        pd_transfer.set_buf_after(None, buffers, req)
    row = buffers.output_token_logprobs_val[0].tolist()
    assert row[0] == 0.0 and row[pd_transfer.QUANTILE_COUNT_SLOT] == 5 and row[pd_transfer.PREDICTION_SLOT] == 40.0
    assert buffers.output_token_logprobs_val[1, pd_transfer.QUANTILE_COUNT_SLOT].item() == 0
    monkeypatch.setattr(state, "schedule_policy_is_outlets", lambda: True)
    queue = SimpleNamespace(metadata_buffers=buffers)

    def arrive(index):
        req = StandInReq(rid=f"d{index}", finished_reason=None, sampling_params=None, output_ids=[], bootstrap_host="h")
        pd_transfer.commit_transfer_after(None, queue, SimpleNamespace(req=req, metadata_buffer_index=index))
        return req

    received = arrive(0)
    assert (P.predicted_output_len(received), P.prediction(received).source) == (40.0, "prefill")
    assert P.predicted_output_quantiles(received) == pytest.approx((2.0, 5.0, 40.0, 60.0, 900.0))
    assert P.predicted_output_quantiles(arrive(1)) is None and P.predicted_output_len(arrive(1)) == 40.0
    use_env(monkeypatch, **{ENV_QUANTILE_LEVELS: "0.1,0.5,0.9"})  # a decode at other levels keeps the point only
    other = arrive(0)
    assert P.predicted_output_len(other) == 40.0 and P.predicted_output_quantiles(other) is None
    assert math.isclose(pd_transfer.MAX_SENT_QUANTILES, 6)
