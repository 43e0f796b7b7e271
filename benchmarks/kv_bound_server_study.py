"""KV-bound SGLang servers on this CPU: the plugin's orders and KV admission against SGLang's own, real requests.

The study (servers, runs, report, plot) is ``specforge_outlets.studies.kv_bound_server``, which the PD
router study and the simulator check share; its docstring says what it runs and how.

    .venv/bin/python benchmarks/kv_bound_server_study.py run       # runs/kv-bound-server/
    .venv/bin/python benchmarks/kv_bound_server_study.py report    # benchmarks/data/kv-bound-server/
    .venv/bin/python benchmarks/kv_bound_server_study.py plot      # docs/figures/kv-bound-server.png
"""

from specforge_outlets.studies.kv_bound_server import main

if __name__ == "__main__":
    main()
