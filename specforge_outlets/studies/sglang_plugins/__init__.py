"""SGLang plugins that the studies and the tests put on a server's ``PYTHONPATH``, never the OUTLETS plugin itself.

Each directory holds one plugin module and the ``.dist-info`` whose entry point SGLang's plugin
loader finds once the directory is on the server's path; installed, they load in no server.

- ``timing/``: logs the scheduler's prefill scheduling time per round and the waiting-list sort
  inside it (the OUTLETS plugin's or SGLang's ``lof``), and decode step times ("HARNESS" log lines:
  ``benchmarks/scheduler_server_check.py``, ``benchmarks/eagle3_cpu.py``).
- ``eagle3_cpu/``: what SGLang 0.5.23's EAGLE-3 worker lacks on CPU with ``torch_native``
  (tests/sglang_harness/README.md).
- ``pd_cpu/``: turns off the mooncake KV sender's host tensor indices, so that prefill and decode
  instances run on a CPU-only machine.
"""

import os

HERE = os.path.dirname(os.path.abspath(__file__))
TIMING = os.path.join(HERE, "timing")
EAGLE3_CPU = os.path.join(HERE, "eagle3_cpu")
PD_CPU = os.path.join(HERE, "pd_cpu")
