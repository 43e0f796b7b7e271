"""The ladder of predictors: does better prediction give better serving, against SGLang at its best?

The study's command, and what it runs, is ``benchmarks/predictor_ladder.py``; its parts:

- ``rungs``: the workloads, and each rung's predicted lengths for their requests;
- ``cells``: the scheduler configurations and peers, and a cell's runs (one workload, cache, load and seed),
  resumable;
- ``quality``: each rung's censoring-aware C-index per workload;
- ``report`` and ``plot``: ``report.md`` and the figure, from the cells written.
"""
