"""Test-harness stub, not part of the plugin: see tests/sglang_harness/stubs/_harness_stub.py.

The CPU functions of SGLang's EAGLE-3 path have torch references (``speculative_reference.py``);
every other name is a placeholder that raises when used."""

from _harness_stub import make_getattr
from sgl_kernel.speculative_reference import (  # noqa: F401
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    build_tree_kernel_efficient_cpu,
    copy_all_layer_kv_cache_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    verify_tree_greedy_cpu,
)

__getattr__ = make_getattr(__name__)
