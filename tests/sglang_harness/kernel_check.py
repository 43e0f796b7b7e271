"""The harness's torch references (stubs/sgl_kernel/speculative_reference.py) against SGLang's own kernels.

    TRITON_INTERPRET=1 python -m tests.sglang_harness.kernel_check [CASES]   (serve environment)

SGLang 0.5.23 ships a Triton kernel for the job of each CPU function the EAGLE-3 path calls; Triton's
interpreter runs them on the CPU (``TRITON_INTERPRET=1``, set before Triton is imported). Each
reference and its kernel get the same random inputs, in shapes EAGLE uses, and every output tensor
must be equal. The KV-slot copy works on raw addresses, which the interpreter does not load from,
so it is checked against indexing into real buffers instead. Exits non-zero naming the first
mismatch; prints one line per function otherwise.
"""

from __future__ import annotations

import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1 (Triton's CPU interpreter)"
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "stubs"))

import torch  # noqa: E402
from sgl_kernel import speculative_reference as ref  # noqa: E402

POOL_LEN = 64


def equal(name: str, case: int, ours: torch.Tensor, theirs: torch.Tensor) -> None:
    if not torch.equal(ours, theirs):
        raise SystemExit(f"{name}: case {case}: the reference differs from SGLang's kernel\n ours   {ours}\n theirs {theirs}")


def spans(g: torch.Generator, batch: int):
    """Request rows, and per request a [start, end) span inside the pool row."""
    rows = torch.randperm(8, generator=g)[:batch]
    start = torch.randint(0, 20, (batch,), generator=g)
    end = start + torch.randint(0, 12, (batch,), generator=g)
    return rows, start, end


def check_slot_tables(g: torch.Generator, case: int) -> None:
    from sglang.kernels.ops.speculative.cache_locs import (
        assign_draft_cache_locs_contiguous,
        assign_extend_cache_locs,
    )
    from sglang.srt.mem_cache.allocation import assign_req_to_token_pool
    from sglang.srt.utils import next_power_of_2

    batch = int(torch.randint(1, 6, (1,), generator=g))
    table = torch.randint(0, 1000, (8, POOL_LEN), generator=g, dtype=torch.int32)
    rows, start, end = spans(g, batch)
    packed = torch.randint(0, 1000, (int((end - start).sum()),), generator=g, dtype=torch.int64)

    ours, theirs = table.clone(), table.clone()
    ref.assign_req_to_token_pool_cpu(rows, ours, start, end, packed, POOL_LEN)
    assign_req_to_token_pool[(batch,)](rows, theirs, start, end, packed, POOL_LEN, next_power_of_2(batch))
    equal("assign_req_to_token_pool_cpu", case, ours, theirs)

    ours, theirs = torch.full_like(packed, -1), torch.full_like(packed, -1)
    ref.assign_extend_cache_locs_cpu(rows, table, start, end, ours, POOL_LEN)
    assign_extend_cache_locs[(batch,)](rows, table, start, end, theirs, POOL_LEN, next_power_of_2(batch))
    equal("assign_extend_cache_locs_cpu", case, ours, theirs)

    topk, cols = int(torch.randint(1, 4, (1,), generator=g)), int(torch.randint(1, 4, (1,), generator=g))
    ours, theirs = (torch.full((batch * topk * cols,), -1, dtype=torch.int64) for _ in range(2))
    ref.assign_draft_cache_locs_contiguous_cpu(rows, table, start, ours, POOL_LEN, topk, cols)
    assign_draft_cache_locs_contiguous[(batch,)](rows, table, start, theirs, POOL_LEN, topk, cols)
    equal("assign_draft_cache_locs_contiguous_cpu", case, ours, theirs)


def check_accept_outputs(g: torch.Generator, case: int) -> None:
    from sglang.kernels.ops.speculative.eagle import fill_accept_out_cache_loc, fill_bonus_tokens
    from sglang.srt.utils import next_power_of_2

    batch, width = int(torch.randint(1, 6, (1,), generator=g)), int(torch.randint(2, 5, (1,), generator=g))
    accept_lens = torch.randint(1, width + 1, (batch,), generator=g, dtype=torch.int32)
    accept_index = torch.full((batch, width), -1, dtype=torch.int32)
    for b, length in enumerate(accept_lens.tolist()):
        accept_index[b, :length] = torch.arange(b * width, b * width + length, dtype=torch.int32)
    out_cache_loc = torch.randint(0, 1000, (batch * width,), generator=g, dtype=torch.int64)
    ours, theirs = (torch.full((batch * width,), -7, dtype=torch.int64) for _ in range(2))
    ref.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, ours)
    size = accept_index.numel()
    fill_accept_out_cache_loc[(size,)](accept_index, out_cache_loc, theirs, next_power_of_2(size))
    equal("fill_accept_out_cache_loc_cpu", case, ours, theirs)

    accept_tokens = torch.randint(0, 500, (batch, width), generator=g, dtype=torch.int64)
    ours, theirs = (torch.zeros(batch, dtype=torch.int64) for _ in range(2))
    ref.fill_bonus_tokens_cpu(accept_tokens, accept_lens, ours, width)
    fill_bonus_tokens[(batch,)](accept_tokens, accept_lens, theirs, width)
    equal("fill_bonus_tokens_cpu", case, ours, theirs)


def draft_tree(g: torch.Generator, batch: int, topk: int, depth: int, draft_tokens: int):
    """Inputs as ``organize_draft_results`` makes them: each request's parents and its chosen (sorted) nodes."""
    nodes = topk + (depth - 1) * topk * topk
    parents = torch.randint(0, nodes, (batch, (depth - 1) * topk + 1), generator=g, dtype=torch.int64)
    parents[:, 0] = -1
    selected = torch.stack([torch.randperm(nodes, generator=g)[:draft_tokens - 1].sort().values for _ in range(batch)])
    seq_lens = torch.randint(1, 30, (batch,), generator=g, dtype=torch.int64)
    return parents, selected, seq_lens


def built_tree(builder, parents, selected, seq_lens, topk, depth, draft_tokens, mode):
    batch = seq_lens.numel()
    size = batch * draft_tokens * draft_tokens if mode else int(draft_tokens * (seq_lens + draft_tokens).sum())
    mask = torch.full((size,), True, dtype=torch.bool)
    positions = torch.zeros(batch * draft_tokens, dtype=torch.int64)
    retrieve = torch.full((3, batch, draft_tokens), -1, dtype=torch.long)
    builder(parents, selected, seq_lens, mask, positions, retrieve[0], retrieve[1], retrieve[2], topk, depth,
            draft_tokens, mode)
    return mask, positions, retrieve


def check_tree(g: torch.Generator, case: int) -> None:
    from sglang.kernels.ops.speculative.spec_tree import (
        TreeMaskMode,
        sgl_build_tree_kernel_triton,
        verify_tree_greedy_triton,
    )

    topk, depth = [(1, 1), (1, 3), (2, 2), (4, 3)][case % 4]
    draft_tokens = min(topk + (depth - 1) * topk * topk, 1 + topk * depth) + 1
    batch = int(torch.randint(1, 4, (1,), generator=g))
    parents, selected, seq_lens = draft_tree(g, batch, topk, depth, draft_tokens)
    for mode in (TreeMaskMode.FULL_MASK, TreeMaskMode.QLEN_ONLY):
        ours = built_tree(ref.build_tree_kernel_efficient_cpu, parents, selected, seq_lens, topk, depth,
                          draft_tokens, int(mode))
        theirs = built_tree(sgl_build_tree_kernel_triton, parents, selected, seq_lens, topk, depth, draft_tokens, mode)
        for name, a, b in zip(("mask", "positions", "retrieve"), ours, theirs):
            equal(f"build_tree_kernel_efficient_cpu ({mode.name}, topk {topk}, depth {depth}) {name}", case, a, b)

    _, _, (index, next_token, next_sibling) = ours
    vocab = 3  # few ids, so that drafts are often accepted
    candidates = torch.randint(0, vocab, (batch, draft_tokens), generator=g, dtype=torch.int64)
    target = torch.randint(0, vocab, (batch, draft_tokens), generator=g, dtype=torch.int64)
    outputs = []
    for verify in (ref.verify_tree_greedy_cpu, verify_tree_greedy_triton):
        predicts = torch.zeros(batch * draft_tokens, dtype=torch.int64)
        accept_index = torch.full((batch, depth + 1), -1, dtype=torch.int32)
        accept_num = torch.zeros(batch, dtype=torch.int32)
        names = ("retrive_index", "retrive_next_token", "retrive_next_sibling") if verify is ref.verify_tree_greedy_cpu \
            else ("retrieve_index", "retrieve_next_token", "retrieve_next_sibling")
        verify(predicts=predicts, accept_index=accept_index, accept_token_num=accept_num, candidates=candidates,
               target_predict=target, **dict(zip(names, (index, next_token, next_sibling))))
        outputs.append((predicts, accept_index, accept_num))
    for name, a, b in zip(("predicts", "accept_index", "accept_token_num"), *outputs):
        equal(f"verify_tree_greedy_cpu (topk {topk}, depth {depth}) {name}", case, a, b)


def check_kv_copy(g: torch.Generator, case: int) -> None:
    buffers = [torch.randn(32, 2, 8, generator=g) for _ in range(3)] + [torch.randint(0, 9, (32, 5), generator=g)]
    expected = [buffer.clone() for buffer in buffers]
    src = torch.randint(0, 32, (6,), generator=g)
    tgt = torch.randperm(32, generator=g)[:6]
    for buffer in expected:
        buffer[tgt] = buffer[src].clone()  # every source read before any target is written
    ptrs = torch.tensor([buffer.data_ptr() for buffer in buffers], dtype=torch.int64)
    strides = torch.tensor([buffer[0].numel() * buffer.element_size() for buffer in buffers], dtype=torch.int64)
    ref.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for buffer, want in zip(buffers, expected):
        equal("copy_all_layer_kv_cache_cpu", case, buffer, want)


CHECKS = (check_slot_tables, check_accept_outputs, check_tree, check_kv_copy)


def main(cases: int) -> None:
    g = torch.Generator().manual_seed(0)
    for check in CHECKS:
        for case in range(cases):
            check(g, case)
        print(f"{check.__name__}: {cases} random cases equal")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 12)
