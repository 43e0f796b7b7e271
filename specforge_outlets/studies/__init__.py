"""What the studies under benchmarks/ share, in the package rather than in scripts importing each other.

So far: the SGLang plugins a study's servers need on this CPU or to time the scheduler
(``sglang_plugins``); the workloads, runs and reports the scripts still share among themselves are
to follow.
"""
