"""The map's clusters, regimes, configurations and rungs.

A regime is a cluster and an arrival process; a cell is a regime at one shape (requests per run) and load (a
fraction of the cluster's measured capacity; a batch has none) for one seed. Every cell runs SGLang's
prediction-free peers (rung none) and every prediction configuration with every rung. The label set's samples
(the ladder's workload) are the requests everywhere, on H100s serving Llama-3.1-8B with the GPU's own cache.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Optional, Tuple

from specforge_outlets.scheduling import KVAdmission
from specforge_outlets.simulation.cluster import ClusterConfig, ClusterMode, PredictionPoint
from specforge_outlets.studies import sharegpt_serving as study
from specforge_outlets.studies.predictor_ladder.cells import BALANCING, KNOB_GRID, SGLANG_DEFAULT, Setup


def pd(prefill: int, decode: int) -> ClusterConfig:
    """Disaggregated: SGLang's decode pre-allocation, 256 running per decode instance."""
    return dataclasses.replace(study.cluster_for("1P+3D", KVAdmission.SGLANG, None), prefill_instances=prefill,
                               decode_instances=decode)


CLUSTERS: Dict[str, Callable[[], ClusterConfig]] = {
    "colocated x4": lambda: study.cluster_for("colocated x4", KVAdmission.SGLANG, None),  # data-parallel, as the ladder
    "PD 2P+2D": lambda: pd(2, 2),  # decode-bound
    "PD 1P+3D": lambda: pd(1, 3),  # the paper's
}
# requests/s near each cluster's capacity (issue 45's figures); the bisection's first bracket is half to 1.5 times it
CAPACITY_HINTS = {"colocated x4": 50.0, "PD 2P+2D": 32.0, "PD 1P+3D": 48.0}
CAPACITY_REQUESTS = 16000  # per bisection probe: a shorter trace is still filling when its window opens

LOADS = (0.7, 0.9, 1.0, 1.2)  # fractions of capacity
ONLINE_REQUESTS = 4000  # per online run (a run of 4,000 takes about a second of one core)
BATCH_SHAPES = (2000, 5000)  # requests at once


@dataclasses.dataclass(frozen=True)
class Regime:
    cluster: str  # of CLUSTERS
    arrivals: str  # of arrivals.ARRIVALS

    @property
    def batch(self) -> bool:
        return self.arrivals == "batch"


REGIMES = {
    "colocated": Regime("colocated x4", "poisson"),
    "colocated, bursts": Regime("colocated x4", "poisson-burst"),
    "colocated, recorded timing": Regime("colocated x4", "recorded (azure-conv)"),
    "PD 2P+2D": Regime("PD 2P+2D", "poisson"),
    "PD 2P+2D, bursts": Regime("PD 2P+2D", "poisson-burst"),
    "PD 1P+3D": Regime("PD 1P+3D", "poisson"),
    "offline batch": Regime("colocated x4", "batch"),
}


def load_label(load: Optional[float]) -> str:
    if load is None:
        return "at once"
    return "overload" if load > 1.0 else "at capacity" if load == 1.0 else "below capacity"


@dataclasses.dataclass(frozen=True)
class Configuration:
    """A scheduler configuration, and SGLang's --max-running-requests where a peer sets it (None: the cluster's)."""

    setup: Setup
    max_running_requests: Optional[int] = None

    def cluster(self, base: ClusterConfig) -> ClusterConfig:
        conservativeness, min_factor, decay_steps = self.setup.knobs
        return dataclasses.replace(base, kv_admission=self.setup.admission,
                                   max_running_requests=self.max_running_requests or base.max_running_requests,
                                   schedule_conservativeness=conservativeness, min_new_token_ratio_factor=min_factor,
                                   new_token_ratio_decay_steps=decay_steps)


PD_MAX_RUNNING = 512  # a PD peer's --max-running-requests: the decode instance's KV holds twice the default's


def peers(mode: ClusterMode) -> Dict[str, Configuration]:
    """SGLang's prediction-free configurations: its default, and its balancing with tuned ratio knobs (colocated:
    the ladder's grid; a decode instance's pre-allocation reads no ratio, so PD tunes --max-running-requests)."""
    made = {SGLANG_DEFAULT: Configuration(Setup("round-robin", "fcfs", KVAdmission.SGLANG))}
    if mode is ClusterMode.COLOCATED:
        made.update({f"SGLang {name} c{c:g} f{f:g} d{d}": Configuration(Setup(routing, "fcfs", KVAdmission.SGLANG,
                                                                                (c, f, d)))
                     for name, routing in BALANCING.items() for c, f, d in KNOB_GRID})
    else:
        made.update({f"SGLang {name}": Configuration(Setup(routing, "fcfs", KVAdmission.SGLANG))
                     for name, routing in BALANCING.items()})
        made[f"SGLang total_requests, max running {PD_MAX_RUNNING}"] = Configuration(
            Setup("least-requests", "fcfs", KVAdmission.SGLANG), PD_MAX_RUNNING)
    return made


PLUGIN_DEFAULT = "plugin default"


def prediction_configs(mode: ClusterMode) -> Dict[str, Configuration]:
    """The configurations that read r̂₀, each run with every rung: the plugin's default (tail-safe, least predicted
    work, and colocated its KV by the predicted peak; PD decode keeps SGLang's pre-allocation, the peak being a
    PrefillAdder rule) and SJF by r̂₀ under SGLang's admission, with the plugin's routing or SGLang's best balancing."""
    default_admission = KVAdmission.PEAK if mode is ClusterMode.COLOCATED else KVAdmission.SGLANG
    return {PLUGIN_DEFAULT: Configuration(Setup("least-predicted-work", "tail-safe", default_admission)),
            "sjf, least-predicted-work": Configuration(Setup("least-predicted-work", "sjf", KVAdmission.SGLANG)),
            "sjf, total_requests": Configuration(Setup("least-requests", "sjf", KVAdmission.SGLANG))}


# the ladder's rungs run in every cell: no information, its controls, the learned r̂₀, the ceiling, the oracle
RUNGS = ("none", "constant", "outlets r0 shuffled", "outlets r0", "probe-mid (N/2)", "ceiling", "oracle")
CONTROLS = ("constant", "outlets r0 shuffled")

# where r̂₀ becomes known: online at the end of prefill (the cluster's predict_at), so it cannot order a request's
# own first admission; a batch may also run a prefill-only pass first (metrics.prediction_pass_s) and know it
# before any admission: charged, an upper bound on its cost (the simulator prefills each prompt again), and free,
# a lower bound (as if the pass cost nothing), between which the real cost lies
AT_PREFILL = "at prefill"
AT_ARRIVAL = "at arrival (prefill-only pass charged)"
AT_ARRIVAL_FREE = "at arrival (free: a lower bound)"
POINTS: Dict[str, Tuple[PredictionPoint, bool]] = {AT_PREFILL: (PredictionPoint.PREFILL, False),
                                                    AT_ARRIVAL: (PredictionPoint.ARRIVAL, True),
                                                    AT_ARRIVAL_FREE: (PredictionPoint.ARRIVAL, False)}
BOUNDS = (AT_ARRIVAL_FREE,)  # points no deployment reaches: shown, never a configuration's headline
