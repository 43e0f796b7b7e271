"""Load generation against real servers, measured with the simulator's metrics (``outlets bench-serving``, ``outlets compare-runs``).

workload.py (what to send and when: a prompt dataset at a Poisson rate, or a trace replayed at its
own arrival times) -> client.py (one streaming native ``/generate`` request, recorded) ->
bench_command.py (``outlets bench-serving``: schedule, send, summarize, write) ->
compare_command.py (``outlets compare-runs``: simulated and measured runs in one table and plot).
The summaries use ``specforge_outlets/serving/metrics.py``, so both kinds of run share a schema.

sglang_server.py and sglang_router.py start real SGLang servers and sglang-router on loopback and stop
them: the servers that the studies and benchmark scripts send load to through ``outlets bench-serving``,
and the tests' servers (``tests/sglang_harness/server.py``).
"""
