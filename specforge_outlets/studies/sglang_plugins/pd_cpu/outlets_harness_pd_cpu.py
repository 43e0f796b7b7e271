"""A tests' and studies' SGLang plugin: lets a prefill instance of SGLang 0.5.23 send its KV over mooncake_tcp on CPU.

Found by SGLang's ``sglang.srt.plugins`` entry point through the ``.dist-info`` beside this file when
the harness puts this directory on a server's ``PYTHONPATH`` (``SGLangServer(..., pd_cpu=True)``).
``MooncakeKVSender.supports_host_tensor_indices`` makes the prefill pin host memory and record CUDA
events for its KV indices (``disaggregation/prefill.py``), which a CPU-only machine cannot; with it
off the sender takes the plain path, as any backend without host indices does. The other CPU
work-arounds are server flags (``--disable-overlap-schedule``,
``--disaggregation-decode-retraction-backup cpu_tensor``: ../shared/notes/pd-and-router.md). Never
part of the plugin.
"""


def _without_host_tensor_indices(result, self, *args, **kwargs):
    self.supports_host_tensor_indices = False
    return result


def load():
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register("sglang.srt.disaggregation.mooncake.conn.MooncakeKVSender.__init__",
                          _without_host_tensor_indices, HookType.AFTER)
