"""Trace-driven discrete-event simulation of LLM serving (``outlets simulate``).

trace.py (requests) -> predicted_lengths.py (predicted lengths) -> engine.py (cluster, using the shared
scheduling core) -> metrics.py -> study.py (policy and predictor sweeps) -> report.py.
"""
