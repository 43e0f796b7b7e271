"""The map's clusters, regimes, configurations and rungs.

A regime is a cluster, an arrival process and a draw of requests; a cell is a regime at one shape (requests per
run) and load (a fraction of the cluster's measured capacity; a batch has none) for one seed. Every cell runs
SGLang's prediction-free peers (rung none) and the prediction configurations, each with its rungs. The label set's
samples (the ladder's workload) are the requests everywhere, serving Llama-3.1-8B with the GPU's own cache: on
H100s, or on L4s, a card whose cache binds.

The prediction configurations are the plugin layered on the peers users pick (``layered``): the peer's routing,
ratio knobs and --max-running-requests, with the plugin's order and KV admission. Orders and admission are read
from the plugin's settings (``sglang_patches.settings``) and the scheduling core, routing from the simulator's
spelling of ``--load-balance-method outlets``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Optional, Tuple

from sglang_patches.settings import ORDERS, POLICY_NAME
from specforge_outlets.scheduling import DEFAULT_KV_ADMISSION, KVAdmission, QueuePolicy
from specforge_outlets.simulation.cluster import ClusterConfig, ClusterMode, PredictionPoint
from specforge_outlets.simulation.hardware import L4
from specforge_outlets.simulation.sglang_peers import routing_policy
from specforge_outlets.studies import sharegpt_serving as study
from specforge_outlets.studies.predictor_ladder.cells import BALANCING, KNOB_GRID, SGLANG_DEFAULT, Setup


def pd(prefill: int, decode: int) -> ClusterConfig:
    """Disaggregated: SGLang's decode pre-allocation, 256 running per decode instance."""
    return dataclasses.replace(study.cluster_for("1P+3D", KVAdmission.SGLANG, None), prefill_instances=prefill,
                               decode_instances=decode)


def colocated(name: str) -> ClusterConfig:
    """Data-parallel colocated instances, as the ladder's (``sharegpt_serving.cluster_for``)."""
    return study.cluster_for(name, KVAdmission.SGLANG, None)


# SGLang 0.5.23's --chunked-prefill-size on a card under 35 GiB (arg_groups/memory_hook.py)
L4_CHUNKED_PREFILL_SIZE = 4096


def colocated_l4() -> ClusterConfig:
    """Four data-parallel L4s serving Llama-3.1-8B: the datasheet's step time (``hardware.L4``), SGLang's chunk for a
    card of its size, and the cache its memory leaves at the simulator's memory fraction (0.88, as the H100's).
    ``kv_capacity()``: (24 GB x 0.88 - 16.06 GB of weights) / 128 KiB per token = 38,604 tokens per instance (an
    H100's: 454,188), so SGLang's reservation of max_new_tokens (2,048) per request binds the cache long before
    the 256-request cap. (SGLang 0.5.23's own --mem-fraction-static heuristic would reserve about 6.9 GiB for
    activations and graphs there, leaving an 8B model about 6k tokens: a user serving it on an L4 sets the
    fraction.)"""
    return dataclasses.replace(colocated("colocated x4"), gpu=L4.name, chunked_prefill_size=L4_CHUNKED_PREFILL_SIZE)


CLUSTERS: Dict[str, Callable[[], ClusterConfig]] = {
    "colocated x4": lambda: colocated("colocated x4"),  # data-parallel, as the ladder
    "PD 2P+2D": lambda: pd(2, 2),  # decode-bound
    "PD 1P+3D": lambda: pd(1, 3),  # the paper's
    "colocated x4 L4": colocated_l4,  # memory-poor: the cache binds
}
# requests/s near each cluster's capacity (issue 45's figures; L4: a rough first bisection); the bisection's first
# bracket is half to 1.5 times it
CAPACITY_HINTS = {"colocated x4": 50.0, "PD 2P+2D": 32.0, "PD 1P+3D": 48.0, "colocated x4 L4": 1.5}
CAPACITY_REQUESTS = 16000  # per bisection probe: a shorter trace is still filling when its window opens

LOADS = (0.7, 0.9, 1.0, 1.2)  # fractions of capacity
ONLINE_REQUESTS = 4000  # per online run (a run of 4,000 takes about a second of one core)
# a longer trace at capacity, where the queue still builds inside the 4,000-request window
LONG_REQUESTS = 16000
LONG_LOAD = 1.0
BATCH_SHAPES = (2000, 5000)  # requests at once


@dataclasses.dataclass(frozen=True)
class Regime:
    cluster: str  # of CLUSTERS
    arrivals: str  # of arrivals.ARRIVALS
    draw: str = "uniform"  # of requests.DRAWS: which of the workload's samples a run's requests are
    long_trace: bool = False  # also LONG_REQUESTS requests at LONG_LOAD

    @property
    def batch(self) -> bool:
        return self.arrivals == "batch"


REGIMES = {
    "colocated": Regime("colocated x4", "poisson", long_trace=True),
    "colocated, bursts": Regime("colocated x4", "poisson-burst"),
    "colocated, recorded timing": Regime("colocated x4", "recorded (azure-conv)"),
    "PD 2P+2D": Regime("PD 2P+2D", "poisson", long_trace=True),
    "PD 2P+2D, bursts": Regime("PD 2P+2D", "poisson-burst"),
    "PD 1P+3D": Regime("PD 1P+3D", "poisson"),
    "memory-poor colocated": Regime("colocated x4 L4", "poisson"),
    "memory-poor colocated, bursts": Regime("colocated x4 L4", "poisson-burst"),
    "offline batch": Regime("colocated x4", "batch"),
    # data regeneration, RL rollouts: every sample of each prompt at once (the whole label set, 4 per prompt); on
    # the H100s the 1,012 samples fit the 4 x 256 running slots at once (no queue for an order to act on); on the
    # L4s their cache binds and a queue forms
    "offline batch, 4 samples per prompt": Regime("colocated x4", "batch", draw="prompt groups"),
    "memory-poor offline batch, 4 samples per prompt": Regime("colocated x4 L4", "batch", draw="prompt groups"),
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


def layered(peer: Configuration, queue: QueuePolicy, admission: KVAdmission, routing: Optional[str] = None
            ) -> Configuration:
    """The plugin over a peer: the peer's routing (unless ``routing``), ratio knobs and --max-running-requests,
    with the plugin's order and KV admission."""
    setup = dataclasses.replace(peer.setup, queue=queue.value, admission=admission,
                                routing=routing or peer.setup.routing)
    return dataclasses.replace(peer, setup=setup)


PLUGIN_ORDER = ORDERS[0]  # --schedule-policy outlets' default order
# the rule --load-balance-method outlets routes by (opt-in: --schedule-policy outlets keeps SGLang's balancing)
PLUGIN_ROUTING = routing_policy(POLICY_NAME).value
TOTAL_REQUESTS = "total_requests"  # of BALANCING: the peer every other prediction configuration is layered on


def layer_bases(mode: ClusterMode) -> Dict[str, str]:
    """The peers the plugin is layered on, by the name its configurations give them: SGLang's default, and
    total_requests with SGLang's default knobs (PD: with --max-running-requests PD_MAX_RUNNING)."""
    total = Configuration(Setup(BALANCING[TOTAL_REQUESTS], "fcfs", KVAdmission.SGLANG),
                          None if mode is ClusterMode.COLOCATED else PD_MAX_RUNNING)
    return {"SGLang default": SGLANG_DEFAULT,
            TOTAL_REQUESTS: next(name for name, peer in peers(mode).items() if peer == total)}


PLUGIN_DEFAULT = "plugin default"  # the prefix of the plugin's default layered on a peer
PLUGIN_ROUTING_CONFIG = "plugin routing"
# the predicted future peak (--outlets-kv-admission peak, opt-in) with the plugin's default order over total_requests;
# colocated only (the peak gates SGLang's PrefillAdder)
PEAK_CONFIG = f"{KVAdmission.PEAK.value} admission over {TOTAL_REQUESTS}"
# the rungs of a configuration other than the plugin's default: its controls, the learned r̂₀ and the oracle
FEW_RUNGS = ("constant", "outlets r0 shuffled", "outlets r0", "oracle")


@dataclasses.dataclass(frozen=True)
class PredictionConfig:
    """A configuration that reads r̂₀, the peer it is layered on (a key of ``peers``) and the rungs it runs."""

    configuration: Configuration
    over: str
    rungs: Tuple[str, ...]


def prediction_configs(mode: ClusterMode, batch: bool = False) -> Dict[str, PredictionConfig]:
    """The plugin's default over each base (every rung); over total_requests, SJF (the core's aging) and tail-safe
    with classes from ranks, and in a batch longest-predicted-first; the plugin's opt-in routing with its default
    order and admission, over total_requests' knobs; colocated, its opt-in peak admission with its default order
    over total_requests (these: ``FEW_RUNGS``)."""
    every = peers(mode)
    made = {f"{PLUGIN_DEFAULT} over {base}": PredictionConfig(layered(every[peer], PLUGIN_ORDER, DEFAULT_KV_ADMISSION),
                                                               peer, RUNGS)
            for base, peer in layer_bases(mode).items()}
    over = layer_bases(mode)[TOTAL_REQUESTS]
    orders = [QueuePolicy.SJF, QueuePolicy.TAIL_SAFE_RANKS] + ([QueuePolicy.LONGEST_FIRST] if batch else [])
    made.update({f"{order.value} over {TOTAL_REQUESTS}": PredictionConfig(
        layered(every[over], order, KVAdmission.SGLANG), over, FEW_RUNGS) for order in orders})
    made[PLUGIN_ROUTING_CONFIG] = PredictionConfig(
        layered(every[over], PLUGIN_ORDER, DEFAULT_KV_ADMISSION, PLUGIN_ROUTING), over, FEW_RUNGS)
    if mode is ClusterMode.COLOCATED:
        made[PEAK_CONFIG] = PredictionConfig(layered(every[over], PLUGIN_ORDER, KVAdmission.PEAK), over, FEW_RUNGS)
    return made


# the ladder's rungs: no information, its controls, the learned r̂₀, the ceiling, the oracle
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
