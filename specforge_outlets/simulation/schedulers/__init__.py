"""One scheduler per simulated engine model, chosen from the cluster config (:func:`create_scheduler`).

- :class:`SGLangColocatedScheduler`: SGLang's colocated instance under its own admission or the plugin's
  (``sglang``, ``predicted``, ``quantile``, ``peak``, ``past-future``);
- :class:`SGLangDecodeScheduler`: SGLang's disaggregated decode instance (``sglang``: its pre-allocation);
- :class:`VLLMScheduler`: vLLM v1's (``vllm``, ``vllm-0.13``, colocated);
- :class:`ReservationScheduler` and :class:`ReservationDecodeScheduler`: the simulator's reference, a KV
  reservation per request (``max-new-tokens``; on a decode instance ``predicted`` and ``quantile`` too).

They share the event loop (:mod:`.segments`) and the batch (:mod:`.base`); each asks the scheduling core's
admission strategies (``scheduling.kv_admission``) at its own rounds.
"""

from __future__ import annotations

from typing import Dict, Tuple, Type

from specforge_outlets.scheduling import CHARGE_ADMISSIONS, VLLM_ADMISSIONS, KVAdmission
from specforge_outlets.simulation.cluster import ClusterMode
from specforge_outlets.simulation.cluster_run import ClusterRun
from specforge_outlets.simulation.schedulers.base import Scheduler
from specforge_outlets.simulation.schedulers.reservation import ReservationDecodeScheduler, ReservationScheduler
from specforge_outlets.simulation.schedulers.sglang_colocated import SGLangColocatedScheduler
from specforge_outlets.simulation.schedulers.sglang_decode import SGLangDecodeScheduler
from specforge_outlets.simulation.schedulers.vllm import VLLMScheduler

# the engine model of each (mode, kv_admission) the simulator runs; the others are refused by
# cluster.check_kv_admission (peak and vLLM's admissions on disaggregated decode instances)
SCHEDULERS: Dict[Tuple[ClusterMode, KVAdmission], Type[Scheduler]] = {
    **{(ClusterMode.COLOCATED, rule): SGLangColocatedScheduler for rule in CHARGE_ADMISSIONS},
    **{(ClusterMode.COLOCATED, rule): VLLMScheduler for rule in VLLM_ADMISSIONS},
    (ClusterMode.COLOCATED, KVAdmission.MAX_NEW_TOKENS): ReservationScheduler,
    (ClusterMode.DISAGGREGATED, KVAdmission.SGLANG): SGLangDecodeScheduler,
    **{(ClusterMode.DISAGGREGATED, rule): ReservationDecodeScheduler
       for rule in (KVAdmission.MAX_NEW_TOKENS, KVAdmission.PREDICTED, KVAdmission.QUANTILE)},
}


def create_scheduler(sim: ClusterRun, engine_id: int) -> Scheduler:
    """The scheduler of one instance that decodes (colocated, or a disaggregated decode instance)."""
    return SCHEDULERS[sim.cluster.mode, sim.cluster.kv_admission](sim, engine_id)


__all__ = ["SCHEDULERS", "ReservationDecodeScheduler", "ReservationScheduler", "SGLangColocatedScheduler",
           "SGLangDecodeScheduler", "Scheduler", "VLLMScheduler", "create_scheduler"]
