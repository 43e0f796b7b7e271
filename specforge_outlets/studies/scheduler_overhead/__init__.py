"""What the plugin costs on SGLang's scheduler hot path, side by side with SGLang's own policies.

The study's command, and what it measures, is ``benchmarks/scheduler_overhead.py`` (serve environment);
its parts:

- ``requests``: stand-in SGLang ``Req`` objects arriving into a waiting list, and the timer;
- ``ordering``: the per-round sort of the waiting list, the plugin's and SGLang's;
- ``routing``: the per-dispatch rank choice, and the predicted work added to each load snapshot;
- ``predictor``: the OUTLETS draft's cost per request in predictor-only mode;
- ``measure``, ``report`` and ``plot``: result.json, report.md and the figure.
"""
