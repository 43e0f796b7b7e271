"""OUTLETS plugin for SGLang, scheduling by predicted output length.

- ``--schedule-policy outlets``: SGLang's own KV admission by default (``--outlets-kv-admission peak`` admits a
  waiting request only while the predicted peak of the cache with it fits; ``predicted`` charges a request its
  predicted remaining length + ``--outlets-kv-margin`` (20%) instead) and the tail-safe waiting-queue order (FCFS
  within a short and a predicted-long class, a long request yielding only briefly, ``--outlets-long-holdback``;
  ``--outlets-order sjf`` for shortest predicted remaining first with aging); retraction of the longest predicted
  remaining first; the same order on the PD decode queue.
- ``--load-balance-method outlets``: fewest requests, ties by least predicted work, across data-parallel ranks.
- Predictions from the request (``custom_params.outlets_predicted_output_len``), from an OUTLETS draft
  at prefill (``--outlets-draft-path``, predictor-only mode) or from the running EAGLE-3 draft;
  ``predicted_output_len`` in ``meta_info``; the draft architecture ``OutletsLlamaForCausalLMEagle3``
  in SGLang's ModelRegistry. docs/serving.md has every flag and what it defaults to.

Registered under SGLang's general-plugin entry point group ``sglang.srt.plugins`` (see setup.py), so
``pip install`` of this package is all it takes: SGLang calls :func:`load` in every process it
starts. Importing this package imports nothing from SGLang; :func:`load` does.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("sglang_patches")

def load() -> None:
    """Entry point called by ``sglang.srt.plugins.load_plugins()`` (no arguments)."""
    from sglang_patches import registry, state

    if state.PLUGIN.loaded:
        return
    state.PLUGIN.loaded = True

    registry.register_all()
    try:
        from sglang_patches import eagle3_draft

        eagle3_draft.register()
    except Exception as error:  # never let the draft class break the scheduling plugin
        logger.warning("OUTLETS draft architecture not registered with SGLang's ModelRegistry: %r", error)
