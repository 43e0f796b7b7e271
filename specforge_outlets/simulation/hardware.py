"""Step-time model of one serving instance: a GPU and model pair, from datasheet numbers.

    decode step  = overhead + (weight bytes + KV bytes read for the batch) / (HBM bandwidth * BW_EFF)
    prefill work = 2 * params * prompt tokens / (dense bf16 FLOP/s * MFU)

or the same linear form fitted to a measured server (:meth:`StepTimeModel.fitted`), which adds a
cost per running request: on a CPU server, or any whose per-request sampling and bookkeeping
outweigh reading the cache, that term sets the step.

A step that does both (chunked prefill) pays both terms. The decode formula is memory-bound: it
holds while the batch's matmul FLOPs (2 * params * batch) take less time than reading the weights
and KV cache, i.e. for batches up to a few hundred requests on H100/H200 with an 8B model.
Attention FLOPs of prefill (quadratic in prompt length, ~4% of the linear FLOPs at 1k tokens for
Llama-3.1-8B) are left out. Sources of the constants and the calibration are in
docs/simulation.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class GPUSpec:
    """Datasheet numbers of one GPU."""

    name: str
    memory_bytes: float
    memory_bandwidth: float  # bytes/s, HBM peak
    dense_bf16_flops: float  # FLOP/s, dense (no sparsity) tensor-core peak


@dataclass(frozen=True)
class ModelSpec:
    """Size of a decoder-only transformer as far as serving cost goes."""

    name: str
    num_params: float
    bytes_per_param: int
    num_layers: int
    num_kv_heads: int
    head_dim: int

    @property
    def weight_bytes(self) -> float:
        return self.num_params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values of all layers for one token."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.bytes_per_param


# NVIDIA H100 SXM5 80GB datasheet: 3.35 TB/s HBM3, 989 TFLOP/s dense BF16.
H100_SXM = GPUSpec("H100-SXM", 80 * GIB, 3.35e12, 989e12)
# NVIDIA H200 SXM 141GB datasheet: 4.8 TB/s HBM3e, same Hopper compute as H100 SXM.
H200 = GPUSpec("H200", 141e9, 4.8e12, 989e12)
# NVIDIA L4 datasheet: 24 GB GDDR6, 300 GB/s, 121 TFLOP/s dense BF16 (242 with sparsity). A memory-poor card:
# Llama-3.1-8B's 16 GB of weights leave it a cache of tens of thousands of tokens (ClusterConfig.kv_capacity).
L4 = GPUSpec("L4", 24e9, 300e9, 121e12)
# Llama-3.1-8B config.json: 8.03e9 parameters in bf16, 32 layers, 8 KV heads of dimension 128.
LLAMA_3_1_8B = ModelSpec("Llama-3.1-8B", 8.03e9, 2, 32, 8, 128)

GPUS = {spec.name: spec for spec in (H100_SXM, H200, L4)}
MODELS = {spec.name: spec for spec in (LLAMA_3_1_8B,)}

# Fraction of peak HBM bandwidth that decode kernels (weight GEMVs, paged attention) achieve;
# Hopper memcpy-style kernels reach ~80-90% of peak, real decode steps less.
DEFAULT_BANDWIDTH_EFFICIENCY = 0.7
# Model FLOPs utilisation of prefill GEMMs at batch sizes of thousands of tokens.
DEFAULT_PREFILL_MFU = 0.5
# Fixed cost of every step: scheduling, sampling, kernel launches. Fitted to the published
# Llama-3.1-8B / H100 vLLM measurement (benchmarks/simulate_calibration.py; how close the fit comes:
# docs/simulation.md, "Calibration").
DEFAULT_STEP_OVERHEAD_S = 0.005
# Share of GPU memory for weights plus KV cache (SGLang's --mem-fraction-static is ~0.88).
DEFAULT_MEMORY_FRACTION = 0.88


@dataclass(frozen=True)
class StepTimeModel:
    """Seconds per engine step, from bytes moved and FLOPs done."""

    weight_bytes: float
    kv_bytes_per_token: float
    flops_per_prefill_token: float
    effective_bandwidth: float  # bytes/s actually achieved
    effective_flops: float  # FLOP/s actually achieved in prefill
    step_overhead_s: float
    per_request_s: float = 0.0  # each running request's share of a step (sampling, bookkeeping)

    @classmethod
    def for_pair(
        cls,
        gpu: GPUSpec,
        model: ModelSpec,
        bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY,
        prefill_mfu: float = DEFAULT_PREFILL_MFU,
        step_overhead_s: float = DEFAULT_STEP_OVERHEAD_S,
    ) -> "StepTimeModel":
        return cls(
            weight_bytes=model.weight_bytes,
            kv_bytes_per_token=model.kv_bytes_per_token,
            flops_per_prefill_token=2 * model.num_params,
            effective_bandwidth=gpu.memory_bandwidth * bandwidth_efficiency,
            effective_flops=gpu.dense_bf16_flops * prefill_mfu,
            step_overhead_s=step_overhead_s,
        )

    @classmethod
    def fitted(cls, fixed_s: float, per_request_s: float, per_kv_token_s: float,
               per_prefill_token_s: float) -> "StepTimeModel":
        """Coefficients in seconds, measured on a server: its fixed cost per step, per running request,
        per token of KV cache held and per prompt token prefilled (a bandwidth and FLOP rate of 1)."""
        return cls(weight_bytes=0.0, kv_bytes_per_token=per_kv_token_s, flops_per_prefill_token=per_prefill_token_s,
                   effective_bandwidth=1.0, effective_flops=1.0, step_overhead_s=fixed_s, per_request_s=per_request_s)

    def step_time(self, kv_tokens: float, prefill_tokens: int = 0, batch_size: int = 0) -> float:
        """One step that reads all weights and ``kv_tokens`` of KV cache, decodes ``batch_size``
        requests and prefills some tokens."""
        memory = (self.weight_bytes + kv_tokens * self.kv_bytes_per_token) / self.effective_bandwidth
        compute = prefill_tokens * self.flops_per_prefill_token / self.effective_flops
        return self.step_overhead_s + batch_size * self.per_request_s + memory + compute

    def _kv_growth_per_step(self, batch_size: int) -> float:
        """Extra seconds per step as each of ``batch_size`` requests adds one token of KV."""
        return batch_size * self.kv_bytes_per_token / self.effective_bandwidth

    def decode_steps_time(self, num_steps: int, batch_size: int, kv_tokens: float) -> float:
        """Seconds for ``num_steps`` decode steps of a fixed batch starting with ``kv_tokens`` of KV."""
        growth = self._kv_growth_per_step(batch_size)
        return num_steps * self.step_time(kv_tokens, 0, batch_size) + growth * num_steps * (num_steps - 1) / 2

    def decode_steps_done(self, elapsed_s: float, batch_size: int, kv_tokens: float) -> int:
        """Whole decode steps finished within ``elapsed_s`` (inverse of :meth:`decode_steps_time`)."""
        if elapsed_s <= 0:
            return 0
        first, growth = self.step_time(kv_tokens, 0, batch_size), self._kv_growth_per_step(batch_size)
        # Solve growth/2 * n^2 + (first - growth/2) * n = elapsed for n, then fix float rounding.
        half, linear = growth / 2, first - growth / 2
        root = elapsed_s / linear if half == 0 else (-linear + math.sqrt(linear * linear + 4 * half * elapsed_s)) / (2 * half)
        steps = max(int(root), 0)
        while self.decode_steps_time(steps + 1, batch_size, kv_tokens) <= elapsed_s:
            steps += 1
        while steps > 0 and self.decode_steps_time(steps, batch_size, kv_tokens) > elapsed_s:
            steps -= 1
        return steps
