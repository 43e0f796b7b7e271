"""The simulator's KV admission modes beside the plugin's: SGLang's own (kv_admission: sglang).

That SGLang decides the same is tested in the serve environment (tests/test_sglang_admission.py);
here: where the mode applies, and that every request of a cache-bound run finishes under every order.
"""

import numpy as np
import pytest

from specforge_outlets.errors import OutletsError
from specforge_outlets.scheduling import SchedulingConfig
from specforge_outlets.serving.trace import Trace
from specforge_outlets.simulation.cluster import cluster_config_from_dict
from specforge_outlets.simulation.engine import Policy, Simulation
from specforge_outlets.simulation.predictors import PredictorKind, predict_lengths
from specforge_outlets.simulation.sglang_peers import queue_policy, routing_policy


def test_sglang_admission_is_refused_for_disaggregated_decode_instances():
    with pytest.raises(OutletsError, match="kv_admission sglang models SGLang's PrefillAdder.*set mode colocated"):
        cluster_config_from_dict({"mode": "disaggregated", "kv_admission": "sglang"}, "test")


@pytest.mark.parametrize("queue", ["fcfs", "sjf", "tail-safe", "lof", "shortest-prefill-first", "hrrn"])
def test_every_request_finishes_under_sglang_admission_in_a_cache_that_binds(queue):
    rng = np.random.default_rng(2)
    count = 300
    trace = Trace("bound", [str(i) for i in range(count)], np.sort(rng.uniform(0, 5, count)),
                  rng.integers(20, 1500, count), np.where(rng.random(count) < 0.2, rng.integers(500, 2000, count),
                                                          rng.integers(2, 200, count)))
    cluster = cluster_config_from_dict({"mode": "colocated", "instances": 2, "kv_capacity_tokens": 12_000,
                                        "max_new_tokens": 1024, "kv_admission": "sglang"}, "test")
    result = Simulation(trace, predict_lengths(PredictorKind.NOISY, trace, 0), cluster,
                        Policy(routing_policy("round-robin"), queue_policy(queue)), SchedulingConfig()).run()
    assert np.isfinite(result.finish_times).all() and (result.finish_times >= result.first_token_times).all()
    assert result.retractions.sum() > 0  # SGLang's ratio admits more than can finish together
