"""A tests' and studies' SGLang plugin: lets SGLang 0.5.23's EAGLE-3 worker run on CPU with ``torch_native``.

Found by SGLang's ``sglang.srt.plugins`` entry point through the ``.dist-info`` beside this file
when the harness puts this directory on a server's ``PYTHONPATH`` (``SGLangServer(..., eagle3_cpu=True)``).
SGLang's CPU speculative path is built for the ``intel_amx`` backend and the real ``sgl_kernel``
extension; with ``torch_native`` two pieces are missing (tests/sglang_harness/README.md):

- the draft worker has no ``torch_native`` case for its draft-extend backend (``ValueError: EAGLE is
  not supported in attention backend torch_native``): here it gets a plain ``TorchNativeAttnBackend``
  of the draft's own model runner, as the ``intel_amx`` case builds its own backend;
- ``TorchNativeAttnBackend.forward_extend`` reads ``extend_prefix_lens`` / ``extend_seq_lens``,
  which a TARGET_VERIFY batch does not carry: here they are derived from the verify input as the
  ``intel_amx`` backend does (each request extends its ``seq_lens`` by ``draft_token_num`` tokens).
  With ``--speculative-eagle-topk 1`` the draft tokens form a chain, so the causal mask that
  ``torch_native`` applies is exactly the verify tree's mask; a wider tree is refused.

Only ``--speculative-num-steps 1`` is covered (no multi-step draft decode backend is needed); SGLang
refuses more steps with ``torch_native`` by itself. Never part of the plugin.
"""

import torch

_FIELDS = ("seq_lens", "extend_prefix_lens", "extend_seq_lens")


def _draft_extend_backend(original, self, *args, **kwargs):
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.runtime_context import attention_backends

    if (self.draft_attn_backend or attention_backends()[0]) != "torch_native":
        return original(self, *args, **kwargs)
    backend = TorchNativeAttnBackend(self.draft_model_runner)
    backend.prefill_attention_backend_str = backend.decode_attention_backend_str = "torch_native"
    return backend


def _forward_extend(original, self, q, k, v, layer, forward_batch, *args, **kwargs):
    if not forward_batch.forward_mode.is_target_verify():
        return original(self, q, k, v, layer, forward_batch, *args, **kwargs)
    spec = forward_batch.spec_info
    if spec.tree_topk != 1:
        raise NotImplementedError(
            "sglang_plugins/eagle3_cpu: torch_native verifies a chain of draft tokens only "
            f"(--speculative-eagle-topk 1), got topk={spec.tree_topk}")
    saved = {name: getattr(forward_batch, name) for name in _FIELDS}
    prefix = forward_batch.seq_lens  # [B] tokens before the draft tokens
    draft = torch.full_like(prefix, spec.draft_token_num)
    forward_batch.seq_lens, forward_batch.extend_prefix_lens, forward_batch.extend_seq_lens = (
        prefix + draft, prefix, draft)
    try:
        return original(self, q, k, v, layer, forward_batch, *args, **kwargs)
    finally:
        for name, value in saved.items():
            setattr(forward_batch, name, value)


def load() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register("sglang.srt.speculative.draft_utils.DraftBackendFactory.create_draft_extend_backend",
                          _draft_extend_backend, HookType.AROUND)
    HookRegistry.register("sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend",
                          _forward_extend, HookType.AROUND)
