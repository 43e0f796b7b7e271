"""Unit tests of the OUTLETS SGLang plugin's hooks, in-process, without a server (serve environment).

SGLang logs and swallows exceptions raised while plugins load or hooks apply, so these tests
assert that every hook target is actually patched, then exercise each hook on SGLang's own
classes or on stand-in requests.
"""

from __future__ import annotations

import copy
import os
import random
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("sglang", reason="SGLang tests run in the serve environment (make test)")

from specforge_outlets.scheduling import (  # noqa: E402
    KVAdmission, PeakAdmission, QueuePolicy, SchedulingConfig, admission_order, aging_window_s, create_request_queue,
)
from sglang_patches import (  # noqa: E402
    customized_info, key_tables, kv_admission, meta_info, order_keys, ordering, predictions as P, routing, speculative,
    state,
)
from sglang_patches.client_predictions import assign_external_prediction  # noqa: E402
from tests.sglang_harness.config_dirs import write_export, write_target  # noqa: E402
from tests.sglang_harness.stand_in import fresh_view, real_request, request  # noqa: E402
from sglang_patches.settings import (  # noqa: E402
    ENV_AGING, ENV_DRAFT, ENV_KV_ADMISSION, ENV_KV_MARGIN, ENV_KV_QUANTILE, ENV_LONG_CLASS_SHARE, ENV_LONG_HOLDBACK,
    ENV_MAX_RETRACTIONS, ENV_ORDER, ENV_PRIOR, ENV_RANK_WINDOW, KV_ADMISSIONS, OutletsSettingsError, PluginSettings,
    read_settings, validate_draft_dir,
)
from tests.sglang_harness.fixtures import keep_logging, no_outlets_settings, plugins_loaded  # noqa: F401  (fixtures)


# --- discovery and hook application --------------------------------------------------------------


def test_entry_point_is_registered():
    from importlib.metadata import entry_points

    found = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert found.get("outlets") == "sglang_patches:load"


def test_every_hook_is_applied(plugins_loaded):
    from sglang_patches import registry

    exported = [target for area in registry.AREAS for target, _, _, _ in area.HOOK_TARGETS]
    assert len(exported) == len(set(exported)) == 27
    assert sorted(plugins_loaded) == sorted(state.registered_targets()) == sorted(exported)
    from sglang.srt.managers.schedule_policy import SchedulePolicy

    assert SchedulePolicy.calc_priority.__wrapped__ is not None


def without_hook(monkeypatch, target):
    """The registry as it is on an SGLang release where ``target`` no longer exists."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    monkeypatch.setattr(HookRegistry, "_patched", set(HookRegistry._patched) - {target})


def test_a_feature_whose_hook_did_not_apply_refuses_to_run_naming_it(plugins_loaded, monkeypatch):
    target = "sglang.srt.managers.schedule_policy.SchedulePolicy.calc_priority"
    without_hook(monkeypatch, target)
    with pytest.raises(OutletsSettingsError) as refused:
        state.check_hooks({state.ORDERING})
    assert target in str(refused.value) and "sglang==0.5.23" in str(refused.value)
    state.check_hooks({state.ROUTING})  # routing does not need it


def test_an_untested_sglang_release_refuses_outlets_features_only(plugins_loaded, monkeypatch, tmp_path, capsys):
    from sglang.srt.server_args import prepare_server_args

    monkeypatch.setattr(state, "installed_sglang_version", lambda: "0.6.0")
    with pytest.raises(OutletsSettingsError, match=r"SGLang 0\.6\.0 is installed, the plugin is tested with 0\.5\.23"):
        state.check_hooks({state.ROUTING})
    with pytest.raises(SystemExit):
        prepare_server_args(["--model-path", str(tmp_path), "--load-balance-method", "outlets"])
    assert "OUTLETS cannot run as asked" in capsys.readouterr().err
    stock = prepare_server_args(["--model-path", str(tmp_path), "--schedule-policy", "lof"])  # no OUTLETS flag
    assert stock.schedule_policy == "lof"


def test_the_scheduler_refuses_the_outlets_policy_without_its_hooks(plugins_loaded, monkeypatch):
    without_hook(monkeypatch, "sglang.srt.managers.schedule_batch.ScheduleBatch._get_decode_retraction_order")
    with pytest.raises(OutletsSettingsError, match="_get_decode_retraction_order"):
        make_policy("outlets")
    assert make_policy("fcfs").outlets_config is None


# --- command line ----------------------------------------------------------------------------------


def test_cli_accepts_outlets_and_carries_settings_to_spawned_processes(plugins_loaded, tmp_path, monkeypatch):
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(["--model-path", str(tmp_path), "--schedule-policy", "outlets",
                                "--load-balance-method", "outlets", "--outlets-prior-output-len", "100",
                                "--outlets-aging-tokens-per-s", "2.5", "--outlets-order", "sjf",
                                "--outlets-long-output-len", "500", "--outlets-long-holdback", "0.3"])
    assert args.schedule_policy == "outlets" and args.load_balance_method == "outlets"
    assert os.environ[ENV_PRIOR] == "100.0" and os.environ[ENV_AGING] == "2.5" and os.environ[ENV_ORDER] == "sjf"
    current = read_settings()
    assert current.scheduling == SchedulingConfig(prior_output_len=100.0, aging_tokens_per_s=2.5,
                                                  long_output_len=500.0, long_holdback=0.3)
    assert current.order is QueuePolicy.SJF


@pytest.mark.parametrize("flags, unread", [
    (["--outlets-order", "sjf", "--outlets-kv-admission", "predicted"],
     ["--outlets-order (OUTLETS_ORDER) is read by --schedule-policy outlets",
      "--outlets-kv-admission (OUTLETS_KV_ADMISSION) is read by --schedule-policy outlets"]),
    (["--schedule-policy", "fcfs", "--outlets-prior-output-len", "100"],
     ["--outlets-prior-output-len (OUTLETS_PRIOR_OUTPUT_LEN) is read by --load-balance-method outlets or "
      "--schedule-policy outlets"]),
    (["--load-balance-method", "outlets", "--outlets-long-holdback", "0"],  # the router reads no queue order
     ["--outlets-long-holdback (OUTLETS_LONG_HOLDBACK) is read by --schedule-policy outlets"]),
])
def test_outlets_flags_no_asked_feature_reads_refuse_to_start(plugins_loaded, tmp_path, capsys, flags, unread):
    """Today's silent case: the flags parse, and SGLang runs its own policy (FCFS) with no word."""
    from sglang.srt.server_args import prepare_server_args

    with pytest.raises(SystemExit):
        prepare_server_args(["--model-path", str(tmp_path), *flags])
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: ") and "\n" not in error, error
    assert "; ".join(unread) + ", but this server runs " in error, error
    assert "add the feature named (e.g. --schedule-policy outlets), or leave the flag out" in error, error


def test_an_exported_outlets_variable_without_the_policy_refuses_to_start(plugins_loaded, tmp_path, capsys,
                                                                          monkeypatch):
    from sglang.srt.server_args import prepare_server_args

    monkeypatch.setenv(ENV_ORDER, "sjf")  # left in the shell from an outlets server
    with pytest.raises(SystemExit):
        prepare_server_args(["--model-path", str(tmp_path), "--schedule-policy", "lpm"])
    assert ("error: --outlets-order (OUTLETS_ORDER) is read by --schedule-policy outlets, but this server runs no "
            "OUTLETS feature (stock SGLang), which would ignore it silently") in capsys.readouterr().err
    # accepted with the feature that reads it
    prepare_server_args(["--model-path", str(tmp_path), "--schedule-policy", "outlets"])
    monkeypatch.delenv(ENV_ORDER)
    prepare_server_args(["--model-path", str(tmp_path), "--load-balance-method", "outlets",
                         "--outlets-prior-output-len", "100", "--outlets-quantile-levels", "0.1,0.5,0.9"])


def test_every_setting_but_the_draft_path_names_the_features_that_read_it():
    from sglang_patches.settings import FLAGS
    from sglang_patches.setting_readers import READERS

    assert set(READERS) == {variable for _, _, variable, _, _ in FLAGS} - {ENV_DRAFT}


def test_cli_still_rejects_unknown_policies(plugins_loaded, tmp_path, capsys):
    from sglang.srt.server_args import prepare_server_args

    with pytest.raises(SystemExit):
        prepare_server_args(["--model-path", str(tmp_path), "--schedule-policy", "sjf"])
    assert "invalid choice" in capsys.readouterr().err


def test_missing_or_wrong_draft_directory_refuses_to_start(plugins_loaded, tmp_path, capsys):
    from sglang.srt.server_args import prepare_server_args

    with pytest.raises(SystemExit):
        prepare_server_args(["--model-path", str(tmp_path), "--outlets-draft-path", str(tmp_path / "nope")])
    assert "no such directory" in capsys.readouterr().err
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"]}')
    with pytest.raises(OutletsSettingsError, match="not an OUTLETS draft"):
        validate_draft_dir(str(tmp_path / "plain"))


def test_bad_settings_are_refused(monkeypatch):
    monkeypatch.setenv(ENV_PRIOR, "-1")
    with pytest.raises(OutletsSettingsError, match="prior_output_len"):
        read_settings()
    monkeypatch.setenv(ENV_PRIOR, "abc")
    with pytest.raises(OutletsSettingsError, match="not a number"):
        read_settings()
    monkeypatch.delenv(ENV_PRIOR)
    monkeypatch.setenv(ENV_LONG_HOLDBACK, "-0.5")
    with pytest.raises(OutletsSettingsError, match="long_holdback"):
        read_settings()
    monkeypatch.delenv(ENV_LONG_HOLDBACK)
    for bad, message in (("two", "not an integer"), ("0", "max_retractions must be a positive integer")):
        monkeypatch.setenv(ENV_MAX_RETRACTIONS, bad)
        with pytest.raises(OutletsSettingsError, match=message):
            read_settings()
    monkeypatch.delenv(ENV_MAX_RETRACTIONS)
    monkeypatch.setenv(ENV_ORDER, "fcfs")
    with pytest.raises(OutletsSettingsError, match=r"--outlets-order.*'fcfs': choose one of tail-safe, sjf, "
                                                   r"tail-safe-ranks, longest-predicted-first$"):
        read_settings()
    monkeypatch.setenv(ENV_ORDER, "tail-safe")
    for name, value in ((ENV_LONG_CLASS_SHARE, "0.3"), (ENV_RANK_WINDOW, "50")):
        monkeypatch.setenv(name, value)
        with pytest.raises(OutletsSettingsError, match=rf"^{name} \(--outlets-.*\) sets the tail-safe-ranks order's "
                                                       "long class, but the order is tail-safe"):
            read_settings()
        monkeypatch.delenv(name)
    monkeypatch.setenv(ENV_ORDER, "tail-safe-ranks")
    for name, value, message in ((ENV_LONG_CLASS_SHARE, "1", "long_class_share must be strictly between 0 and 1"),
                                 (ENV_RANK_WINDOW, "0", "rank_window must be a positive integer"),
                                 (ENV_RANK_WINDOW, "2.5", "is not an integer")):
        monkeypatch.setenv(name, value)
        with pytest.raises(OutletsSettingsError, match=message):
            read_settings()
        monkeypatch.delenv(name)
    monkeypatch.setenv(ENV_LONG_CLASS_SHARE, "0.3")
    monkeypatch.setenv(ENV_RANK_WINDOW, "50")
    assert read_settings().scheduling == SchedulingConfig(long_class_share=0.3, rank_window=50)


def test_default_order_is_tail_safe():
    assert read_settings().order is QueuePolicy.TAIL_SAFE

# --- the waiting queue -------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def no_runtime_context(monkeypatch):
    """The scheduler's runtime context (published by a running server) as a stock CPU server has it."""
    from sglang.srt.managers import schedule_policy

    monkeypatch.setattr(schedule_policy, "get_disagg", lambda: SimpleNamespace(disaggregation_mode="null"))
    monkeypatch.setattr(schedule_policy, "get_memory", lambda: SimpleNamespace(radix_eviction_policy="lru"))


def make_policy(name):
    from sglang.srt.managers.schedule_policy import SchedulePolicy

    tree_cache = SimpleNamespace(disable=True, supports_fast_match_prefix=lambda: False,
                                 supports_prefix_sharing=lambda: False)
    return SchedulePolicy(name, tree_cache, False, False, False)


def test_outlets_policy_tail_safe_keeps_classes_fcfs_and_holds_long_requests_back_briefly(plugins_loaded):
    policy = make_policy("outlets")
    assert policy.outlets_config == read_settings().scheduling
    now = time.monotonic()
    # The long request has waited 100 s: at the default hold-back (0.05) short requests that arrived
    # within 5 s after it go first, later ones do not. Each class stays FCFS; no prediction = the prior (short).
    queue = [request("long", 5000, arrival=now - 100), request("short-late", 20, arrival=now - 85),
             request("long-2", 900, arrival=now - 99), request("short-early", 700, arrival=now - 96),
             request("unknown", None, arrival=now - 97)]
    policy.calc_priority(queue)
    assert [r.rid for r in queue] == ["unknown", "short-early", "long", "long-2", "short-late"]


def test_outlets_policy_sjf_sorts_by_predicted_remaining_with_ties_by_arrival(plugins_loaded, monkeypatch):
    monkeypatch.setenv(ENV_ORDER, "sjf")
    policy = make_policy("outlets")
    assert policy.outlets_config == read_settings().scheduling
    queue = [request("a", 300, arrival=1.0), request("b", 20, arrival=2.0), request("c", None, arrival=3.0),
             request("d", 20, arrival=1.5), request("e", 500, arrival=0.0, generated=450)]
    policy.calc_priority(queue)
    # e: 50 left; d and b: 20 (d arrived first); c: the prior (256); a: 300
    assert [r.rid for r in queue] == ["d", "b", "e", "c", "a"]


@pytest.fixture
def no_key_tables(monkeypatch):
    """No order keys (nor a tail-safe-ranks window) left from another test."""
    monkeypatch.setattr(state.PLUGIN, "key_tables", {})
    monkeypatch.setattr(state.PLUGIN, "order_keys", None)


def test_outlets_policy_tail_safe_ranks_by_hand(plugins_loaded, monkeypatch, no_key_tables):
    """tests/test_scheduling.py's RANKED timeline (the arithmetic is there): the plugin's sort admits as the core."""
    from tests.test_scheduling import RANKED, RANKED_ORDER

    for name, value in ((ENV_ORDER, "tail-safe-ranks"), (ENV_LONG_HOLDBACK, "0.5"), (ENV_LONG_CLASS_SHARE, "0.25"),
                        (ENV_RANK_WINDOW, "4"), (ENV_PRIOR, "100")):
        monkeypatch.setenv(name, value)
    state.reset_settings()
    monkeypatch.setattr(ordering, "time", SimpleNamespace(monotonic=lambda: 10.0))
    policy = make_policy("outlets")
    queue = [request(r.name, r.predicted_output_len, arrival=r.arrival_time) for r in RANKED]
    policy.calc_priority(queue)
    assert [r.rid for r in queue] == RANKED_ORDER  # d and h (ranked long) held back; all are below 800


def test_outlets_policy_longest_predicted_first_by_hand(plugins_loaded, monkeypatch, no_key_tables):
    monkeypatch.setenv(ENV_ORDER, "longest-predicted-first")
    state.reset_settings()
    policy = make_policy("outlets")
    queue = [request("a", 300, arrival=0.0), request("unknown-b", None, arrival=1.0), request("c", 900, arrival=2.0),
             request("d", 900, arrival=3.0), request("nearly-done-e", 500, arrival=4.0, generated=450)]
    policy.calc_priority(queue)
    # remaining: c and d 900 (c arrived first), a 300, b the prior (256), e 50
    assert [r.rid for r in queue] == ["c", "d", "a", "unknown-b", "nearly-done-e"]


def test_tail_safe_ranks_plugin_order_equals_the_core_queue_over_many_rounds(plugins_loaded, monkeypatch,
                                                                            no_key_tables):
    """The window and each request's class outlive the rounds as in the core's queue: arrivals, admissions and
    retracted requests coming back with more tokens (each a new entry in the window)."""
    for name, value in ((ENV_ORDER, "tail-safe-ranks"), (ENV_LONG_HOLDBACK, "0.3"), (ENV_RANK_WINDOW, "40")):
        monkeypatch.setenv(name, value)
    state.reset_settings()
    config = state.settings().scheduling
    core = create_request_queue(QueuePolicy.TAIL_SAFE_RANKS, config)
    rng = random.Random(5)
    clock = [1000.0]
    monkeypatch.setattr(ordering, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    queue, admitted, count, long_seen = [], [], 0, 0
    for _ in range(60):
        clock[0] += rng.uniform(0, 2)
        joining = [real_request(str(count + i), rng.choice([None, rng.uniform(1, 700)]),
                                arrival=clock[0] - rng.uniform(0, 3)) for i in range(rng.randint(0, 12))]
        count += len(joining)
        for req in rng.sample(admitted, k=min(2, len(admitted))):  # retracted: back with more tokens, new keys
            admitted.remove(req)
            req.output_ids.extend([0] * rng.randint(1, 300))
            req.reset_for_retract()
            joining.append(req)
        for req in joining:  # SGLang appends to its waiting list
            queue.append(req)
            core.add_request(fresh_view(req))
        expected = [view.rid for view in drain_core(copy.deepcopy(core), clock[0])]
        ordering.sort_waiting(queue, config)
        assert [r.rid for r in queue] == expected
        long_seen += sum(state.PLUGIN.key_tables[config].rank_long[r] for r in queue)
        taken = rng.randint(0, 8)
        for _ in range(min(taken, len(queue))):
            core.pop_request(clock[0])
        admitted += queue[:taken]
        del queue[:taken]
    assert long_seen > 0  # predictions all below 800: only the ranks make a long class


def drain_core(queue, now):
    return [queue.pop_request(now) for _ in range(len(queue))]


@pytest.mark.parametrize("slack", [None, 5])
@pytest.mark.parametrize("order", ["sjf", "tail-safe", "longest-predicted-first"])
def test_cached_keys_order_as_keys_read_afresh_over_many_rounds(plugins_loaded, monkeypatch, order, slack):
    """Cached keys never go stale: new arrivals, admissions, late predictions, retractions; the table stays bounded."""
    if slack is not None:  # the key table is cut back to the queue almost every round
        monkeypatch.setattr(key_tables, "KEY_TABLE_SLACK", slack)
    monkeypatch.setenv(ENV_ORDER, order)
    monkeypatch.setenv(ENV_LONG_HOLDBACK, "0.3")
    state.reset_settings()
    config = state.settings().scheduling
    rng = random.Random(7)
    clock = [1000.0]
    monkeypatch.setattr(ordering, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    queue, count = [], 0
    for _ in range(60):
        clock[0] += rng.uniform(0, 2)
        for _ in range(rng.randint(0, 25)):  # arrivals, with or without an external prediction
            count += 1
            new = real_request(str(count), rng.choice([None, rng.uniform(1, 700), rng.uniform(800, 4000)]),
                                 arrival=round(clock[0] - rng.uniform(0, 3), 1))
            queue.insert(rng.choice([len(queue), 0]), new)  # SGLang appends; a yielded prefill goes first
        for req in rng.sample(queue, k=min(4, len(queue))):
            if rng.random() < 0.5:  # a prediction arrives while the request waits
                P.set_predicted_output_len(req, rng.uniform(1, 3000), "draft")
            else:  # admitted, ran, retracted (SGLang's own reset), back in the queue with more tokens
                queue.remove(req)
                req.output_ids.extend([0] * rng.randint(1, 900))
                req.reset_for_retract()
                queue.append(req)
        fresh = [fresh_view(r) for r in queue]
        expected = [view.rid for view in admission_order(fresh, QueuePolicy(order), config, now=clock[0])]
        ordering.sort_waiting(queue, config)
        assert [r.rid for r in queue] == expected
        table = state.PLUGIN.key_tables[config]
        longest = max(map(len, (table.sjf, table.longest, table.long, table.merge, table.arrival)))
        assert longest <= len(queue) + key_tables.KEY_TABLE_SLACK
        del queue[:rng.randint(0, 10)]  # admitted


@pytest.mark.parametrize("order", ["sjf", "tail-safe", "longest-predicted-first"])
def test_keys_are_computed_once_per_request_while_it_waits(plugins_loaded, monkeypatch, order):
    monkeypatch.setenv(ENV_ORDER, order)
    monkeypatch.setenv(ENV_AGING, "0")
    state.reset_settings()
    config = state.settings().scheduling
    calls = []
    key = {"sjf": "sjf_sort_key", "tail-safe": "is_predicted_long",  # the keys each order computes
           "longest-predicted-first": "longest_first_sort_key"}[order]
    real = getattr(order_keys, key)
    monkeypatch.setattr(order_keys, key, lambda *args: calls.append(args) or real(*args))
    monkeypatch.setattr(ordering, "time", SimpleNamespace(monotonic=lambda: 300.0))
    queue = [request(str(i), float(1000 - i), arrival=float(i)) for i in range(200)]
    ordering.sort_waiting(queue, config)
    assert len(calls) == 200
    queue.append(request("new", 5.0, arrival=199.5))
    ordering.sort_waiting(queue, config)
    ordering.sort_waiting(queue, config)
    assert len(calls) == 201
    # sjf: the shortest first; tail-safe: all but the new one are long, so the oldest is held back
    # by 5% of its 300 s wait, less than "new" arrived after it; longest-first: the longest, "0"
    assert queue[0].rid == ("new" if order == "sjf" else "0")


def test_stock_policies_are_untouched(plugins_loaded):
    policy = make_policy("fcfs")
    assert policy.outlets_config is None
    queue = [request("a", 300), request("b", 20)]
    policy.calc_priority(queue)
    assert [r.rid for r in queue] == ["a", "b"]


def test_aging_bound_holds_in_the_plugins_order(plugins_loaded, monkeypatch):
    """A request predicted to need R tokens is overtaken only by arrivals within (R - 1) / rate s."""
    monkeypatch.setenv(ENV_AGING, "10")
    monkeypatch.setenv(ENV_ORDER, "sjf")
    state.reset_settings()
    policy = make_policy("outlets")
    config = policy.outlets_config
    window = aging_window_s(1000.0, config)  # 99.9 s
    for delay, overtaken in ((window - 0.5, True), (window + 0.5, False)):
        queue = [request("long", 1000, arrival=0.0), request("short", 1, arrival=delay)]
        policy.calc_priority(queue)
        assert (queue[0].rid == "short") is overtaken, (delay, [r.rid for r in queue])


def test_external_prediction_and_fallback_counter(plugins_loaded):
    config = read_settings().scheduling
    ok = request("ok", custom={"outlets_predicted_output_len": 12})
    assert assign_external_prediction(ok, config) and P.predicted_output_len(ok) == 12.0
    assert ok.customized_info == {"predicted_output_len": [12.0]}
    before = state.PLUGIN.fallbacks.count
    for bad in ("x", float("nan"), -1, True):
        req = request("bad", custom={"outlets_predicted_output_len": bad})
        assert assign_external_prediction(req, config)
        assert P.predicted_output_len(req) == config.prior_output_len and P.prediction(req).source == "prior"
    assert state.PLUGIN.fallbacks.count == before + 4
    none = request("none", custom={"other": 1})
    assert not assign_external_prediction(none, config) and P.predicted_output_len(none) is None


def test_a_request_scheduled_on_the_prior_is_counted_once(plugins_loaded, monkeypatch):
    """outlets_requests_on_prior_total: a request without a prediction where no predictor will make one, once
    (not again when it is retracted and queued again); not one with its own prediction, nor one a PD decode
    instance waits for the prefill's prediction for (pd_transfer counts a transfer without one)."""
    counted = []
    monkeypatch.setattr(state.metrics(), "served_on_prior", lambda: counted.append(1))
    monkeypatch.setattr(state, "plugin_active", lambda: True)
    monkeypatch.setattr(state.PLUGIN, "speculative_predictions", False)
    colocated, decode = SimpleNamespace(disaggregation_mode=None), SimpleNamespace(disaggregation_mode="decode")

    def arriving(custom=None):
        req = request("r", custom=custom)
        P.record(req).arrival = None  # not queued yet
        return req

    unpredicted = arriving()
    ordering.add_request_to_queue_before(colocated, unpredicted)
    ordering.add_request_to_queue_before(colocated, unpredicted)  # retracted, queued again
    ordering.add_request_to_queue_before(colocated, arriving({"outlets_predicted_output_len": 12}))
    ordering.add_request_to_queue_before(decode, arriving())
    assert len(counted) == 1
    P.fall_back_to_prior(arriving(), read_settings().scheduling, "a failed prediction")
    assert len(counted) == 2


# --- retraction, meta_info, load snapshots, routing ----------------------------------------------------


def test_retraction_retracts_the_longest_predicted_remaining_first(plugins_loaded, monkeypatch):
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    reqs = [request("a", 100, generated=10), request("b", 30), request("c", 500, generated=100), request("d", None),
            request("e-late", 30, arrival=5.0), request("f-twice", 5000)]
    reqs[-1].retraction_count = 2  # at the default limit: kept while others can go
    monkeypatch.setattr(state, "schedule_policy_is_outlets", lambda: True)
    order = ScheduleBatch._get_decode_retraction_order(reqs)
    # most preferred to keep first; SGLang pops from the end: c (400 left) goes first, then d (256);
    # of b and e-late (30 left each) the later arrival is retracted first
    assert [reqs[i].rid for i in order] == ["f-twice", "b", "e-late", "a", "d", "c"]
    monkeypatch.setattr(state, "schedule_policy_is_outlets", lambda: False)
    from sglang.srt.managers import schedule_batch

    monkeypatch.setattr(schedule_batch, "get_schedule", lambda: SimpleNamespace(retraction_policy="length"))
    for req in reqs:
        req.origin_input_ids = [1, 2]
    assert ScheduleBatch._get_decode_retraction_order(reqs) == [2, 0, 1, 3, 4, 5]  # stock: longest output kept


# --- EAGLE-3 mode: the draft's estimates reach the requests and every reader ---------------------------


def decoding(rid, output_len, predicted_output_len=None, arrival=0.0):
    req = request(rid, predicted_output_len, arrival=arrival, generated=output_len)
    req.finished = lambda: False
    return req


def commit(req, new_tokens):
    """The step's tokens appended to the request, as SGLang commits them, and their ``CommittedTokens``."""
    from sglang.srt.managers.auxiliary_output import CommittedTokens

    start = len(req.output_ids)
    req.output_ids += [7] * new_tokens
    return CommittedTokens(output_index=start, token_ids=tuple(req.output_ids[start:]))


def step_estimates(reqs, estimates, new_tokens):
    """One step of the auxiliary-output channel: device output -> host copy -> consume after the commit."""
    import torch

    z = torch.log1p(torch.tensor(estimates, dtype=torch.float32))
    host = speculative.DraftLengthEstimates(z).copy_to_host(lambda tensor: tensor.clone())
    commits = [commit(req, n) if n else None for req, n in zip(reqs, new_tokens)]
    host.consume(SimpleNamespace(reqs=reqs), commits)


def test_draft_estimates_become_the_prediction_every_reader_uses(plugins_loaded, monkeypatch):
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.schedule_policy import PrefillAdder

    monkeypatch.setattr(state, "schedule_policy_is_outlets", lambda: True)
    monkeypatch.setenv(ENV_KV_ADMISSION, "predicted")  # the charge, which shows the estimate as a budget
    monkeypatch.setenv(ENV_KV_MARGIN, "0")
    state.reset_settings()
    config = state.settings().scheduling
    a, b = decoding("a", 0), decoding("b", 0)
    step_estimates([a, b], [40.0, 900.0], new_tokens=[1, 1])  # prefill: r̂_0, read at the first token
    assert (P.predicted_output_len(a), P.predicted_output_len(b)) == pytest.approx((40.0, 900.0))
    assert a.customized_info["predicted_output_len"] == [40.0]
    assert P.predicted_remaining(b, config) == pytest.approx(899.0)
    assert [[a, b][i].rid for i in ScheduleBatch._get_decode_retraction_order([a, b])] == ["a", "b"]  # b goes first
    for req in (a, b):
        req.sampling_params = SimpleNamespace(max_new_tokens=2000, ignore_eos=False, custom_params=None)
    offset = PrefillAdder._get_running_request_total_token_offset
    assert offset(SimpleNamespace(), b) == pytest.approx(899, abs=1)  # whole tokens, rounded up; z travels in float32
    keys = order_keys.CachedOrderKeys(config)
    assert admission_order([a, b], QueuePolicy.SJF, config, keys=keys) == [a, b]  # keys now cached on a and b

    # a verify step: a accepted 2 tokens (3 generated), b 1 (2 generated); the draft now expects b to end soon
    step_estimates([a, b], [120.0, 5.0], new_tokens=[2, 1])
    assert P.predicted_output_len(a) == pytest.approx(2 + 120.0) and P.predicted_remaining(a, config) == pytest.approx(119.0)
    assert P.predicted_output_len(b) == pytest.approx(1 + 5.0) and P.predicted_remaining(b, config) == pytest.approx(4.0)
    assert [[a, b][i].rid for i in ScheduleBatch._get_decode_retraction_order([a, b])] == ["b", "a"]
    assert offset(SimpleNamespace(), b) == pytest.approx(4, abs=1)
    assert a.customized_info["predicted_output_len"] == [40.0]  # r̂_0 is kept; the estimate sits at its token
    assert a.customized_info["predicted_remaining_len"] == [None, None, 119.0]
    assert a.customized_info["predicted_remaining_after"] == [None, None, 3]
    # the waiting-queue order reads the new estimate, not the cached key of the last round
    assert admission_order([a, b], QueuePolicy.SJF, config, keys=keys) == [b, a]
    meta = {"predicted_output_len": [40.0], "predicted_remaining_len": [None, 130.0, None, 119.0],
            "predicted_remaining_after": [None, 2, None, 3]}
    meta_info.update_meta_info_after(None, None, meta, None, {}, 0, None)
    assert meta == {"predicted_output_len": 40.0, "predicted_remaining_len": 119.0, "predicted_remaining_after": 3}


def test_a_step_without_new_tokens_a_finished_request_or_a_clients_prediction_keeps_its_prediction(plugins_loaded):
    chunked, done, bad = decoding("chunked", 0), decoding("done", 4), decoding("bad", 4)
    client = decoding("client", 0, predicted_output_len=80.0)  # custom_params: precedence over the draft
    for req, value in ((done, 50.0), (bad, 60.0)):
        P.set_predicted_output_len(req, value, "draft")
    done.finished = lambda: True
    before = state.PLUGIN.fallbacks.count
    step_estimates([chunked, done, bad, client], [10.0, 10.0, float("inf"), 10.0], new_tokens=[0, 1, 1, 1])
    assert P.predicted_output_len(chunked) is None  # a prefill chunk with more to come: no token, no estimate
    assert [P.predicted_output_len(req) for req in (done, bad, client)] == [50.0, 60.0, 80.0]
    assert state.PLUGIN.fallbacks.count == before + 1  # the non-finite estimate, counted and logged


def test_a_failing_length_head_falls_back_and_the_step_is_served(plugins_loaded):
    class Broken:
        def log_remaining_from_draft_state(self, states):
            raise RuntimeError("boom")

    fresh, running = decoding("fresh", 0), decoding("running", 5, predicted_output_len=70.0)
    worker = SimpleNamespace(outlets_length_draft=Broken())
    batch = SimpleNamespace(reqs=[fresh, running], forward_mode=SimpleNamespace(is_idle=lambda: False, is_extend=lambda: False))
    import torch

    result = SimpleNamespace(next_draft_input=SimpleNamespace(hidden_states=torch.zeros(2, 4)),
                             logits_output=SimpleNamespace(auxiliary_device_output=None))
    assert speculative.forward_batch_generation_around(lambda self, b: result, worker, batch) is result
    assert P.predicted_output_len(fresh) == state.settings().scheduling.prior_output_len
    assert P.predicted_output_len(running) == 70.0
    assert result.logits_output.auxiliary_device_output is None
    worker.speculative_num_steps = 0  # drafting off at this batch size: the states may be stubs, nothing is read
    before = state.PLUGIN.fallbacks.count
    assert speculative.forward_batch_generation_around(lambda self, b: result, worker, batch) is result
    assert state.PLUGIN.fallbacks.count == before


def test_a_token_aligned_value_slices_like_the_per_token_list_it_stands_for():
    value = customized_info.TokenAlignedValue(3, 7.5)
    as_list = [None, None, None, 7.5]
    assert len(value) == 4 and value == as_list and list(value) == as_list
    for start, stop in ((0, 4), (2, 4), (4, 9), (1, 2), (0, 100)):
        assert value[start:stop] == as_list[start:stop]
    assert value[3] == value[-1] == 7.5 and value[0] is None


def test_eagle3_mode_is_asked_for_with_an_outlets_policy_and_an_outlets_export(tmp_path):
    from sglang_patches.settings import is_outlets_speculative_draft

    export = write_export(tmp_path / "export")
    assert is_outlets_speculative_draft("EAGLE3", export)
    assert not is_outlets_speculative_draft(None, export) and not is_outlets_speculative_draft("NGRAM", export)
    assert not is_outlets_speculative_draft("EAGLE3", str(tmp_path))  # a plain EAGLE-3 draft (no config here)
    assert state.SPECULATIVE in state.features_asked("outlets", None, None, True)
    assert state.features_asked("fcfs", None, None, True) == set()  # our export as a plain draft: stock


def test_cli_refuses_eagle3_mode_when_the_worker_hook_did_not_apply(plugins_loaded, monkeypatch, tmp_path, capsys):
    from sglang.srt.server_args import prepare_server_args

    without_hook(monkeypatch, "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation")
    export = write_export(tmp_path / "export")
    with pytest.raises(SystemExit):
        prepare_server_args(["--model-path", str(tmp_path), "--schedule-policy", "outlets",
                             "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", export])
    assert "EAGLEWorkerV2.forward_batch_generation" in capsys.readouterr().err
    stock = prepare_server_args(["--model-path", str(tmp_path), "--speculative-algorithm", "EAGLE3",
                                 "--speculative-draft-model-path", export])  # no OUTLETS policy: stock
    assert stock.speculative_algorithm == "EAGLE3"


def test_meta_info_gets_one_scalar_prediction(plugins_loaded):
    meta = {"completion_tokens": 10, "predicted_output_len": [12.0]}
    meta_info.update_meta_info_after(None, None, meta, None, {}, 0, {"type": "length"})
    assert meta["predicted_output_len"] == 12.0


def test_load_snapshot_round_trip_and_stock_readers(plugins_loaded):
    import msgspec.msgpack
    from sglang.srt.managers import load_snapshot

    cls = routing.snapshot_class()
    snapshot = cls(dp_rank=1, timestamp=5.0, num_running_reqs=2, outlets_predicted_work=640.0, outlets_num_requests=3)
    data = load_snapshot.snapshot_encoder.encode(snapshot)
    stock = msgspec.msgpack.Decoder(load_snapshot.LoadSnapshot).decode(data)  # /v1/loads readers
    assert stock.num_running_reqs == 2 and not hasattr(stock, "outlets_predicted_work")
    routing.install_snapshot_decoder()
    decoded = load_snapshot.snapshot_decoder.decode(data)
    assert decoded.outlets_predicted_work == 640.0 and decoded.outlets_num_requests == 3
    assert "outlets" in load_snapshot._LOAD_AWARE_METHODS


def test_budget_routes_to_fewest_requests_then_least_work_counting_new_requests():
    budget = routing.OutletsBudget(2, prior_output_len=256.0)

    def snap(rank, work, n, ts, received=0):
        return SimpleNamespace(dp_rank=rank, timestamp=ts, outlets_predicted_work=work, outlets_num_requests=n,
                               outlets_received_requests=received, num_running_reqs=n, num_waiting_reqs=0)

    budget.update([snap(0, 1000.0, 1, 1.0), snap(1, 0.0, 0, 1.0)])
    # 1: fewer requests; 1: one each, less work; 0: one request (1000 left) against two (20 left), where
    # least predicted work would take rank 1; 1: two each, less work
    assert [budget.choose(10.0) for _ in range(4)] == [1, 1, 0, 1]
    assert budget.loads == [routing.RankLoad(2, 1010.0), routing.RankLoad(3, 30.0)]
    assert budget.choose(None) == 0  # 2 < 3 requests; counted with the prior, 256
    assert budget.choose(2000.0) == 1  # 3 each: 30 < 1266
    assert budget.choose(None) == 0  # 3 < 4
    # A fresh snapshot of rank 1 that has seen only 2 of its 4 requests: the other 2 stay counted.
    budget.update([snap(1, 20.0, 2, 2.0, received=2)])
    assert budget.loads[1] == routing.RankLoad(4, 20.0 + 10 + 2000)
    budget.update([snap(1, 2030.0, 4, 3.0, received=4)])
    assert budget.loads[1] == routing.RankLoad(4, 2030.0)
    # a stock snapshot (no counter) counts its requests with the prior and everything as seen
    stock = SimpleNamespace(dp_rank=0, timestamp=4.0, num_running_reqs=2, num_waiting_reqs=1)
    budget.update([stock])
    assert budget.loads[0] == routing.RankLoad(3, 768.0)


def test_in_flight_requests_expire():
    budget = routing.OutletsBudget(2, prior_output_len=256.0, pending_ttl_s=0.0)
    budget.choose(None)
    assert budget.loads[0].predicted_work == 0.0


def test_budget_kept_current_equals_the_full_sum_over_random_dispatches_and_snapshots():
    rng = random.Random(2)
    budget = routing.OutletsBudget(4, prior_output_len=256.0, pending_ttl_s=1e9)
    for step in range(3000):
        if rng.random() < 0.9:
            budget.choose(rng.choice([None, rng.uniform(1, 3000)]), active=rng.choice([None, [0, 1, 2, 3], [1, 3]]))
        else:
            rank = rng.randrange(4)
            received = rng.randint(budget.seen[rank], budget.sent[rank])
            budget.update([SimpleNamespace(dp_rank=rank, timestamp=float(step), outlets_predicted_work=rng.uniform(0, 1e5),
                                           outlets_num_requests=rng.randint(0, 300), outlets_received_requests=received)])
        full = [routing.RankLoad(base.num_requests + sum(1 for e in queue if e[0] > seen),
                                 base.predicted_work + sum(e[1] for e in queue if e[0] > seen))
                for base, queue, seen in zip(budget.base, budget.pending, budget.seen)]
        for kept, summed in zip(budget.loads, full):
            assert kept.num_requests == summed.num_requests
            assert kept.predicted_work == pytest.approx(summed.predicted_work, rel=1e-9, abs=1e-6)


def test_load_balance_method_outlets_maps_to_load_aware_plumbing(plugins_loaded):
    from sglang.srt.managers.data_parallel_controller import LoadBalanceMethod

    assert LoadBalanceMethod.from_str("outlets") is LoadBalanceMethod.TOTAL_REQUESTS
    assert LoadBalanceMethod.from_str("round_robin") is LoadBalanceMethod.ROUND_ROBIN
    with pytest.raises(ValueError):
        LoadBalanceMethod.from_str("bogus")


def test_the_default_kv_admission_is_sglangs_own(plugins_loaded, no_outlets_settings, monkeypatch, tmp_path, capsys):
    """A server started without --outlets-kv-admission keeps SGLang's own admission (the regime map's default: the
    peak lost to SGLang tuned by its own knobs where the cache binds); the knobs only the plugin's rules read,
    --outlets-kv-margin and --outlets-kv-quantile, are refused naming the default; the peak is one flag away."""
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.managers.schedule_policy import PrefillAdder

    assert KV_ADMISSIONS[0] is KVAdmission.SGLANG and {KVAdmission.PEAK, KVAdmission.PREDICTED} <= set(KV_ADMISSIONS)
    assert len(set(KV_ADMISSIONS)) == len(KV_ADMISSIONS)
    assert PluginSettings(SchedulingConfig(), QueuePolicy.TAIL_SAFE, None).kv_admission is KVAdmission.SGLANG
    defaults = read_settings({})
    assert (defaults.kv_admission, defaults.kv_margin, defaults.kv_quantile) == (KVAdmission.SGLANG, 0.2, 0.9)

    prepare_server_args(["--model-path", str(tmp_path), "--schedule-policy", "outlets"])
    assert ENV_KV_ADMISSION not in os.environ and state.settings().kv_admission is KVAdmission.SGLANG
    monkeypatch.setattr(state, "schedule_policy_is_outlets", lambda: True)
    assert kv_admission.admission() is None  # SGLang's own arithmetic, untouched
    running = request("r", 300, generated=100)
    running.sampling_params = SimpleNamespace(max_new_tokens=1000, ignore_eos=False, custom_params=None)
    offset = PrefillAdder._get_running_request_total_token_offset
    assert offset(SimpleNamespace(new_token_ratio=0.5), running) == 450  # SGLang's 0.5 x (1000 - 100), not r̂

    for flag, knob, variable in (("--outlets-kv-margin", "0.3", ENV_KV_MARGIN),
                                 ("--outlets-kv-quantile", "0.8", ENV_KV_QUANTILE)):
        with pytest.raises(SystemExit):  # a knob of the plugin's rules alone: refused, not ignored
            prepare_server_args(["--model-path", str(tmp_path), "--schedule-policy", "outlets", flag, knob])
        assert (f"not by the default, --outlets-kv-admission sglang (OUTLETS_KV_ADMISSION unset): leave it out or "
                "use --outlets-kv-admission") in capsys.readouterr().err
        os.environ.pop(variable)
    prepare_server_args(["--model-path", str(tmp_path), "--schedule-policy", "outlets", "--outlets-kv-admission",
                         "predicted", "--outlets-kv-margin", "0.3"])
    assert (state.settings().kv_admission, state.settings().kv_margin) == (KVAdmission.PREDICTED, 0.3)
    for name in (ENV_KV_ADMISSION, ENV_KV_MARGIN):
        os.environ.pop(name)
    prepare_server_args(["--model-path", str(tmp_path), "--schedule-policy", "outlets", "--outlets-kv-admission",
                         "peak", "--outlets-kv-quantile", "0.8"])
    assert (state.settings().kv_admission, state.settings().kv_quantile) == (KVAdmission.PEAK, 0.8)
    assert isinstance(kv_admission.admission(), PeakAdmission) and kv_admission.admission().kv_quantile == 0.8
    assert offset(SimpleNamespace(new_token_ratio=0.5), running) == 0  # the peak charges nothing ahead


def test_kv_admission_by_prediction_charges_running_requests_their_predicted_remaining(plugins_loaded, monkeypatch):
    from sglang.srt.managers.schedule_policy import PrefillAdder

    def new_round():
        """SGLang's PrefillAdder of a new round (the plugin keeps the round's KV strategy on it)."""
        return SimpleNamespace(new_token_ratio=0.5)

    def running(predicted, generated, max_new=1000, ignore_eos=False):
        req = request("r", predicted, generated=generated)
        req.sampling_params = SimpleNamespace(max_new_tokens=max_new, ignore_eos=ignore_eos, custom_params=None)
        return req

    monkeypatch.setattr(state, "schedule_policy_is_outlets", lambda: True)
    monkeypatch.setenv(ENV_KV_ADMISSION, "predicted")  # the charge (the default is SGLang's own)
    state.reset_settings()
    offset = PrefillAdder._get_running_request_total_token_offset
    assert offset(new_round(), running(300, 100)) == 240  # the default margin, 0.2: (300 - 100) x 1.2
    for sglang in ("sglang", " SGLang "):
        monkeypatch.setenv(ENV_KV_ADMISSION, sglang)
        state.reset_settings()
        assert offset(new_round(), running(300, 100)) == 450  # SGLang's 0.5 x (1000 - 100)
    monkeypatch.setenv(ENV_KV_ADMISSION, "predicted")
    monkeypatch.setenv(ENV_KV_MARGIN, "0.5")
    state.reset_settings()
    assert offset(new_round(), running(300, 100)) == 300  # (300 - 100) x 1.5
    monkeypatch.setenv(ENV_KV_MARGIN, "0.2")
    state.reset_settings()
    assert offset(new_round(), running(300, 100)) == 240
    assert offset(new_round(), running(5000, 100)) == 900  # at most what is left of max_new_tokens
    assert offset(new_round(), running(None, 100)) == 450  # no prediction: SGLang's estimate
    assert offset(new_round(), running(300, 100, ignore_eos=True)) == 900  # runs to max_new_tokens: stock ratio 1
    monkeypatch.setattr(state, "schedule_policy_is_outlets", lambda: False)
    assert offset(new_round(), running(300, 100)) == 450
    for bad in ("-1", "inf", "twenty", "off"):
        monkeypatch.setenv(ENV_KV_MARGIN, bad)
        state.reset_settings()
        with pytest.raises(OutletsSettingsError, match=f"OUTLETS_KV_MARGIN.*'{bad}'.*(>= 0|is not a number)"):
            read_settings()
    monkeypatch.setenv(ENV_KV_MARGIN, "0.2")
    for rule in ("sglang", "peak", "quantile", "past-future"):  # rules that read no margin refuse one
        monkeypatch.setenv(ENV_KV_ADMISSION, rule)
        with pytest.raises(OutletsSettingsError, match=f"OUTLETS_KV_MARGIN \\(--outlets-kv-margin\\) is read by "
                                                       f"--outlets-kv-admission predicted, not by OUTLETS_KV_ADMISSION={rule}"):
            read_settings()
    monkeypatch.setenv(ENV_KV_ADMISSION, "off")
    with pytest.raises(OutletsSettingsError, match="OUTLETS_KV_ADMISSION \\(--outlets-kv-admission\\)='off': choose "
                                                   "one of sglang, peak, predicted, quantile, past-future"):
        read_settings()


def test_kv_admission_by_prediction_charges_a_request_being_admitted_its_predicted_remaining(plugins_loaded,
                                                                                             monkeypatch):
    """While SGLang's add_one_req runs, the request asks for its predicted budget; after it, its own max_new_tokens."""
    from sglang.srt.managers.schedule_policy import PrefillAdder

    seen = []

    def original(adder, req, has_chunked_req, truncation_align_size):
        seen.append(req.sampling_params.max_new_tokens)
        return "added"

    def waiting(predicted, generated=0, max_new=1000, ignore_eos=False):
        req = request("w", predicted, generated=generated)
        req.sampling_params = SimpleNamespace(max_new_tokens=max_new, ignore_eos=ignore_eos, custom_params=None)
        return req

    assert PrefillAdder.add_one_req.__wrapped__ is not None  # the hook is on SGLang's method
    monkeypatch.setattr(state, "schedule_policy_is_outlets", lambda: True)
    monkeypatch.setenv(ENV_KV_ADMISSION, "predicted")
    monkeypatch.setenv(ENV_KV_MARGIN, "0.5")
    state.reset_settings()
    for req, asked in ((waiting(40), 60), (waiting(300, generated=100), 100 + 300),  # retracted: 200 left x 1.5
                       (waiting(5000), 1000), (waiting(None), 1000), (waiting(40, ignore_eos=True), 1000)):
        assert kv_admission.add_one_req_around(original, SimpleNamespace(), req, False, None) == "added"  # a round
        assert seen.pop() == asked and req.sampling_params.max_new_tokens in (1000,)
    monkeypatch.setattr(state, "schedule_policy_is_outlets", lambda: False)
    kv_admission.add_one_req_around(original, SimpleNamespace(), waiting(40), False, None)
    assert seen.pop() == 1000  # stock


def test_the_kv_strategy_is_built_once_per_admission_round(plugins_loaded, monkeypatch):
    """SGLang asks the hooks once per running request and per candidate; the strategy is built at the round's first
    ask and kept on its PrefillAdder (a new one per round): 2 rounds of 3 running requests and 2 candidates, 2 builds
    (10 before it was kept)."""
    built = []
    create = kv_admission.create_admission
    monkeypatch.setattr(kv_admission, "create_admission", lambda *args, **kw: built.append(1) or create(*args, **kw))
    monkeypatch.setattr(state, "schedule_policy_is_outlets", lambda: True)
    monkeypatch.setenv(ENV_KV_ADMISSION, "predicted")
    state.reset_settings()
    for _ in range(2):
        adder = SimpleNamespace()  # SGLang's PrefillAdder of one round
        charges = [kv_admission.running_token_offset_around(None, adder, request("r", 110.0, generated=10))
                   for _ in range(3)]
        admitted = [kv_admission.add_one_req_around(lambda *args: "added", adder, request("w", 60.0), False, None)
                    for _ in range(2)]
        assert charges == [120] * 3 and admitted == ["added"] * 2  # 100 left x (1 + the default margin, 0.2)
    assert len(built) == 2


def test_pd_decode_waiting_queue_uses_the_same_key(plugins_loaded, monkeypatch):
    seen = []
    now = time.monotonic()  # a (predicted long) waited 100 s; b arrived 3 s after it, within the hold-back
    fake_scheduler = SimpleNamespace(waiting_queue=[request("a", 5000, arrival=now - 100), request("b", 20, arrival=now - 97)])
    original = lambda self, running_batch: seen.append([r.rid for r in self.waiting_queue])
    monkeypatch.setattr(state, "schedule_policy_is_outlets", lambda: True)
    ordering.prebuilt_batch_around(original, fake_scheduler, None)
    monkeypatch.setattr(state, "schedule_policy_is_outlets", lambda: False)
    fake_scheduler.waiting_queue.reverse()
    ordering.prebuilt_batch_around(original, fake_scheduler, None)
    assert seen == [["b", "a"], ["a", "b"]]


@pytest.mark.parametrize("case, message", [
    ("no-radix-flag", "needs --disable-radix-cache"),
    ("speculative", "cannot be combined with --speculative-algorithm"),
    ("too-deep", "do not fit the 6-layer target"),
    ("last-layer", "which SGLang does not capture"),
    ("last-layer-ablation", "target_features='last_layer' is the training ablation"),
    ("wrong-width", "expects target hidden size 64"),
])
def test_predictor_only_refusals(plugins_loaded, tmp_path, capsys, case, message):
    from sglang.srt.server_args import prepare_server_args

    target = write_target(tmp_path / "target")
    fusion = {"too-deep": (2, 3, 9), "last-layer": (2, 3, 6)}.get(case, (2, 3, 4))
    export = write_export(tmp_path / "export", fusion=fusion, hidden=64 if case == "wrong-width" else 32,
                          target_features="last_layer" if case == "last-layer-ablation" else "fused")
    argv = ["--model-path", target, "--outlets-draft-path", export]
    if case != "no-radix-flag":
        argv.append("--disable-radix-cache")
    if case == "speculative":
        argv += ["--speculative-algorithm", "EAGLE3"]
    with pytest.raises(SystemExit):
        prepare_server_args(argv)
    assert message in capsys.readouterr().err


def test_predictor_only_accepts_a_fitting_export(plugins_loaded, tmp_path):
    from sglang.srt.server_args import prepare_server_args

    export = write_export(tmp_path / "export")
    args = prepare_server_args(["--model-path", write_target(tmp_path / "target"), "--outlets-draft-path", export,
                                "--disable-radix-cache", "--schedule-policy", "outlets"])
    assert os.environ[ENV_DRAFT] == export and args.schedule_policy == "outlets"
