"""OUTLETS plugin for SGLang: ``--schedule-policy outlets`` (shortest predicted remaining length first,
with aging), ``--load-balance-method outlets`` (least predicted work), predictions in ``meta_info``.

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
    from sglang_patches import hooks

    hooks.register_all()
