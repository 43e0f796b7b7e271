"""vLLM v1's own KV admission and preemption (``kv_admission: vllm``), as arithmetic the simulator runs.

Read from vLLM 0.34.0 as published on PyPI (commit 62d4bc3c7; never copied):
``vllm/v1/core/sched/scheduler.py`` (``Scheduler.schedule``, its running and waiting loops, and
``Scheduler._preempt_request``), ``vllm/v1/core/kv_cache_manager.py`` (``KVCacheManager.allocate_slots``
with ``full_sequence_must_fit``), ``vllm/v1/core/single_type_kv_cache_manager.py``
(``get_num_blocks_to_allocate``), ``vllm/v1/core/sched/request_queue.py`` (``FCFSRequestQueue``,
``prepend_request``), and the defaults in ``vllm/config/scheduler.py`` and ``vllm/config/cache.py``.
tests/test_vllm_admission.py checks hand-computed cases, and where vLLM is importable drives vLLM's
own ``Scheduler`` step by step beside the simulator.

vLLM reserves nothing ahead. The cache is ``capacity // BLOCK_SIZE`` blocks, one of which the
``BlockPool`` keeps as its null block; a request holds the blocks its computed tokens fill. Every
step (``schedule``):

- the running requests, in the order they were admitted, allocate the blocks for the tokens they
  compute this step: a decoding request one token (a new block each ``BLOCK_SIZE`` tokens), one still
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

Assumed as the simulated servers run: the FCFS policy (vLLM's default), no prefix caching (on by
default in vLLM: a preempted request could then reuse its own blocks not yet evicted), full attention,
no speculative decoding (no lookahead slots), no KV connector, the synchronous ``Scheduler`` (vLLM's
``AsyncScheduler`` schedules one step ahead with output placeholders, by the same block arithmetic).
"""

from __future__ import annotations

from typing import Sequence, Tuple

# Tokens per KV block: CacheConfig.DEFAULT_BLOCK_SIZE (64 in vLLM 0.34.0; 16 before), which
# FlashAttention's get_preferred_block_size keeps on H100 and H200 for the simulated models.
BLOCK_SIZE = 64
# SchedulerConfig.watermark: the share of all blocks an admission leaves free while any request runs
# (KVCacheManager.watermark_blocks); vLLM's default 0.0 turns it off.
WATERMARK = 0.0


def pool_blocks(capacity_tokens: int) -> int:
    """Blocks in an instance's cache of ``capacity_tokens`` (``KVCacheConfig.num_blocks``: whole blocks)."""
    return capacity_tokens // BLOCK_SIZE


def usable_blocks(capacity_tokens: int) -> int:
    """Blocks requests can hold: the pool's, less the null block ``BlockPool`` takes at start."""
    return pool_blocks(capacity_tokens) - 1


def watermark_blocks(capacity_tokens: int) -> int:
    """Blocks an admission leaves free while any request runs (``KVCacheManager.watermark_blocks``)."""
    return int(WATERMARK * pool_blocks(capacity_tokens))


def blocks_for(tokens: int) -> int:
    """Blocks that hold ``tokens`` tokens (``cdiv`` in ``get_num_blocks_to_allocate``)."""
    return -(-tokens // BLOCK_SIZE)


def admits(tokens: int, free_blocks: int, watermark: int, any_running: bool) -> bool:
    """Whether a waiting request of ``tokens`` tokens (its prompt, and the tokens a preempted one had)
    is admitted: the blocks of its whole sequence, plus ``watermark`` blocks while any request runs, are free."""
    return blocks_for(tokens) + (watermark if any_running else 0) <= free_blocks


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


def decode_steps_that_fit(tokens: Sequence[int], total_blocks: int) -> int:
    """Decode steps in a row whose allocations fit ``total_blocks`` usable blocks, at least 1.

    ``tokens``: per running request, the tokens whose slots the first step needs (its prompt and
    output so far, the new token's slot included); each step after needs one more. At ``j`` steps on a
    request of ``a * BLOCK_SIZE + b`` tokens needs ``a + q + ceil((b + r) / BLOCK_SIZE)`` blocks,
    ``j = q * BLOCK_SIZE + r``, so the whole batch's need is read off a count of the ``b`` in
    O(len(tokens) + BLOCK_SIZE) instead of step by step.
    """
    count = len(tokens)
    whole = sum(t // BLOCK_SIZE for t in tokens)
    at_least = [0] * (BLOCK_SIZE + 2)  # at_least[k]: requests with b >= k
    for t in tokens:
        at_least[t % BLOCK_SIZE] += 1
    for k in range(BLOCK_SIZE - 1, -1, -1):
        at_least[k] += at_least[k + 1]

    def need(r: int) -> int:  # the batch's blocks r steps past a whole number of blocks' worth of steps
        return whole + (at_least[1] if r == 0 else count + at_least[BLOCK_SIZE + 1 - r])

    cycles = (total_blocks - need(0)) // count
    last = max(r for r in range(BLOCK_SIZE) if need(r) + count * cycles <= total_blocks)
    return cycles * BLOCK_SIZE + last + 1
