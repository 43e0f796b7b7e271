"""The registry: every hook target of the plugin, assembled from the modules that implement them.

Each area module exports ``HOOK_TARGETS`` as ``(target, function, hook type, features that need it)``;
``register_all`` hands them to SGLang's ``HookRegistry`` and records them in ``state``, which knows
which applied and refuses a feature whose hooks did not (``state.check_hooks``).
"""

from __future__ import annotations

from sglang_patches import (cli, client_predictions, kv_admission, load_endpoint, meta_info, ordering, pd_transfer,
                            predictor_mode, routing, speculative, state)

AREAS = (cli, ordering, kv_admission, meta_info, client_predictions, routing, load_endpoint, predictor_mode, speculative,
         pd_transfer)


def register_all() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for area in AREAS:
        for target, function, kind, features in area.HOOK_TARGETS:
            if target not in state.registered_targets():
                state.record_target(target, features)
                HookRegistry.register(target, function, getattr(HookType, kind))
