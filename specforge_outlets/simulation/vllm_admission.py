"""vLLM v1's own KV admission and preemption (``kv_admission: vllm``, ``vllm-0.13``), as arithmetic the simulator runs.

Read from vLLM 0.34.0 as published on PyPI (commit 62d4bc3c7; never copied):
``vllm/v1/core/sched/scheduler.py`` (``Scheduler.schedule``, its running and waiting loops, and
``Scheduler._preempt_request``), ``vllm/v1/core/kv_cache_manager.py`` (``KVCacheManager.allocate_slots``
with ``full_sequence_must_fit``), ``vllm/v1/core/single_type_kv_cache_manager.py``
(``get_num_blocks_to_allocate``), ``vllm/v1/core/sched/request_queue.py`` (``FCFSRequestQueue``,
``prepend_request``), and the defaults in ``vllm/config/scheduler.py`` and ``vllm/config/cache.py``.
tests/test_vllm_admission.py checks hand-computed cases, and where vLLM is importable drives vLLM's
own ``Scheduler`` step by step beside the simulator.

vLLM reserves nothing ahead. The cache is ``capacity // block_size`` blocks, one of which the
``BlockPool`` keeps as its null block; a request holds the blocks its computed tokens fill. Every
step (``schedule``):

- the running requests, in the order they were admitted, allocate the blocks for the tokens they
  compute this step: a decoding request one token (a new block each ``block_size`` tokens), one still
  prefilling its next chunk, as much as is left of the step's token budget (``max_num_batched_tokens``,
  decoding requests first since they were admitted first);
- when an allocation does not fit, the last running request is preempted (FCFS:
  ``self.running.pop()``): its blocks are freed, its computed tokens reset to 0, and it goes to the
  front of the waiting queue, to compute its prompt and every token it had generated again (which
  also samples its next token); again until the allocation fits, or the request preempted itself;
- only in a step that preempted none, waiting requests are admitted in queue order while a running
  slot (``max_num_seqs``) and token budget are left and the blocks of the whole sequence are free
  (``scheduler_reserve_full_isl``, on by default; less a watermark, off by default); the first that
  does not fit stops admission. An admitted request allocates the blocks of its first chunk only.

vLLM v0.13 (``kv_admission: vllm-0.13``, the paper's baseline; the official 0.13.0 wheel, read the
same way) differs in two rules only, for a colocated instance under FCFS without prefix caching:

- admission needs only the blocks of the request's first chunk: the waiting loop sets its new tokens
  to ``min(num_tokens - num_computed_tokens, token_budget)`` (``vllm/v1/core/sched/scheduler.py``
  L526, L541) and calls ``allocate_slots`` with them (L583), which checks the blocks of the computed
  tokens plus these (plus lookahead) against the free blocks and nothing more
  (``vllm/v1/core/kv_cache_manager.py`` L275-289); neither ``full_sequence_must_fit`` nor a watermark
  exists. A request whose whole sequence does not fit is admitted, and preempted (often itself, the
  last running) when a later chunk's blocks are not free;
- blocks of 16 tokens: ``CacheConfig.block_size`` has no default (``vllm/config/cache.py`` L42) and
  ``CudaPlatform.check_and_update_config`` sets 16 (``vllm/platforms/cuda.py`` L160-161; MLA models,
  not simulated, get other sizes after).

The rest is the same there: preemption of the last running request (scheduler.py L359,
``_preempt_request`` L759-781: computed tokens 0, ``waiting.prepend_request``), no admission in a
step that preempted (L426; under v0.13 it changes decisions, as the request just preempted heads the
queue and its first chunk often fits), the ``max_num_seqs`` stop (L428), ``cdiv`` blocks
(``vllm/v1/core/single_type_kv_cache_manager.py`` L86), the null block (``vllm/v1/core/block_pool.py``
L174), and the synchronous scheduler by default (``SchedulerConfig.async_scheduling = False``,
``vllm/config/scheduler.py`` L133).

Assumed as the simulated servers run: the FCFS policy (vLLM's default), no prefix caching (on by
default in vLLM: a preempted request could then reuse its own blocks not yet evicted), full attention,
no speculative decoding (no lookahead slots), no KV connector, the synchronous ``Scheduler`` (vLLM's
``AsyncScheduler`` schedules one step ahead with output placeholders, by the same block arithmetic).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Sequence, Tuple

from specforge_outlets.scheduling import KVAdmission


@dataclass(frozen=True)
class VLLMRules:
    """The rules in which the modelled vLLM versions differ; everything else is shared."""

    version: str  # vllm.__version__, without a local tag such as +cpu
    block_size: int  # tokens per KV block
    # admission needs the blocks of the whole sequence free (0.34.0's scheduler_reserve_full_isl), not
    # only those of its first chunk (v0.13)
    whole_sequence_must_fit: bool
    # SchedulerConfig.watermark: the share of all blocks an admission leaves free while any request runs
    watermark: float

    def pool_blocks(self, capacity_tokens: int) -> int:
        """Blocks in an instance's cache of ``capacity_tokens`` (``KVCacheConfig.num_blocks``: whole blocks)."""
        return capacity_tokens // self.block_size

    def usable_blocks(self, capacity_tokens: int) -> int:
        """Blocks requests can hold: the pool's, less the null block ``BlockPool`` takes at start."""
        return self.pool_blocks(capacity_tokens) - 1

    def watermark_blocks(self, capacity_tokens: int) -> int:
        """Blocks an admission leaves free while any request runs (``KVCacheManager.watermark_blocks``)."""
        return int(self.watermark * self.pool_blocks(capacity_tokens))

    def blocks_for(self, tokens):
        """Blocks that hold ``tokens`` tokens, an int or an array (``cdiv`` in ``get_num_blocks_to_allocate``)."""
        return -(-tokens // self.block_size)

    def admits(self, tokens: int, budget: int, free_blocks: int, watermark: int, any_running: bool) -> bool:
        """Whether a waiting request of ``tokens`` tokens (its prompt, and the tokens a preempted one had)
        is admitted with ``budget`` tokens of the step left: the blocks of its whole sequence, or with
        v0.13 of its first chunk, plus ``watermark`` blocks while any request runs, are free."""
        needed = tokens if self.whole_sequence_must_fit else min(tokens, budget)
        return self.blocks_for(needed) + (watermark if any_running else 0) <= free_blocks


# vLLM 0.34.0: CacheConfig.DEFAULT_BLOCK_SIZE 64, which FlashAttention's get_preferred_block_size keeps on
# H100 and H200 for the simulated models; the whole sequence must fit (scheduler_reserve_full_isl,
# on by default); the watermark's default 0.0 turns it off
VLLM_0_34 = VLLMRules("0.34.0", block_size=64, whole_sequence_must_fit=True, watermark=0.0)
# vLLM v0.13: 16 tokens per block on CUDA (platforms/cuda.py L160-161), the first chunk's blocks, no watermark
VLLM_0_13 = VLLMRules("0.13.0", block_size=16, whole_sequence_must_fit=False, watermark=0.0)
# the rules of each vLLM admission the cluster config names
RULES: Dict[KVAdmission, VLLMRules] = {KVAdmission.VLLM: VLLM_0_34, KVAdmission.VLLM_0_13: VLLM_0_13}


def running_kept(blocks: Sequence[Tuple[int, int]], free_blocks: int) -> int:
    """How many running requests keep running this step; the rest, from the last, are preempted.

    ``blocks``: per running request in running order, (blocks it holds, blocks it needs once this
    step's tokens are allocated). Each allocates in turn; while one does not fit, the last request
    still running is preempted and its blocks freed, until it fits or it preempted itself.
    """
    kept = len(blocks)
    index = 0
    while index < kept:
        held, needed = blocks[index]
        while needed - held > free_blocks:
            kept -= 1
            free_blocks += blocks[kept][0]
            if kept == index:  # the request preempted itself
                return kept
        free_blocks -= needed - held
        index += 1
    return kept


def decode_steps_that_fit(tokens: Sequence[int], total_blocks: int, block_size: int) -> int:
    """Decode steps in a row whose allocations fit ``total_blocks`` usable blocks of ``block_size`` tokens, at least 1.

    ``tokens``: per running request, the tokens whose slots the first step needs (its prompt and
    output so far, the new token's slot included); each step after needs one more. At ``j`` steps on a
    request of ``a * block_size + b`` tokens needs ``a + q + ceil((b + r) / block_size)`` blocks,
    ``j = q * block_size + r``, so the whole batch's need is read off a count of the ``b`` in
    O(len(tokens) + block_size) instead of step by step.
    """
    count = len(tokens)
    whole = sum(t // block_size for t in tokens)
    at_least = [0] * (block_size + 2)  # at_least[k]: requests with b >= k
    for t in tokens:
        at_least[t % block_size] += 1
    for k in range(block_size - 1, -1, -1):
        at_least[k] += at_least[k + 1]

    def need(r: int) -> int:  # the batch's blocks r steps past a whole number of blocks' worth of steps
        return whole + (at_least[1] if r == 0 else count + at_least[block_size + 1 - r])

    cycles = (total_blocks - need(0)) // count
    last = max(r for r in range(block_size) if need(r) + count * cycles <= total_blocks)
    return cycles * block_size + last + 1
