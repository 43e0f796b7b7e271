"""The simulator's KV admission modes beside the plugin's: SGLang's own (kv_admission: sglang).

That SGLang decides the same is tested in the serve environment (tests/test_sglang_admission.py);
here: where the mode applies, and that every request of a cache-bound run finishes under every order.
"""

import dataclasses

import numpy as np
import pytest

from specforge_outlets.errors import OutletsError
from specforge_outlets.scheduling import SchedulingConfig
from specforge_outlets.simulation import sglang_admission
from specforge_outlets.simulation.cluster import cluster_config_from_dict
from specforge_outlets.simulation.engine import Policy, Simulation
from specforge_outlets.simulation.predictors import PredictorKind, predict_lengths
from specforge_outlets.simulation.sglang_peers import queue_policy, routing_policy
from tests.binding_cache import binding_cluster, binding_trace


def test_sglang_admission_is_refused_for_disaggregated_decode_instances():
    with pytest.raises(OutletsError, match="kv_admission sglang models SGLang's PrefillAdder.*set mode colocated"):
        cluster_config_from_dict({"mode": "disaggregated", "kv_admission": "sglang"}, "test")


@pytest.mark.parametrize("queue", ["fcfs", "sjf", "tail-safe", "lof", "shortest-prefill-first", "hrrn"])
def test_every_request_finishes_under_sglang_admission_in_a_cache_that_binds(queue):
    trace, cluster = binding_trace(), binding_cluster("sglang")
    result = Simulation(trace, predict_lengths(PredictorKind.NOISY, trace, 0), cluster,
                        Policy(routing_policy("round-robin"), queue_policy(queue)), SchedulingConfig()).run()
    assert np.isfinite(result.finish_times).all() and (result.finish_times >= result.first_token_times).all()
    assert result.retractions.sum() > 0  # SGLang's ratio admits more than can finish together


def test_sglang_tuned_by_its_ratio_knobs_runs_with_its_ratio():
    """The cluster's knobs reach every instance's ratio; a lower, faster-decaying one admits more, so the run
    retracts at least as often (SGLang's defaults are the cluster's)."""
    trace, policy = binding_trace(), Policy(routing_policy("round-robin"), queue_policy("fcfs"))
    eager = dataclasses.replace(binding_cluster("sglang"), schedule_conservativeness=0.5,
                                min_new_token_ratio_factor=0.05, new_token_ratio_decay_steps=150)
    simulation = Simulation(trace, [None] * len(trace), eager, policy, SchedulingConfig())
    assert all(engine.new_token_ratio == sglang_admission.NewTokenRatio.tuned(0.5, 0.05, 150)
               for engine in simulation.engines)
    default = Simulation(trace, [None] * len(trace), binding_cluster("sglang"), policy, SchedulingConfig()).run()
    assert simulation.run().retractions.sum() >= default.retractions.sum()


def test_the_ratio_knobs_are_sglangs_defaults_unless_tuned():
    assert sglang_admission.NewTokenRatio.tuned(1.0, 0.14, 600) == sglang_admission.NewTokenRatio()
    ratio = sglang_admission.NewTokenRatio.tuned(2.0, 0.05, 150)
    assert (ratio.init, ratio.current, ratio.minimum) == pytest.approx((1.0, 1.0, 0.05))
    with pytest.raises(OutletsError, match="new_token_ratio_decay_steps must be a positive integer"):
        cluster_config_from_dict({"new_token_ratio_decay_steps": 0}, "test")
