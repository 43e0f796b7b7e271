"""What simulated and measured serving runs share: request traces, the metrics schema, the summary file.

``outlets simulate`` (``simulation/``) and ``outlets bench-serving`` (``loadgen/``) both read
traces through ``trace.py``, summarise per-request times through ``metrics.py`` and write
``summary.json`` through ``summary.py``, so ``outlets compare-runs`` can put them side by side.
``request_params.py`` holds the ``custom_params`` keys that the load generator sends and the plugin
(``sglang_patches``) reads, so that the plugin imports nothing of the load generator.
"""
