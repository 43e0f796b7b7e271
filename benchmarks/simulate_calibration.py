"""Calibrate the step-time model against a published Llama-3.1-8B / H100 measurement.

Reference (LambdaLabsML/vllm-benchmark, benchmark_v0.md, "vLLM v0.5.4 v.s. v0.6.0"): Llama 3.1 8B
on one H100-80GB-SXM, vLLM v0.6.0 with --num-scheduler-steps 10, chunked prefill off,
max-num-seqs 256, max-seq-len 2048, 5000 ShareGPT prompts sent at once (rps=inf):
8088.35 output tokens/s, median TPOT 25.57 ms.

The simulator replays that setup: one colocated instance, 256 running requests, 2048-token prefill
steps, KV allocated as used (vLLM's paged cache: reservation = prompt + output), 5000 requests at
t=0. ShareGPT lengths are not on this machine, so they are a log-normal stand-in with the means
vLLM's ShareGPT sampling gives with a Llama tokenizer (about 215 prompt and 200 output tokens),
filtered like vLLM (4 <= prompt <= 1024, prompt + output <= 2048). Bandwidth efficiency and MFU
stay at their defaults; the per-step overhead is fitted to the throughput, and TPOT is the check.

    .venv/bin/python benchmarks/simulate_calibration.py
"""

from __future__ import annotations

import numpy as np

from specforge_outlets.scheduling import QueuePolicy, RoutingPolicy, SchedulingConfig
from specforge_outlets.simulation.cluster import cluster_config_from_dict
from specforge_outlets.simulation.engine import Policy, Simulation
from specforge_outlets.simulation.hardware import GIB, H100_SXM, LLAMA_3_1_8B
from specforge_outlets.serving.trace import Trace

REFERENCE_THROUGHPUT_TOK_S = 8088.35
REFERENCE_MEDIAN_TPOT_MS = 25.57
NUM_PROMPTS = 5000
VLLM_GPU_MEMORY_UTILIZATION = 0.9
OVERHEADS_S = (0.0, 0.002, 0.004, 0.005, 0.006, 0.007, 0.008)


def sharegpt_like(num_requests: int, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    inputs, outputs = [], []
    while len(inputs) < num_requests:
        prompt, output = int(rng.lognormal(5.0, 1.0)), int(rng.lognormal(4.85, 1.0))
        if 4 <= prompt <= 1024 and output >= 4 and prompt + output <= 2048:
            inputs.append(prompt)
            outputs.append(output)
    return Trace("sharegpt-like", [str(i) for i in range(num_requests)], np.zeros(num_requests),
                 np.array(inputs), np.array(outputs))


def simulate(trace: Trace, overhead_s: float):
    kv_tokens = int((H100_SXM.memory_bytes * VLLM_GPU_MEMORY_UTILIZATION - LLAMA_3_1_8B.weight_bytes)
                    // LLAMA_3_1_8B.kv_bytes_per_token)
    cluster = cluster_config_from_dict({
        "mode": "colocated", "instances": 1, "max_running_requests": 256, "chunked_prefill_size": 2048,
        "max_new_tokens": 1, "kv_capacity_tokens": kv_tokens, "step_overhead_s": overhead_s,
        "kv_admission": "max-new-tokens",  # the reservation the calibration was run with, named
    }, "calibration")
    policy = Policy(RoutingPolicy.ROUND_ROBIN, QueuePolicy.FCFS)
    result = Simulation(trace, [None] * len(trace), cluster, policy, SchedulingConfig()).run()
    throughput = result.output_lens.sum() / (result.finish_times.max() - result.arrival_times.min())
    decoding = result.output_lens > 1
    tpot = (result.finish_times - result.first_token_times)[decoding] / (result.output_lens[decoding] - 1)
    return throughput, 1000 * float(np.median(tpot))


def main() -> None:
    trace = sharegpt_like(NUM_PROMPTS)
    print(f"stand-in lengths: mean prompt {trace.input_lens.mean():.0f}, mean output {trace.output_lens.mean():.0f}, "
          f"H100 memory {H100_SXM.memory_bytes / GIB:.0f} GiB")
    print("\n| step overhead (ms) | simulated tok/s | reference tok/s | simulated median TPOT (ms) | reference (ms) |")
    print("|---|---|---|---|---|")
    for overhead_s in OVERHEADS_S:
        throughput, tpot_ms = simulate(trace, overhead_s)
        print(f"| {1000 * overhead_s:.0f} | {throughput:.0f} | {REFERENCE_THROUGHPUT_TOK_S:.0f} | {tpot_ms:.1f} | "
              f"{REFERENCE_MEDIAN_TPOT_MS:.1f} |")


if __name__ == "__main__":
    main()
