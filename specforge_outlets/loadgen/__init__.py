"""Load generation against real servers, measured with the simulator's metrics (``outlets bench-serving``, ``outlets compare-runs``).

workload.py (what to send and when: a prompt dataset at a Poisson rate, or a trace replayed at its
own arrival times) -> client.py (one streaming native ``/generate`` request, recorded) ->
bench_command.py (``outlets bench-serving``: schedule, send, summarize, write) ->
compare_command.py (``outlets compare-runs``: simulated and measured runs in one table and plot).
The summaries use ``specforge_outlets/serving/metrics.py``, so both kinds of run share a schema.
"""
