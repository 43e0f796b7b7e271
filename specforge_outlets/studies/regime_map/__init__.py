"""The regime map: where a length prediction pays against SGLang's best prediction-free configuration.

The study's command is ``benchmarks/regime_map.py``; its parts:

- ``arrivals``: the arrival processes (Poisson, Poisson with bursts above capacity, a real trace's own timing,
  a batch at once);
- ``regimes``: the clusters, the regimes (a cluster and an arrival process), the configurations (SGLang's peers and
  the prediction configurations) and the rungs run in every cell;
- ``capacity``: each cluster's capacity, measured by a short bisection in the simulator;
- ``metrics``: a run's figures, whole-trace and in the steady window;
- ``cells``: a cell's runs (one regime, shape, load and seed), resumable;
- ``report`` and ``plot``: ``map.json``, ``map.md`` and the figure, from the cells written.
"""
