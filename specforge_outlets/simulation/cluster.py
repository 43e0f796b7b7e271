"""Cluster description for the simulator, read from YAML (see recipes/cluster-*.yaml).

Field names follow SGLang's server arguments where one exists (``max_running_requests``,
``max_prefill_tokens``, ``chunked_prefill_size``).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from enum import Enum
from typing import Any, Dict, Optional

import numpy as np
import yaml

from specforge_outlets.errors import OutletsError
from specforge_outlets.resources import resolve_recipe, where_recipes_are
from specforge_outlets.scheduling import (
    DEFAULT_KV_ADMISSION,
    DEFAULT_KV_MARGIN,
    DEFAULT_KV_QUANTILE,
    DEFAULT_LOAD_POLL_INTERVAL_S,
    PEAK_ADMISSIONS,
    VLLM_ADMISSIONS,
    KVAdmission,
    kv_knob_values,
)
from specforge_outlets.simulation.hardware import (
    DEFAULT_BANDWIDTH_EFFICIENCY,
    DEFAULT_MEMORY_FRACTION,
    DEFAULT_PREFILL_MFU,
    DEFAULT_STEP_OVERHEAD_S,
    GPUS,
    MODELS,
    StepTimeModel,
)


class ClusterMode(Enum):
    """Where prefill runs."""

    DISAGGREGATED = "disaggregated"  # prefill instances, KV transfer, decode instances
    COLOCATED = "colocated"  # each instance runs continuous batching with chunked prefill


class PredictionPoint(Enum):
    """When a request's predicted output length becomes known to the scheduler."""

    PREFILL = "prefill"  # OUTLETS r_0: from the draft state at the last prompt token
    ARRIVAL = "arrival"  # supplied with the request (a router-side or external predictor)


@dataclass(frozen=True)
class ClusterConfig:
    """Instances, their limits and the GPU/model pair that sets their step times."""

    mode: ClusterMode = ClusterMode.DISAGGREGATED
    gpu: str = "H100-SXM"
    model: str = "Llama-3.1-8B"
    prefill_instances: int = 1  # disaggregated mode
    decode_instances: int = 3  # disaggregated mode
    instances: int = 4  # colocated mode
    max_running_requests: int = 256  # per decode / colocated instance
    kv_capacity_tokens: Optional[int] = None  # per instance; None: from GPU memory
    memory_fraction: float = DEFAULT_MEMORY_FRACTION  # weights + KV share of GPU memory
    max_new_tokens: int = 1024  # output tokens of KV reserved at admission (at least the output)
    max_prefill_tokens: int = 16384  # prompt tokens per prefill batch (disaggregated prefill)
    chunked_prefill_size: int = 8192  # prompt tokens per step (colocated)
    kv_transfer_bandwidth: float = 50e9  # bytes/s between prefill and decode (400 Gb/s RDMA)
    kv_transfer_latency_s: float = 0.002  # fixed cost per transfer
    predict_at: PredictionPoint = PredictionPoint.PREFILL
    kv_admission: KVAdmission = DEFAULT_KV_ADMISSION  # the plugin's default too; check_kv_admission: where each runs
    # the knobs the rule's strategy reads (kv_admission.rule_knobs), refused with a rule that does not read them:
    kv_margin: float = DEFAULT_KV_MARGIN  # predicted admission: share of the prediction reserved on top
    kv_quantile: float = DEFAULT_KV_QUANTILE  # quantile admission: the level of the remaining length reserved
    # SGLang's new_token_ratio knobs (its admission, and the plugin's, which keeps it for requests without a
    # prediction): --schedule-conservativeness, SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR, SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
    schedule_conservativeness: float = 1.0
    min_new_token_ratio_factor: float = 0.14
    new_token_ratio_decay_steps: int = 600
    # power-of-two routing: seconds between the router's polls of every instance's load (sglang-router's
    # LoadMonitor); 0: the router reads the loads at every dispatch, as the other routers do
    load_poll_interval_s: float = DEFAULT_LOAD_POLL_INTERVAL_S
    bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY
    prefill_mfu: float = DEFAULT_PREFILL_MFU
    step_overhead_s: float = DEFAULT_STEP_OVERHEAD_S
    # seconds per step fitted to a measured server ({fixed_s, per_request_s, per_kv_token_s,
    # per_prefill_token_s}: StepTimeModel.fitted); replaces gpu/model's datasheet model and needs
    # kv_capacity_tokens, as the server's cache size is not a GPU's memory
    fitted_step_time: Optional[Dict[str, float]] = None

    def step_time_model(self) -> StepTimeModel:
        if self.fitted_step_time is not None:
            return StepTimeModel.fitted(**self.fitted_step_time)
        return StepTimeModel.for_pair(
            GPUS[self.gpu], MODELS[self.model], self.bandwidth_efficiency, self.prefill_mfu, self.step_overhead_s
        )

    def kv_capacity(self) -> int:
        """KV-cache tokens one instance holds."""
        if self.kv_capacity_tokens is not None:
            return self.kv_capacity_tokens
        gpu, model = GPUS[self.gpu], MODELS[self.model]
        return int((gpu.memory_bytes * self.memory_fraction - model.weight_bytes) // model.kv_bytes_per_token)

    def kv_reservation(self, input_len, output_len):
        """KV tokens reserved for a request while it runs: prompt plus output budget (ints or arrays)."""
        return input_len + np.maximum(self.max_new_tokens, output_len)


_ENUM_FIELDS = {"mode": ClusterMode, "predict_at": PredictionPoint, "kv_admission": KVAdmission}
_POSITIVE_INT_FIELDS = (
    "prefill_instances", "decode_instances", "instances", "max_running_requests", "max_new_tokens",
    "max_prefill_tokens", "chunked_prefill_size", "new_token_ratio_decay_steps",
)
_POSITIVE_FLOAT_FIELDS = ("memory_fraction", "kv_transfer_bandwidth", "bandwidth_efficiency", "prefill_mfu",
                          "schedule_conservativeness")
_NON_NEGATIVE_FLOAT_FIELDS = ("kv_transfer_latency_s", "step_overhead_s", "load_poll_interval_s",
                              "min_new_token_ratio_factor")
_KV_KNOB_FIELDS = ("kv_margin", "kv_quantile")  # checked with the rule (kv_knob_values)


def cluster_config_from_dict(values: Dict[str, Any], source: str) -> ClusterConfig:
    """Validate a mapping of settings; errors name the source and the field."""
    known = {field.name for field in dataclasses.fields(ClusterConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise OutletsError(f"{source}: unknown field(s) {', '.join(unknown)}; known fields: {', '.join(sorted(known))}")
    parsed: Dict[str, Any] = {}
    for name, value in values.items():
        if name in _ENUM_FIELDS:
            choices = [member.value for member in _ENUM_FIELDS[name]]
            if value not in choices:
                raise OutletsError(f"{source}: {name} must be one of {', '.join(choices)}, got {value!r}")
            parsed[name] = _ENUM_FIELDS[name](value)
        elif name == "gpu" and value not in GPUS:
            raise OutletsError(f"{source}: gpu must be one of {', '.join(GPUS)}, got {value!r}")
        elif name == "model" and value not in MODELS:
            raise OutletsError(f"{source}: model must be one of {', '.join(MODELS)}, got {value!r}")
        elif name in _POSITIVE_INT_FIELDS or (name == "kv_capacity_tokens" and value is not None):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise OutletsError(f"{source}: {name} must be a positive integer, got {value!r}")
            parsed[name] = value
        elif name in _POSITIVE_FLOAT_FIELDS + _NON_NEGATIVE_FLOAT_FIELDS:
            parsed[name] = _number(source, name, value, positive=name in _POSITIVE_FLOAT_FIELDS)
        elif name == "fitted_step_time" and value is not None:
            parsed[name] = _fitted_step_time(source, value)
        elif name not in _KV_KNOB_FIELDS:
            parsed[name] = value
    rule = parsed.get("kv_admission", DEFAULT_KV_ADMISSION)
    chosen = f"kv_admission {rule.value}" + ("" if "kv_admission" in values else " (the default)")
    try:
        knobs = kv_knob_values(rule, values, lambda name: f"{source}: {name}", "kv_admission", chosen)
    except ValueError as error:
        raise OutletsError(str(error)) from None
    parsed.update((name, knobs[name]) for name in _KV_KNOB_FIELDS if name in values)
    config = ClusterConfig(**parsed)
    if config.fitted_step_time is not None and config.kv_capacity_tokens is None:
        raise OutletsError(f"{source}: fitted_step_time needs kv_capacity_tokens, the measured server's cache in tokens "
                           "(its --max-total-tokens): the cache cannot be derived from a GPU's memory then")
    check_kv_admission(config, source)
    if config.kv_capacity() < 1:
        raise OutletsError(
            f"{source}: model {config.model} does not fit on {config.gpu} with memory_fraction "
            f"{config.memory_fraction}; raise memory_fraction or set kv_capacity_tokens"
        )
    return config


def check_kv_admission(config: ClusterConfig, source: str) -> None:
    """Refuse an engine's own admission where the simulator does not model it."""
    if config.kv_admission in PEAK_ADMISSIONS and config.mode is not ClusterMode.COLOCATED:
        raise OutletsError(
            f"{source}: kv_admission {config.kv_admission.value} gates SGLang's PrefillAdder, which colocated "
            "instances run; disaggregated decode instances admit transferred requests by another rule (kv_admission "
            "sglang runs it): set mode colocated, or name kv_admission sglang, predicted or max-new-tokens")
    if config.kv_admission in VLLM_ADMISSIONS and config.mode is not ClusterMode.COLOCATED:
        raise OutletsError(
            f"{source}: kv_admission {config.kv_admission.value} models vLLM's Scheduler on colocated instances; vLLM "
            "disaggregates through KV connectors, which are not modelled: set mode colocated, or kv_admission "
            "max-new-tokens or predicted")
    if config.kv_admission in VLLM_ADMISSIONS and config.max_running_requests > config.chunked_prefill_size:
        raise OutletsError(
            f"{source}: kv_admission {config.kv_admission.value} reads chunked_prefill_size as vLLM's "
            f"max_num_batched_tokens and max_running_requests as its max_num_seqs, which vLLM refuses above it "
            f"({config.max_running_requests} > {config.chunked_prefill_size}): lower max_running_requests or raise "
            "chunked_prefill_size")


FITTED_STEP_TIME_KEYS = ("fixed_s", "per_request_s", "per_kv_token_s", "per_prefill_token_s")


def _fitted_step_time(source: str, value: Any) -> Dict[str, float]:
    """fitted_step_time: exactly StepTimeModel.fitted's four coefficients, non-negative seconds."""
    if not isinstance(value, dict) or sorted(value) != sorted(FITTED_STEP_TIME_KEYS):
        raise OutletsError(f"{source}: fitted_step_time must be a mapping of exactly {', '.join(FITTED_STEP_TIME_KEYS)} "
                           f"(seconds), got {value!r}")
    return {key: _number(source, f"fitted_step_time.{key}", value[key], positive=False) for key in FITTED_STEP_TIME_KEYS}


def _number(source: str, name: str, value: Any, positive: bool) -> float:
    """A finite number; strings too, as YAML reads ``50.0e9`` (no exponent sign) as a string."""
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        raise OutletsError(f"{source}: {name} must be a {'positive' if positive else 'non-negative'} number, got {value!r}")
    return number


def load_cluster_config(path: str) -> ClusterConfig:
    """Read a cluster YAML file, or a shipped one by name (``cluster-h100-1p3d``)."""
    path = resolve_recipe(path)
    if not os.path.isfile(path):
        raise OutletsError(f"cluster config {path}: no such file; {where_recipes_are()}")
    with open(path, encoding="utf-8") as handle:
        try:
            values = yaml.safe_load(handle) or {}
        except yaml.YAMLError as exc:
            raise OutletsError(f"cluster config {path}: not valid YAML ({exc})") from None
    if not isinstance(values, dict):
        raise OutletsError(f"cluster config {path}: expected a mapping of settings, got {type(values).__name__}")
    return cluster_config_from_dict(values, f"cluster config {path}")
