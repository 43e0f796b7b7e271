"""A workload whose KV cache binds, shared by the tests of the simulator's engine-faithful admissions."""

from __future__ import annotations

import numpy as np

from specforge_outlets.serving.trace import Trace
from specforge_outlets.simulation.cluster import cluster_config_from_dict

COUNT = 300  # requests: 2 instances of 12,000 tokens cannot hold them at once


def binding_trace() -> Trace:
    """300 requests over 5 s, prompts of 20-1,500 tokens, a fifth of them 500-2,000 output tokens."""
    rng = np.random.default_rng(2)
    return Trace("bound", [str(i) for i in range(COUNT)], np.sort(rng.uniform(0, 5, COUNT)),
                 rng.integers(20, 1500, COUNT), np.where(rng.random(COUNT) < 0.2, rng.integers(500, 2000, COUNT),
                                                         rng.integers(2, 200, COUNT)))


def binding_cluster(kv_admission: str):
    """Two colocated instances of 12,000 KV tokens each, requests capped at 1,024 tokens."""
    return cluster_config_from_dict({"mode": "colocated", "instances": 2, "kv_capacity_tokens": 12_000,
                                     "max_new_tokens": 1024, "kv_admission": kv_admission}, "test")
