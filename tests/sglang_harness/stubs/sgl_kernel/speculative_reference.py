"""Torch references for the ``sgl_kernel`` CPU functions SGLang 0.5.23's EAGLE-3 path calls (test harness only).

SGLang binds these names at import on a CPU build (``from sgl_kernel import ..._cpu``); the real
extension is not on PyPI. Each function here does what the Triton kernel of the same job in SGLang
does (the kernel it mirrors is named in its docstring; ``tests/test_sglang_kernel_reference.py``
checks each on small cases written out by hand from those kernels). They are written for clarity,
not speed: loops over the batch on the host, as befits a harness that serves a few requests.

Never part of the plugin: the plugin calls none of them. On a GPU server the real kernels run.
"""

from __future__ import annotations

import ctypes

import torch


def _offsets(start_offset: torch.Tensor, end_offset: torch.Tensor) -> list:
    """Each request's (start, end) and where its slice begins in the packed ``out_cache_loc``."""
    starts, ends = start_offset.tolist(), end_offset.tolist()
    packed, total = [], 0
    for start, end in zip(starts, ends):
        packed.append((start, end, total))
        total += end - start
    return packed


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                 pool_len) -> None:
    """``req_to_token[r_i, start_i:end_i] = out_cache_loc[packed slice i]`` (``assign_req_to_token_pool``)."""
    for row, (start, end, at) in zip(req_pool_indices.tolist(), _offsets(start_offset, end_offset)):
        req_to_token[row, start:end] = out_cache_loc[at:at + end - start].to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                 pool_len) -> None:
    """``out_cache_loc[packed slice i] = req_to_token[r_i, start_i:end_i]`` (``assign_extend_cache_locs``)."""
    for row, (start, end, at) in zip(req_pool_indices.tolist(), _offsets(start_offset, end_offset)):
        out_cache_loc[at:at + end - start] = req_to_token[row, start:end].to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len,
                                           topk, num_cols) -> None:
    """Request i's ``topk * num_cols`` slots from ``seq_lens[i]`` on (``assign_draft_cache_locs_contiguous``)."""
    width = topk * num_cols
    for i, (row, start) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        out_cache_loc[i * width:(i + 1) * width] = req_to_token[row, start:start + width].to(out_cache_loc.dtype)


def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc) -> None:
    """Pack ``out_cache_loc[accept_index[j]]`` for every ``accept_index[j] != -1``, in order (``fill_accept_out_cache_loc``)."""
    accepted = accept_index.reshape(-1)
    accepted = accepted[accepted != -1]
    accept_out_cache_loc[:accepted.numel()] = out_cache_loc[accepted].to(accept_out_cache_loc.dtype)


def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride) -> None:
    """``bonus[i] = accept_tokens[i * stride + accept_lens[i] - 1]``: the last accepted slot (``fill_bonus_tokens``)."""
    flat = accept_tokens.reshape(-1)
    index = torch.arange(accept_lens.numel(), device=flat.device) * int(accept_stride) + accept_lens.long() - 1
    bonus_tokens.copy_(flat[index].to(bonus_tokens.dtype))


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc) -> None:
    """Copy slot ``src_loc[j]`` to slot ``tgt_loc[j]`` in every buffer of the pool (``copy_all_layer_kv_cache_tiled``).

    ``data_ptrs[b]`` is buffer b's base address and ``strides[b]`` its bytes per slot (SGLang's
    ``_init_data_ptrs_and_strides``). All sources are read before any target is written, as the
    kernel loads a tile before it stores it ("safe for in-place copy")."""
    pairs = list(zip(tgt_loc.tolist(), src_loc.tolist()))
    for base, stride in zip(data_ptrs.tolist(), strides.tolist()):
        rows = [ctypes.string_at(base + src * stride, stride) for _, src in pairs]
        for (tgt, _), row in zip(pairs, rows):
            ctypes.memmove(base + tgt * stride, row, stride)


def build_tree_kernel_efficient_cpu(parent_list, selected_index, verified_seq_len, tree_mask, positions,
                                    retrieve_index, retrieve_next_token, retrieve_next_sibling, topk, depth,
                                    draft_token_num, tree_mask_mode) -> None:
    """The EAGLE draft tree of each request (``sgl_build_tree_kernel_efficient_triton``, line by line).

    Node 0 is the verified token; node i > 0 is draft token ``selected_index[b, i - 1]``, whose
    parent is found through ``parent_list``. Writes each node's position, the retrieval links
    (first child in ``retrieve_next_token``, next sibling in ``retrieve_next_sibling``) and the
    tree mask (FULL_MASK: per node the prefix and its ancestors; QLEN_ONLY: ancestors only)."""
    n = int(draft_token_num)
    parents = parent_list.reshape(parent_list.shape[0], -1).tolist()
    selected = selected_index.reshape(selected_index.shape[0], -1).tolist()
    seq_lens = verified_seq_len.tolist()
    mask = tree_mask.view(-1)
    prefix = 0
    for b, seq_len in enumerate(seq_lens):
        sel, par = selected[b], parents[b]

        def position_of(token_index):  # the node whose selected index is token_index, or None
            for pp in range(n - 1):
                if sel[pp] == token_index:
                    return pp
            return None

        positions[b * n] = seq_len
        for i in range(n - 1, 0, -1):
            retrieve_index[b, i] = b * n + i
            parent_tb = sel[i - 1] // topk
            parent_position = 0 if parent_tb == 0 else position_of(par[parent_tb])
            if parent_position is None:
                continue
            if parent_tb != 0:
                parent_position += 1
            next_token = int(retrieve_next_token[b, parent_position])
            retrieve_next_token[b, parent_position] = i
            if next_token != -1:
                retrieve_next_sibling[b, i] = next_token
        retrieve_index[b, 0] = b * n

        tree_start = n * n * b + prefix * n
        for x in range(n):
            if int(tree_mask_mode) == 0:  # FULL_MASK: rows of (seq_len + n) columns
                at = tree_start + (seq_len + n) * x + seq_len + 1
            else:  # QLEN_ONLY: rows of n columns
                at = n * n * b + n * x + 1
            mask[at - 1] = True
            mask[at:at + n - 1] = False
            if x == 0:
                continue
            cur, position = x - 1, 0
            for _ in range(int(depth)):
                position += 1
                mask[at + cur] = True
                parent_tb = sel[cur] // topk
                if parent_tb == 0:
                    break
                found = position_of(par[parent_tb])
                if found is None:
                    break
                cur = found
            positions[b * n + x] = position + seq_len
        prefix += seq_len


def verify_tree_greedy_cpu(predicts, accept_index, accept_token_num, candidates, retrive_index,
                           retrive_next_token, retrive_next_sibling, target_predict) -> None:
    """Greedy verification of each request's draft tree (``verify_tree_greedy_kernel_triton``).

    From the root, follow the child whose draft token equals the target's greedy token at the
    last accepted node; record each accepted node's flat index in ``accept_index[b, 1:]``, the
    target's token there in ``predicts``, and the count in ``accept_token_num``. The target's token
    after the last accepted node (the bonus) is written at that node."""
    batch, n = candidates.shape
    steps = accept_index.shape[1]
    flat_target = target_predict.reshape(-1)
    for b in range(batch):
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for j in range(1, steps):
            cur = int(retrive_next_token[b, cur])
            target_token = int(flat_target[last])
            matched = False
            while cur != -1:
                if int(candidates[b, cur]) == target_token:
                    predicts[last] = target_token
                    accepted += 1
                    last = int(retrive_index[b, cur])
                    accept_index[b, accepted] = last
                    matched = True
                    break
                cur = int(retrive_next_sibling[b, cur])
            if not matched:
                break
        accept_token_num[b] = accepted
        predicts[last] = flat_target[last]
