"""The regime map's pieces on a tiny synthetic record: arrivals, window, capacity search, metrics, resumability."""

import argparse
import json
from types import SimpleNamespace

import numpy as np
import pytest

from specforge_outlets.scheduling import DEFAULT_KV_ADMISSION, PLUGIN_ROUTING, KVAdmission, QueuePolicy
from specforge_outlets.simulation.cluster import ClusterMode
from specforge_outlets.simulation.hardware import L4, LLAMA_3_1_8B
from specforge_outlets.studies.predictor_ladder.rungs import RUNGS as LADDER_RUNGS
from specforge_outlets.studies.regime_map import arrivals, capacity, cells, metrics, regimes, report, requests
from specforge_outlets.studies.regime_map.regimes import FEW_RUNGS, PLUGIN_DEFAULT, RUNGS


class TinyRecord:
    """Twenty samples with every rung's value (the oracle's, halved or doubled): what the ladder's rungs read."""

    name = "tiny"

    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.ids = [f"p{i}" for i in range(20)]
        self.input_lens = rng.integers(50, 300, size=20)
        self.output_lens = rng.integers(2, 200, size=20)
        self.train_median = 60.0

    def measured(self, rung, trace, drawn, seed):
        scale = 0.5 if rung == "outlets r0" else 2.0
        return (self.output_lens[drawn] * scale).tolist()


class TinyGroups(TinyRecord):
    """The same twenty outputs as five prompts of four, with prompts long enough that a pass takes several chunks."""

    def __init__(self) -> None:
        super().__init__()
        self.prompts = np.repeat(np.arange(5), 4)
        self.input_lens = np.repeat([4000, 6000, 8000, 9000, 7000], 4)


def test_poisson_bursts_hold_the_mean_rate_and_burst_above_capacity():
    times = arrivals.poisson_burst_arrival_times(np.random.default_rng(0), 10.0, 12.0, 20_000)
    assert times[0] == 0 and np.all(np.diff(times) >= 0)
    assert len(times) / times[-1] == pytest.approx(10.0, rel=0.03)
    phase = np.mod(times, arrivals.BURST_PERIOD_S) >= arrivals.BURST_PERIOD_S - arrivals.BURST_S
    quiet, burst = arrivals.burst_rates(10.0, 12.0)
    assert burst == 18.0 and quiet == pytest.approx((10.0 * 30 - 18.0 * 10) / 20)
    share_in_bursts = phase.mean()
    assert share_in_bursts == pytest.approx(burst * arrivals.BURST_S / (10.0 * arrivals.BURST_PERIOD_S), abs=0.02)
    with pytest.raises(ValueError):
        arrivals.burst_rates(3.0, 12.0)  # the bursts alone exceed that mean


def test_steady_window_leaves_out_warm_up_and_drain():
    mask = metrics.steady_window(np.arange(11.0))
    assert np.flatnonzero(mask).tolist() == [2, 3, 4, 5, 6, 7, 8]


def test_served_share_counts_tokens_made_in_the_window():
    # arrivals 0..10 s (window 2-8 s), each 10 tokens over 1 s from its arrival: all served
    arrival = np.arange(11.0)
    result = SimpleNamespace(arrival_times=arrival, first_token_times=arrival, finish_times=arrival + 1.0,
                             output_lens=np.full(11, 10))
    assert capacity.served_share(result) == pytest.approx(60.0 / 70.0)  # 2-8 s: 6 s of tokens; 7 arrivals asked
    # every request served twice as slowly: half its tokens fall after the one before's
    slow = SimpleNamespace(**{**vars(result), "finish_times": arrival + 2.0})
    assert capacity.served_share(slow) == pytest.approx(capacity.served_share(result))


def test_bisection_finds_the_highest_rate_within_tolerance_and_records_its_probes():
    # served share 1 up to 30 rps, then falling: capacity where it drops 2% below the reference's
    found = capacity.bisect_capacity(lambda rate: 1.0 if rate <= 30 else 1.0 - (rate - 30) / 100, hint=25.0)
    assert 31.0 <= found["capacity_rps"] <= 32.0
    assert found["probes"][0]["rate_rps"] == 25.0 * capacity.REFERENCE_LOAD
    assert len(found["probes"]) == 1 + 2 + capacity.CAPACITY_STEPS  # reference, bracket (held, then failed), steps


def test_figures_on_a_hand_made_run():
    arrival = np.array([0.0, 0.0, 1.0])
    first = np.array([1.0, 3.0, 2.0])
    finish = np.array([2.0, 13.0, 1002.0])
    made = metrics.figures(arrival, first, finish, np.array([11, 11, 1001]))
    assert made["ttft_mean_s"] == pytest.approx(5 / 3) and made["ttft_p50_s"] == pytest.approx(1.0)
    assert made["makespan_s"] == 1002.0 and made["long_p99_s"] == pytest.approx(1001.0)
    # SLO (TTFT 5 s, TPOT 100 ms): the first meets both; the second's TPOT is 1 s; the third's 1 s too
    assert made["slo_attainment"] == pytest.approx(1 / 3)


def test_a_batch_prediction_pass_charges_the_prompts_prefill():
    cluster = cells.CLUSTERS["colocated x4"]()
    model = cluster.step_time_model()
    prompts = np.full(8, cluster.chunked_prefill_size)  # two chunks per instance
    assert metrics.prediction_pass_s(cluster, prompts) == pytest.approx(
        2 * model.step_time(0, cluster.chunked_prefill_size))


def test_a_cell_is_resumable_and_a_rerun_simulates_nothing_new(tmp_path):
    work = TinyRecord()
    path = str(tmp_path / "cell.json")
    plan = cells.run_plan(cells.REGIMES["PD 2P+2D"])
    # four peers; the plugin's default over two peers with every rung; sjf, tail-safe-ranks, plugin routing with four
    assert len(plan) == 4 + 2 * len(RUNGS) + 3 * len(FEW_RUNGS)
    assert cells.simulate_cell(work, "PD 2P+2D", 40, 1.0, 0, 20.0, path) == len(plan)
    assert cells.complete(path, cells.REGIMES["PD 2P+2D"])
    assert cells.simulate_cell(work, "PD 2P+2D", 40, 1.0, 0, 20.0, path) == 0
    with open(path) as handle:
        cell = json.load(handle)
    label = f"{PLUGIN_DEFAULT} over total_requests | oracle"
    run = next(run for run in cell["runs"] if run["label"] == label)
    assert set(run) >= {"whole", "steady", "rung", "config", "point", "routing", "queue", "admission", "over"}
    assert cell["window"] == metrics.WINDOW and cell["load_label"] == "at capacity"
    cell["runs"] = [run for run in cell["runs"] if run["label"] != label]
    with open(path, "w") as handle:
        json.dump(cell, handle)
    assert cells.simulate_cell(work, "PD 2P+2D", 40, 1.0, 0, 20.0, path) == 1  # only the run it lacked
    # a run recorded under another configuration (here another routing) is simulated anew
    with open(path) as handle:
        cell = json.load(handle)
    next(run for run in cell["runs"] if run["label"] == label)["routing"] = "round-robin"
    with open(path, "w") as handle:
        json.dump(cell, handle)
    assert not cells.complete(path, cells.REGIMES["PD 2P+2D"])
    assert cells.simulate_cell(work, "PD 2P+2D", 40, 1.0, 0, 20.0, path) == 1


def test_a_batch_cell_runs_every_prediction_point_and_reports_ratios(tmp_path):
    work = TinyRecord()
    args = argparse.Namespace(output=str(tmp_path), regimes=["offline batch"], seeds=[0, 1], requests=40,
                              batch_shapes=[30], loads=[1.0], long_requests=0)
    cells_made = cells.cell_list(args, {"colocated x4": {"capacity_rps": 10.0}}, work)
    assert [(seed, load) for _, _, load, seed, _ in cells_made] == [(0, None), (1, None)]
    for name, shape, load, seed, cap in cells_made:
        cells.simulate_cell(work, name, shape, load, seed, cap, cells.cell_path(str(tmp_path), name, shape, load, seed))
    (summary,) = [report.summarize_cell(seeds) for seeds in report.grouped(cells.read_cells(str(tmp_path))).values()]
    assert summary["seeds"] == [0, 1] and summary["headline_window"] == "whole" and summary["prediction_pass_s"] > 0
    points = {run["point"] for run in summary["runs"].values() if run["rung"] == "oracle"}
    assert points == {"at prefill", "at arrival (prefill-only pass charged)", "at arrival (free: a lower bound)"}
    # the charged pass starts every request later than the free lower bound, by the pass
    runs = summary["runs"]
    assert (runs["sjf over total_requests | oracle | at arrival (prefill-only pass charged)"]["mean"]["whole"][
        "ttft_mean_s"] > runs["sjf over total_requests | oracle | at arrival (free: a lower bound)"]["mean"]["whole"][
        "ttft_mean_s"])
    assert report.best_outlets(summary).endswith(("at prefill", "pass charged)"))
    # a layered configuration's ratios to the peer it is layered on, seed by seed
    label = f"{PLUGIN_DEFAULT} over total_requests | oracle | at prefill"
    seeds = [{run["label"]: run for run in cell["runs"]} for cell in cells.read_cells(str(tmp_path))]
    base = runs[label]["over"]
    assert runs[label]["ratio_to_base"]["makespan_s"] == pytest.approx(np.mean(
        [seed[label]["whole"]["makespan_s"] / seed[base]["whole"]["makespan_s"] for seed in seeds]))
    assert runs[base]["ratio_to_base"] is None
    best = summary["best_peer"]["ttft_mean_s"]
    assert summary["runs"][best]["ratio"]["ttft_mean_s"] == pytest.approx(1.0)
    assert all(run["ratio"]["ttft_mean_s"] >= 1.0 - 1e-9 for label, run in summary["runs"].items()
               if report.is_peer(run | {"label": label}))


def test_the_l4_cluster_has_its_own_cache_from_its_memory():
    cluster = regimes.CLUSTERS["colocated x4 L4"]()
    assert (L4.memory_bytes, L4.memory_bandwidth, L4.dense_bf16_flops) == (24e9, 300e9, 121e12)
    weights, per_token = 8.03e9 * 2, 2 * 32 * 8 * 128 * 2  # Llama-3.1-8B in bf16
    assert cluster.kv_capacity() == int((24e9 * cluster.memory_fraction - weights) // per_token) == 38604
    assert LLAMA_3_1_8B.kv_bytes_per_token == per_token
    assert cluster.kv_capacity() < regimes.CLUSTERS["colocated x4"]().kv_capacity() / 10
    # the L4's decode step reads the weights at its own bandwidth: about seven times an H100's
    assert cluster.step_time_model().step_time(0) > 5 * regimes.CLUSTERS["colocated x4"]().step_time_model().step_time(0)


def test_the_plugin_layered_on_a_peer_keeps_its_routing_knobs_and_max_running():
    for mode in ClusterMode:
        every = regimes.peers(mode)
        configs = regimes.prediction_configs(mode)
        for name, config in configs.items():
            peer = every[config.over]
            assert config.configuration.setup.knobs == peer.setup.knobs
            assert config.configuration.max_running_requests == peer.max_running_requests
            if name != regimes.PLUGIN_ROUTING_CONFIG:
                assert config.configuration.setup.routing == peer.setup.routing
    pd_configs = regimes.prediction_configs(ClusterMode.DISAGGREGATED)
    pd = pd_configs[f"{PLUGIN_DEFAULT} over total_requests"]
    assert (pd.configuration.setup.routing, pd.configuration.max_running_requests) == ("least-requests", 512)
    assert pd.configuration.setup.admission is KVAdmission.SGLANG  # decode: SGLang's pre-allocation
    assert regimes.PEAK_CONFIG not in pd_configs  # the peak gates SGLang's PrefillAdder: colocated only
    colocated = regimes.prediction_configs(ClusterMode.COLOCATED)
    default = colocated[f"{PLUGIN_DEFAULT} over SGLang default"].configuration.setup
    assert (default.routing, default.queue, default.admission) == ("round-robin", QueuePolicy.TAIL_SAFE.value,
                                                                    DEFAULT_KV_ADMISSION)
    assert DEFAULT_KV_ADMISSION is KVAdmission.SGLANG  # the map's default: the plugin leaves SGLang's admission
    peak = colocated[regimes.PEAK_CONFIG]
    assert (peak.over, peak.rungs, peak.configuration.setup.admission) == (
        regimes.layer_bases(ClusterMode.COLOCATED)["total_requests"], regimes.FEW_RUNGS, KVAdmission.PEAK)
    routed = colocated[regimes.PLUGIN_ROUTING_CONFIG].configuration.setup
    assert routed.routing == PLUGIN_ROUTING.value and routed.queue == QueuePolicy.TAIL_SAFE.value  # the plugin's rule
    assert "longest-predicted-first over total_requests" in regimes.prediction_configs(ClusterMode.COLOCATED, True)
    assert "longest-predicted-first over total_requests" not in colocated


def test_a_prompt_groups_batch_holds_every_sample_of_its_prompts_and_they_share_r0():
    from specforge_outlets.studies.label_set_samples import LabelSetSamples

    work = LabelSetSamples()
    trace, drawn = cells.sample_trace(work, "batch", 1.0, 1.0, len(work.ids), 0, "prompt groups")
    assert sorted(drawn.tolist()) == list(range(len(work.ids)))  # each sample once
    prompts = work.prompts[drawn]
    assert all(len(set(prompts[i:i + 4])) == 1 for i in range(0, len(prompts), 4))  # a prompt's samples together
    r0 = np.array(LADDER_RUNGS["outlets r0"](work, trace, drawn, 0))
    for prompt in np.unique(prompts):
        assert len(set(r0[prompts == prompt])) == 1
    assert len(set(r0)) > 1
    half, _ = cells.sample_trace(work, "batch", 1.0, 1.0, 400, 1, "prompt groups")
    assert len(half) == 400 and len(set(work.prompts[_])) == 100
    with pytest.raises(ValueError, match="multiple of the samples per prompt"):
        cells.sample_trace(work, "batch", 1.0, 1.0, 402, 0, "prompt groups")


def test_a_prompt_groups_batch_charges_each_prompt_once(tmp_path):
    work = TinyGroups()
    name = "offline batch, 4 samples per prompt"
    args = argparse.Namespace(regimes=[name], seeds=[0], requests=40, batch_shapes=[30], loads=[1.0],
                              long_requests=0)
    ((_, shape, load, seed, cap),) = cells.cell_list(args, {"colocated x4": {"capacity_rps": 10.0}}, work)
    assert (shape, load) == (20, None)
    path = str(tmp_path / "cell.json")
    cells.simulate_cell(work, name, shape, load, seed, cap, path)
    with open(path) as handle:
        cell = json.load(handle)
    cluster = regimes.CLUSTERS["colocated x4"]()
    once = metrics.prediction_pass_s(cluster, work.input_lens[::4])
    assert cell["prediction_pass_s"] == pytest.approx(once, abs=1e-3)
    assert once < 0.5 * metrics.prediction_pass_s(cluster, work.input_lens)
    assert requests.distinct_prompts(work, np.arange(20)).tolist() == work.input_lens[::4].tolist()
