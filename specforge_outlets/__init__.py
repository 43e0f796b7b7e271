"""OUTLETS: output-length prediction from EAGLE-3 speculative-decoding draft states.

Data flow, one sub-package per stage:
    data/        prompts -> regenerated responses -> captured target features + length labels
    model/       the OUTLETS draft: EAGLE-3 draft with gated attention and a length head
    training/    the ``eagle3-outlets`` algorithm on SpecForge, CLI train/export
    evaluation/  predictions -> MAE reports against baselines
    scheduling/  the ordering key and routing rule shared by the SGLang plugin and the simulator
    simulation/  trace-driven serving simulation

A sub-package imports only those below it in ``LAYERS`` of ``tests/test_import_graph.py`` (the data
flow above, with the scheduling core and the small base modules at the bottom), and no module imports
itself through others.
"""

__version__ = "0.1.0"
