"""What the studies under benchmarks/ share, in the package rather than in scripts importing each other.

- ``committed_data``: the committed label set's evaluation record and the shared data's paths;
- ``sharegpt_serving``: the simulated serving study's workloads, clusters and runs (its own command is
  ``benchmarks/serving_study_sharegpt.py``; the admission, routing and distribution studies run its workloads);
- ``kv_bound_server``: the KV-bound real-server study's servers, workloads and runs (``benchmarks/kv_bound_server_study.py``;
  the PD router study and the simulator check reuse them);
- ``sglang_plugins``: the SGLang plugins a study's servers need on this CPU or to time the scheduler.
"""
