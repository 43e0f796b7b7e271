"""OUTLETS, SD-only and LP-only drafts trained until their validation curves flatten (or a stated budget).

The study's command, and what it runs, is ``benchmarks/convergence.py``; its parts:

- ``curves``: a run directory's layout and the committed ``curves.json`` each draft's points go to;
- ``training_runs``: the validation split, training a draft while its doubling checkpoints are scored;
- ``scoring``: the chosen checkpoints on the test split, and what of it is committed;
- ``scaling``: OUTLETS and the N/2 probe on nested subsets of the fit split.
"""
