"""Serving study on real length distributions with learned predictions, against SGLang's own policies.

The study (workloads, runs, report, plots) is ``specforge_outlets.studies.sharegpt_serving``, which the
other serving studies share; its docstring says what it runs and how.

    .venv/bin/python benchmarks/serving_study_sharegpt.py    # ../shared needed once per workload
"""

from specforge_outlets.studies.sharegpt_serving import main

if __name__ == "__main__":
    main()
