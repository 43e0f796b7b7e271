"""OUTLETS plugin for SGLang: ``--schedule-policy outlets`` (shortest predicted remaining length first,
with aging), ``--load-balance-method outlets`` (least predicted work), predictions in ``meta_info``,
and the OUTLETS draft architecture ``OutletsLlamaForCausalLMEagle3`` in SGLang's ModelRegistry.

Registered under SGLang's general-plugin entry point group ``sglang.srt.plugins`` (see setup.py), so
``pip install`` of this package is all it takes: SGLang calls :func:`load` in every process it
starts. Importing this package imports nothing from SGLang; :func:`load` does.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("sglang_patches")

_loaded = False


def load() -> None:
    """Entry point called by ``sglang.srt.plugins.load_plugins()`` (no arguments)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    from sglang_patches import registry

    registry.register_all()
    try:
        from sglang_patches import eagle3_draft

        eagle3_draft.register()
    except Exception as error:  # never let the draft class break the scheduling plugin
        logger.warning("OUTLETS draft architecture not registered with SGLang's ModelRegistry: %r", error)
