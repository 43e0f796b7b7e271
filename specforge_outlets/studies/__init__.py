"""What the studies under benchmarks/ share, in the package rather than in scripts importing each other.

- ``committed_data``: the committed label set's evaluation record and the shared data's paths;
- ``sharegpt_serving``: the simulated serving study's workloads, clusters and runs (its own command is
  ``benchmarks/serving_study_sharegpt.py``; the admission, routing and distribution studies run its workloads);
- ``kv_bound_server``: the KV-bound real-server study's servers, workloads and runs (``benchmarks/kv_bound_server_study.py``;
  the PD router study and the simulator check reuse them);
- ``predictor_ladder``: the ladder of predictors' rungs, cells, quality, report and figure
  (``benchmarks/predictor_ladder.py``);
- ``convergence``: the three drafts trained to a flat validation curve, scored on the test split, and the
  scaling runs (``benchmarks/convergence.py``);
- ``scheduler_overhead``: the plugin's cost on SGLang's scheduler hot path (``benchmarks/scheduler_overhead.py``);
- ``sglang_plugins``: the SGLang plugins a study's servers need on this CPU or to time the scheduler.
"""
