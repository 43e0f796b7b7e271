"""An offline batch on real SGLang servers on this CPU: SJF by OUTLETS r̂₀, its prefill-only pass charged,
against SGLang's fcfs (with its A/A control) and lof.

The study (servers, runs, report, plot) is ``specforge_outlets.studies.batch_server``; its docstring says
what it runs and how.

    .venv/bin/python benchmarks/batch_server_study.py run --runs-dir /work/outlets-runs/batch-server-ordered \
        --servers fcfs "fcfs (A/A control)" "outlets sjf"
    .venv/bin/python benchmarks/batch_server_study.py report --runs-dir /work/outlets-runs/batch-server-ordered
    .venv/bin/python benchmarks/batch_server_study.py plot
"""

from specforge_outlets.studies.batch_server import main

if __name__ == "__main__":
    main()
