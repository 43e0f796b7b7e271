"""Trace-driven discrete-event simulation of LLM serving (``outlets simulate``).

``serving/trace.py`` (requests) -> predicted_lengths.py (predicted lengths) -> engine.py (cluster: the event
heap, routing, prefill.py's prefill instances and one scheduler per decoding instance from schedulers/, one
per engine model, using the shared scheduling core) -> ``serving/metrics.py`` (per-request times
summarised) -> study.py (policy and predictor sweeps) -> report.py (tables, plots and
``serving/summary.py``'s summary.json).
"""
