"""The simulator's KV admission modes beside the plugin's: SGLang's own (kv_admission: sglang).

That SGLang decides the same is tested in the serve environment (tests/test_sglang_admission.py);
here: where the mode applies, and that every request of a cache-bound run finishes under every order.
"""

import numpy as np
import pytest

from specforge_outlets.errors import OutletsError
from specforge_outlets.scheduling import SchedulingConfig
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
