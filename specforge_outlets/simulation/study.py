"""The studies `outlets simulate` runs: every policy combination against load, and the controlled
study (SJF fixed, predictor varied).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from specforge_outlets.errors import OutletsError
from specforge_outlets.scheduling import OrderKey, QueuePolicy, RoutingPolicy, SchedulingConfig
from specforge_outlets.simulation.cluster import ClusterConfig, KVAdmission
from specforge_outlets.simulation.engine import Policy, Simulation, check_policy
from specforge_outlets.simulation.predicted_lengths import (
    PredictorKind,
    predict_lengths,
    predicted_quantile_trajectories,
    predicted_quantiles,
    predicted_trajectories,
)
from specforge_outlets.serving.metrics import DEFAULT_SHORT_THRESHOLD, summarize_requests
from specforge_outlets.serving.trace import Trace
from specforge_outlets.simulation.engine import SimulationResult

def summarize(result: SimulationResult, short_threshold: int = DEFAULT_SHORT_THRESHOLD,
              slo: Optional[Dict[str, float]] = None, as_sglang_reports: bool = False) -> Dict[str, Dict[str, float]]:
    """Metrics per class of a simulated run: ``all``, ``short`` (< threshold output tokens) and ``long``.

    ``as_sglang_reports``: TTFT (and so TPOT) from the first decode batch, as SGLang's PD decode streams it
    (``SimulationResult.reported_first_token_times``); by default from the KV landing on the decode instance."""
    return summarize_requests(
        arrival_times=result.arrival_times,
        first_token_times=result.reported_first_token_times if as_sglang_reports else result.first_token_times,
        finish_times=result.finish_times,
        output_lens=result.output_lens,
        queue_delays=result.queue_delays,
        waits={"prefill_queue": result.prefill_queue_delays, "transfer": result.transfer_times,
               "decode_queue": result.decode_queue_delays},
        short_threshold=short_threshold,
        slo=slo,
        token_gaps=result.token_gaps.gaps,
    )


POLICY_STUDY = "policies"
PREDICTOR_STUDY = "predictors"


@dataclass(frozen=True)
class StudyPlan:
    """What to run: rate scales, the policy grid with its predictor, and the controlled study."""

    rate_scales: Sequence[float]
    policies: Sequence[Policy]
    predictor: PredictorKind
    study_predictors: Sequence[PredictorKind]  # empty: no controlled study
    study_routing: RoutingPolicy
    noise_sigma: float
    predictions_path: Optional[str]
    short_threshold: int
    seed: int
    slo: Optional[Dict[str, float]] = None  # seconds per latency (serving.metrics.SLO_METRICS): goodput
    file_predictor: Optional[str] = None  # the predictor to read from a predictions file of several


def policy_grid(routings: Sequence[RoutingPolicy], queues: Sequence[QueuePolicy]) -> List[Policy]:
    """Every routing x queue-order combination."""
    return [Policy(routing, queue) for routing, queue in itertools.product(routings, queues)]


def run_study(
    trace: Trace,
    cluster: ClusterConfig,
    scheduling: SchedulingConfig,
    plan: StudyPlan,
    progress: Callable[[str], None] = lambda line: None,
) -> List[Dict]:
    """Run the plan; one row per (study, policy, predictor, rate scale)."""
    runs = [(POLICY_STUDY, policy, plan.predictor) for policy in plan.policies]
    sjf = Policy(plan.study_routing, QueuePolicy.SJF)
    runs += [(PREDICTOR_STUDY, sjf, predictor) for predictor in plan.study_predictors]
    for _, policy, _ in runs:  # refused before any runs
        check_policy(cluster, policy)
    kinds = {predictor for _, _, predictor in runs}
    predictions = {kind: predict_lengths(kind, trace, plan.seed, plan.noise_sigma, plan.predictions_path,
                                         plan.file_predictor) for kind in kinds}
    trajectories = {kind: predicted_trajectories(kind, trace, plan.predictions_path, plan.file_predictor)
                    for kind in kinds}
    levels = scheduling.quantile_levels
    quantiles = {kind: predicted_quantiles(kind, trace, predictions[kind], levels, plan.noise_sigma,
                                           plan.predictions_path, plan.file_predictor) for kind in kinds}
    quantile_trajectories = {kind: predicted_quantile_trajectories(kind, trace, levels, plan.predictions_path,
                                                                   plan.file_predictor) for kind in kinds}
    for kind in sorted(kinds, key=lambda kind: kind.value):
        check_distribution_inputs(kind, quantiles[kind], quantile_trajectories[kind], cluster, scheduling,
                                  plan.predictions_path, plan.file_predictor)
    rows = []
    for rate_scale in plan.rate_scales:
        scaled = trace.scaled(rate_scale)
        for study, policy, predictor in runs:
            started = time.perf_counter()
            result = Simulation(scaled, predictions[predictor], cluster, policy, scheduling,
                                trajectories[predictor], plan.seed, quantiles[predictor],
                                quantile_trajectories[predictor]).run()
            wall_s = time.perf_counter() - started
            metrics = summarize(result, plan.short_threshold, plan.slo)
            rows.append({
                "study": study,
                "routing": policy.routing.value,
                "queue": policy.queue.value,
                "predictor": predictor.value,
                "rate_scale": rate_scale,
                "offered_rps": scaled.offered_rps,
                "offered_output_tok_s": float(scaled.output_lens.sum()) / scaled.duration_s,
                "sim_wall_s": wall_s,
                "metrics": metrics,
            })
            progress(
                f"x{rate_scale:g} {study:10s} {policy.label:30s} {predictor.value:12s} "
                f"thr {metrics['all']['throughput_tok_s']:8.0f} tok/s  short P99 {metrics['short']['e2e_p99_s']:7.2f} s  "
                f"({wall_s:.1f} s)"
            )
    return rows


def distribution_settings(cluster: ClusterConfig, scheduling: SchedulingConfig) -> List[str]:
    """The settings of a run that read each request's predicted distribution, as a user names them."""
    settings = []
    if cluster.kv_admission is KVAdmission.QUANTILE:
        settings.append("kv_admission quantile (cluster config)")
    if scheduling.order_key is not OrderKey.POINT:
        settings.append(f"--order-key {scheduling.order_key.value}")
    if scheduling.long_class_quantile is not None:
        settings.append(f"--long-class-quantile {scheduling.long_class_quantile:g}")
    return settings


def check_distribution_inputs(kind: PredictorKind, quantiles, quantile_trajectories, cluster: ClusterConfig,
                              scheduling: SchedulingConfig, predictions_path: Optional[str],
                              file_predictor: Optional[str] = None) -> None:
    """Refuse a file predictor without quantiles where a setting reads distributions.

    Without quantiles every request would be a point mass at its point prediction, and the run
    would silently be the point prediction's. (noisy always has quantiles; oracle and none are point
    masses by design.) file-dynamic needs the quantiles re-predicted with the point.
    """
    settings = distribution_settings(cluster, scheduling)
    if not settings or kind not in (PredictorKind.FILE, PredictorKind.FILE_DYNAMIC):
        return
    whose = f" for --file-predictor {file_predictor!r}" if file_predictor else ""
    if quantiles is None:
        raise OutletsError(
            f"{', '.join(settings)} read each request's predicted distribution, but --predictions {predictions_path} "
            f"has no quantiles{whose} joined to the trace ids (quantile_levels, quantiles): use a file with quantiles, "
            "--predictor noisy (log-normal around its point), or the point settings")
    if kind is PredictorKind.FILE_DYNAMIC and quantile_trajectories is None:
        raise OutletsError(
            f"{', '.join(settings)} with --predictor file-dynamic re-read each request's distribution as it decodes, "
            f"but --predictions {predictions_path} has no quantile_trajectory{whose}: use --predictor file, or a "
            "file with dynamic quantiles")
