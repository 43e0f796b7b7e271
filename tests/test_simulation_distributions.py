"""The simulator with predicted distributions: quantile KV admission, distribution order keys, noisy and file quantiles."""

import gzip
import json
import math
import re

import numpy as np
import pytest

from specforge_outlets.cli import main
from specforge_outlets.errors import OutletsError
from specforge_outlets.scheduling import LengthDistribution, SchedulingConfig
from specforge_outlets.simulation.cluster import ClusterConfig, KVAdmission, cluster_config_from_dict
from specforge_outlets.simulation.engine import Policy, Simulation
from specforge_outlets.simulation.predicted_lengths import (
    PredictorKind,
    predict_lengths,
    predicted_quantile_trajectories,
    predicted_quantiles,
    read_file_quantiles,
)
from specforge_outlets.simulation.sglang_peers import queue_policy, routing_policy
from specforge_outlets.simulation.study import StudyPlan, check_distribution_inputs, policy_grid, run_study
from specforge_outlets.scheduling import QueuePolicy, RoutingPolicy
from tests.test_simulation import UNIT_STEPS, make_trace, pd_cluster, write

LEVELS = (0.1, 0.25, 0.5, 0.75, 0.9)


@pytest.fixture
def unit_steps(monkeypatch):
    monkeypatch.setattr(ClusterConfig, "step_time_model", lambda self: UNIT_STEPS)


def simulation(trace, cluster, queue="fcfs", predictions=None, quantiles=None, quantile_trajectories=None,
               trajectories=None, **scheduling):
    predictions = trace.output_lens.astype(float).tolist() if predictions is None else predictions
    policy = Policy(routing_policy("round-robin"), queue_policy(queue))
    return Simulation(trace, predictions, cluster, policy, SchedulingConfig(**scheduling), trajectories,
                      quantiles=quantiles, quantile_trajectories=quantile_trajectories)


# --- cluster config -------------------------------------------------------------------------------
def test_quantile_admission_is_a_cluster_setting_with_its_level():
    cluster = cluster_config_from_dict({"kv_admission": "quantile", "kv_quantile": 0.8}, "test")
    assert cluster.kv_admission is KVAdmission.QUANTILE and cluster.kv_quantile == 0.8
    assert cluster_config_from_dict({"mode": "colocated"}, "test").kv_quantile == 0.9
    for bad in (0, 1, 1.5, "high", True):
        with pytest.raises(OutletsError, match=re.escape(f"test: kv_quantile={bad!r}: give a level strictly between 0 "
                                                         "and 1, e.g. 0.9")):
            cluster_config_from_dict({"kv_admission": "quantile", "kv_quantile": bad}, "test")


# --- KV reservation -------------------------------------------------------------------------------
def test_quantile_admission_reserves_the_quantile_of_the_remaining_length(unit_steps):
    trace = make_trace([(0.0, 10, 100), (0.0, 10, 100), (0.0, 10, 100)])
    wide = LengthDistribution.log_normal(50.0, 0.8).quantiles
    cluster = pd_cluster(max_new_tokens=1000, kv_admission="quantile", kv_quantile=0.9)
    sim = simulation(trace, cluster, predictions=[50.0, 50.0, None], quantiles=[wide, None, None])
    engine = sim.engines[0]
    for request in sim.requests:
        request.reveal_prediction()
        request.num_generated_tokens = 1
    expected = 10 + 1 + math.ceil(LengthDistribution(LEVELS, wide).quantile_remaining(0.9, 1))
    assert engine._reservation(sim.requests[0]) == expected and expected > 10 + 1 + 49 * 2  # q0.9 of sigma 0.8
    assert engine._reservation(sim.requests[1]) == 10 + 1 + 49  # no quantiles: a point mass at the point
    assert engine._reservation(sim.requests[2]) == sim.requests[2].full_reservation  # no prediction: in full
    predicted = simulation(trace, pd_cluster(max_new_tokens=1000, kv_admission="predicted", kv_margin=0.2),
                           predictions=[50.0] * 3, quantiles=[wide] * 3)
    predicted.requests[0].reveal_prediction()
    predicted.requests[0].num_generated_tokens = 1
    assert predicted.engines[0]._reservation(predicted.requests[0]) == 10 + 1 + math.ceil(49 * 1.2)  # ignores quantiles


def test_quantile_admission_avoids_the_retractions_of_an_underestimating_point(unit_steps):
    """Outputs of 100 predicted at a median of 50: the point's reservation retracts, the q0.9 one (about 139) does not."""
    trace = make_trace([(0.01 * i, 10, 100) for i in range(12)])
    wide = LengthDistribution.log_normal(50.0, 0.8).quantiles
    runs = {}
    for admission in ("predicted", "quantile"):
        cluster = pd_cluster(max_new_tokens=200, kv_capacity_tokens=600, max_running_requests=64,
                             kv_admission=admission, **({"kv_margin": 0.0} if admission == "predicted" else {}))
        runs[admission] = simulation(trace, cluster, predictions=[50.0] * 12, quantiles=[wide] * 12).run()
        assert np.isfinite(runs[admission].finish_times).all()
    assert runs["predicted"].retractions.sum() > 0
    assert runs["quantile"].retractions.sum() == 0


def test_quantile_charge_of_a_running_request_follows_its_survival(unit_steps):
    """As the plugin does every round: a survivor of a wide distribution is charged the q0.9 of its
    remaining length given what it has generated, which here outgrows its charge at admission, so a
    later request waits for the cache instead of being admitted on the stale charge."""
    trace = make_trace([(0.0, 10, 300), (150.0, 10, 20)])
    wide = LengthDistribution.log_normal(100.0, 0.5).quantiles
    narrow = LengthDistribution.log_normal(110.0, 0.01).quantiles
    at_admission = 10 + math.ceil(LengthDistribution(LEVELS, wide).quantile_remaining(0.9, 0))
    later = 10 + 150 + math.ceil(LengthDistribution(LEVELS, wide).quantile_remaining(0.9, 150))
    assert later > at_admission + 40  # the survivor's charge grew
    second = 10 + math.ceil(LengthDistribution(LEVELS, narrow).quantile_remaining(0.9, 0))
    capacity = 330  # holds the first's full 310 tokens; both on the charges at admission, not on the survivor's
    assert at_admission + second <= capacity < later + second
    cluster = cluster_config_from_dict(dict(mode="colocated", instances=1, max_new_tokens=300, kv_capacity_tokens=capacity,
                                            kv_admission="quantile", kv_quantile=0.9, predict_at="arrival"), "test")
    result = simulation(trace, cluster, predictions=[100.0, 110.0], quantiles=[wide, narrow]).run()
    assert result.first_token_times[1] > result.finish_times[0] - 5  # waited for the first to (almost) finish


def test_dynamic_quantiles_are_re_read_after_each_token_like_the_trajectory(unit_steps):
    trace = make_trace([(0.0, 10, 5)])
    static = (2.0, 3.0, 4.0, 5.0, 6.0)
    steps = [(9.0,) * 5, (4.0, 4.0, 5.0, 6.0, 7.0), (2.0, 2.0, 3.0, 3.0, 9.0)]
    sim = simulation(trace, pd_cluster(kv_admission="quantile"), predictions=[4.0], quantiles=[static],
                     quantile_trajectories=[steps], trajectories=[np.array([4.0, 4.0, 3.0])])
    request = sim.requests[0]
    assert request.prediction_at(1) is None  # not revealed yet
    request.reveal_prediction()
    quantiles_at = lambda generated: request.prediction_at(generated).predicted_output_quantiles  # noqa: E731
    assert quantiles_at(1) == static  # the first token: the prediction
    assert quantiles_at(2) == (5.0, 5.0, 6.0, 7.0, 8.0)  # read at token 2: 1 + entry 1
    assert quantiles_at(3) == (4.0, 4.0, 5.0, 5.0, 11.0)
    assert quantiles_at(10) == (4.0, 4.0, 5.0, 5.0, 11.0)  # past the end: the last entry
    assert request.prediction_at(3).remaining_quantiles(3) == (1.0, 1.0, 2.0, 2.0, 8.0)
    assert sim.dynamic
    assert np.isfinite(sim.run().finish_times).all()


# --- order keys in the simulator ------------------------------------------------------------------
@pytest.mark.parametrize("order_key, first", [("point", "B"), ("mean", "C"), ("risk", "C"), ("gittins", "B")])
def test_sjf_orders_the_decode_queue_by_the_configured_key(unit_steps, order_key, first):
    """A holds the one slot; B (point 3, but a long tail) and C (a sure 5) wait for it; who goes next?"""
    trace = make_trace([(0.0, 50, 11), (0.1, 50, 3), (0.2, 50, 5)])
    tailed = (2.0, 2.0, 3.0, 4.0, 400.0)  # median 3, mean about 40, q0.9 400: likely short, a long tail
    cluster = pd_cluster(max_running_requests=1)
    result = simulation(trace, cluster, queue="sjf", predictions=[11.0, 3.0, 5.0], quantiles=[None, tailed, None],
                        order_key=order_key, aging_tokens_per_s=0.0).run()
    b_first = result.finish_times[1] < result.finish_times[2]
    assert b_first == (first == "B")


def test_tail_safe_in_the_simulator_can_class_by_the_upper_quantile(unit_steps):
    trace = make_trace([(0.0, 50, 11), (0.1, 50, 3), (0.2, 50, 5)])
    tailed = (2.0, 2.0, 3.0, 4.0, 2000.0)  # point 3, q0.9 2000: long by the quantile
    cluster = pd_cluster(max_running_requests=1)
    finishes = {}
    for quantile in (None, 0.9):
        result = simulation(trace, cluster, queue="tail-safe", predictions=[11.0, 3.0, 5.0],
                            quantiles=[None, tailed, None], long_class_quantile=quantile, long_holdback=1.0).run()
        finishes[quantile] = result.finish_times
    assert finishes[None][1] < finishes[None][2]  # FCFS between two short-class requests
    assert finishes[0.9][2] < finishes[0.9][1]  # B held back as long


# --- predictors -----------------------------------------------------------------------------------
def test_noisy_quantiles_are_a_log_normal_around_the_noisy_point():
    trace = make_trace([(float(i), 10, 100) for i in range(50)])
    points = predict_lengths(PredictorKind.NOISY, trace, 0, noise_sigma=0.5)
    quantiles = predicted_quantiles(PredictorKind.NOISY, trace, points, LEVELS, noise_sigma=0.5)
    for point, q in zip(points, quantiles):
        assert q[2] == pytest.approx(point)
        assert q[4] == pytest.approx(point * math.exp(0.5 * 1.2815515655446004))
    exact = predicted_quantiles(PredictorKind.NOISY, trace, points, LEVELS, noise_sigma=0.0)
    assert all(set(q) == {point} for q, point in zip(exact, points))
    assert predicted_quantiles(PredictorKind.ORACLE, trace, points, LEVELS) is None  # point masses
    assert predicted_quantiles(PredictorKind.NONE, trace, [None] * 50, LEVELS) is None


def plain_rows(levels=LEVELS):
    return [{"id": "0", "predicted_output_len": 10, "quantile_levels": list(levels), "quantiles": [0, 5, 10, 20, 40],
             "trajectory": [10, 9, 8], "quantile_trajectory": [[2, 5, 10, 20, 40], [1, 4, 8, 16, 30], [1, 3, 7, 9, 9]]},
            {"id": "1", "predicted_output_len": 900, "quantile_levels": list(levels),
             "quantiles": [300, 600, 900, 1400, 2000], "trajectory": [900],
             "quantile_trajectory": [[300, 600, 900, 1400, 2000]]}]


def write_rows(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_file_quantiles_join_by_id_from_plain_rows(tmp_path):
    trace = make_trace([(0.0, 10, 10), (1.0, 10, 1000)])
    path = write_rows(tmp_path / "p.jsonl", plain_rows())
    points = predict_lengths(PredictorKind.FILE, trace, 0, predictions_path=path)
    static = predicted_quantiles(PredictorKind.FILE, trace, points, LEVELS, predictions_path=path)
    assert static == [(1.0, 5.0, 10.0, 20.0, 40.0), (300.0, 600.0, 900.0, 1400.0, 2000.0)]  # a 0 total read as 1 token
    dynamic = predicted_quantile_trajectories(PredictorKind.FILE_DYNAMIC, trace, LEVELS, path)
    assert dynamic[0][1] == (1.0, 4.0, 8.0, 16.0, 30.0) and len(dynamic[1]) == 1
    assert predicted_quantile_trajectories(PredictorKind.FILE, trace, LEVELS, path) is None  # static predictor
    with pytest.raises(OutletsError, match=r"quantile_levels \[0.1, 0.25, 0.5, 0.75, 0.9\] differ from the "
                                           r"scheduling config's quantile_levels \[0.1, 0.5, 0.9\]"):
        predicted_quantiles(PredictorKind.FILE, trace, points, (0.1, 0.5, 0.9), predictions_path=path)


def test_file_quantiles_from_outlets_eval_record_by_predictor(tmp_path):
    rows = [{"id": str(i), "true_output_len": length, "censored": False, "static": {"outlets": length, "bert": 50.0},
             "dynamic": {"outlets": [length, length - 1]}, "quantile_levels": [0.1, 0.5, 0.9],
             "quantiles": {"outlets": {"static": [length // 2, length, length * 2],
                                       "dynamic": [[length // 2, length, length * 2], [1, length - 1, 2 * length]]}}}
            for i, length in enumerate((10, 1000))]
    path = tmp_path / "predictions.jsonl.gz"
    with gzip.open(path, "wt") as handle:
        handle.write("".join(json.dumps(row) + "\n" for row in rows))
    found = read_file_quantiles(str(path), "outlets")
    assert found.levels == (0.1, 0.5, 0.9)
    assert found.static == {"0": (5.0, 10.0, 20.0), "1": (500.0, 1000.0, 2000.0)}
    assert found.trajectories["1"][1] == (1.0, 999.0, 2000.0)
    assert read_file_quantiles(str(path), "bert").levels is None  # bert has no quantiles


def test_bad_file_quantiles_name_the_field(tmp_path):
    rows = plain_rows()
    rows[1]["quantiles"] = [5, 4, 3, 2, 1]
    with pytest.raises(OutletsError, match=r"id '1': quantiles must be 5 non-decreasing non-negative numbers"):
        read_file_quantiles(write_rows(tmp_path / "a.jsonl", rows))
    rows = plain_rows()
    rows[1]["quantile_levels"] = [0.1, 0.5, 0.9, 0.95, 0.99]
    with pytest.raises(OutletsError, match=r"id '1': quantile_levels .* differ from an earlier row's"):
        read_file_quantiles(write_rows(tmp_path / "b.jsonl", rows))
    rows = plain_rows()
    del rows[1]["quantiles"], rows[1]["quantile_levels"], rows[1]["quantile_trajectory"]
    trace = make_trace([(0.0, 10, 10), (1.0, 10, 1000)])
    with pytest.raises(OutletsError, match=r"trace id '1' has no quantiles \(1 of 2 missing\)"):
        predicted_quantiles(PredictorKind.FILE, trace, [10.0, 900.0], LEVELS,
                            predictions_path=write_rows(tmp_path / "c.jsonl", rows))


def test_distribution_settings_with_a_file_without_quantiles_are_refused_naming_them(tmp_path):
    trace = make_trace([(0.0, 10, 10), (1.0, 10, 1000)])
    path = write_rows(tmp_path / "p.jsonl", [{"id": "0", "predicted_output_len": 10, "trajectory": [10, 9]},
                                             {"id": "1", "predicted_output_len": 900, "trajectory": [900]}])
    cluster = cluster_config_from_dict({"kv_admission": "quantile"}, "test")
    plan = StudyPlan(rate_scales=[1.0], policies=policy_grid([RoutingPolicy.ROUND_ROBIN], [QueuePolicy.SJF]),
                     predictor=PredictorKind.FILE, study_predictors=[], study_routing=RoutingPolicy.ROUND_ROBIN,
                     noise_sigma=0.5, predictions_path=path, short_threshold=800, seed=0)
    with pytest.raises(OutletsError, match=r"kv_admission quantile \(cluster config\) read each request's predicted "
                                           r"distribution, but --predictions .* has no quantiles"):
        run_study(trace, cluster, SchedulingConfig(), plan)
    point_cluster = cluster_config_from_dict({"kv_admission": "max-new-tokens"}, "test")
    with pytest.raises(OutletsError, match=r"--order-key gittins, --long-class-quantile 0.9 read"):
        check_distribution_inputs(PredictorKind.FILE, None, None, point_cluster,
                                  SchedulingConfig(order_key="gittins", long_class_quantile=0.9), path)
    with pytest.raises(OutletsError, match="with --predictor file-dynamic .* has no quantile_trajectory"):
        check_distribution_inputs(PredictorKind.FILE_DYNAMIC, [LEVELS, LEVELS], None, cluster, SchedulingConfig(), path)
    # the point settings, noisy and oracle need no file quantiles
    check_distribution_inputs(PredictorKind.FILE, None, None, point_cluster, SchedulingConfig(), path)
    check_distribution_inputs(PredictorKind.ORACLE, None, None, cluster, SchedulingConfig(order_key="mean"), path)


# --- command --------------------------------------------------------------------------------------
def small_trace(tmp_path):
    lines = "".join(f'{{"timestamp": {i * 0.02}, "input_length": {100 + i % 7 * 300}, "output_length": {5 + i * 37 % 1200}, '
                    f'"id": "r{i}"}}\n' for i in range(200))
    return write(tmp_path, "trace.jsonl", lines)


def test_simulate_command_orders_and_admits_by_the_distribution(tmp_path, capsys):
    trace = small_trace(tmp_path)
    config = write(tmp_path, "c.yaml", "kv_admission: quantile\nkv_quantile: 0.8\nkv_capacity_tokens: 60000\n")
    out = tmp_path / "out"
    code = main(["simulate", "--trace", trace, "--config", config, "--output", str(out), "--routing", "round-robin",
                 "--queue", "sjf", "tail-safe", "--order-key", "gittins", "--long-class-quantile", "0.9",
                 "--predictor", "noisy", "--no-controlled-study"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["scheduling"]["order_key"] == "gittins" and summary["scheduling"]["long_class_quantile"] == 0.9
    assert summary["cluster"]["kv_admission"] == "quantile" and summary["cluster"]["kv_quantile"] == 0.8
    assert [run["metrics"]["all"]["requests"] for run in summary["runs"]] == [200, 200]


def test_simulate_command_takes_the_quantile_levels_of_the_file(tmp_path, capsys):
    trace = small_trace(tmp_path)
    rows = [{"id": f"r{i}", "predicted_output_len": 5 + i * 37 % 1200, "quantile_levels": [0.1, 0.5, 0.9],
             "quantiles": [1, 5 + i * 37 % 1200, 2 * (5 + i * 37 % 1200)]} for i in range(200)]
    path = write_rows(tmp_path / "p.jsonl", rows)
    out = tmp_path / "out"
    code = main(["simulate", "--trace", trace, "--config", "recipes/cluster-h100-1p3d.yaml", "--output", str(out),
                 "--routing", "round-robin", "--queue", "sjf", "--order-key", "risk", "--predictor", "file",
                 "--predictions", path])
    assert code == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["scheduling"]["quantile_levels"] == [0.1, 0.5, 0.9]
    assert {run["predictor"] for run in summary["runs"]} == {"file", "none", "noisy", "oracle"}


def test_simulate_command_refuses_a_bad_order_key_and_quantile(tmp_path, capsys):
    trace = small_trace(tmp_path)
    with pytest.raises(SystemExit):
        main(["simulate", "--trace", trace, "--config", "recipes/cluster-h100-1p3d.yaml", "--output",
              str(tmp_path / "o"), "--order-key", "cvar"])
    assert "--order-key: invalid choice: 'cvar'" in capsys.readouterr().err
    code = main(["simulate", "--trace", trace, "--config", "recipes/cluster-h100-1p3d.yaml", "--output",
                 str(tmp_path / "o"), "--long-class-quantile", "1.5"])
    err = capsys.readouterr().err
    assert code == 2 and "long_class_quantile must be None or strictly between 0 and 1, got 1.5" in err


def test_the_study_hands_each_predictor_its_quantiles(tmp_path, monkeypatch):
    import specforge_outlets.simulation.study as study

    trace = make_trace([(0.0, 10, 10), (1.0, 10, 1000)])
    path = write_rows(tmp_path / "p.jsonl", plain_rows())
    seen = {}

    class Recording(Simulation):
        def __init__(self, trace, predictions, cluster, policy, scheduling, trajectories, seed, quantiles,
                     quantile_trajectories):
            seen[tuple(predictions)] = (quantiles, quantile_trajectories)
            super().__init__(trace, predictions, cluster, policy, scheduling, trajectories, seed, quantiles,
                             quantile_trajectories)

    monkeypatch.setattr(study, "Simulation", Recording)
    cluster = cluster_config_from_dict({"kv_admission": "quantile"}, "test")
    plan = StudyPlan(rate_scales=[1.0], policies=policy_grid([RoutingPolicy.ROUND_ROBIN], [QueuePolicy.SJF]),
                     predictor=PredictorKind.FILE_DYNAMIC, study_predictors=[PredictorKind.ORACLE],
                     study_routing=RoutingPolicy.ROUND_ROBIN, noise_sigma=0.5, predictions_path=path,
                     short_threshold=800, seed=0)
    rows = run_study(trace, cluster, SchedulingConfig(order_key="mean"), plan)
    assert len(rows) == 2
    quantiles, trajectories = seen[(10.0, 900.0)]
    assert quantiles[1] == (300.0, 600.0, 900.0, 1400.0, 2000.0) and trajectories[0][2] == (1.0, 3.0, 7.0, 9.0, 9.0)
    assert seen[(10.0, 1000.0)] == (None, None)  # the oracle: point masses
