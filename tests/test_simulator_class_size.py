"""The simulator stays one small scheduler per engine model: no class grows past a screenful or two.

Issue 47 split a 560-line class that modelled four engines behind mode flags; this keeps the split honest.
"""

import ast
import os

import specforge_outlets.simulation as simulation

MAX_CLASS_LINES = 300  # a class longer than this is doing two engines' work again


def simulator_classes():
    """(path, class name, lines) of every class in specforge_outlets/simulation/."""
    root = os.path.dirname(simulation.__file__)
    for directory, _, files in os.walk(root):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                tree = ast.parse(open(path, encoding="utf-8").read(), path)
                for node in ast.walk(tree):
                    if isinstance(node, ast.ClassDef):
                        yield os.path.relpath(path, root), node.name, node.end_lineno - node.lineno + 1


def test_the_walk_finds_the_schedulers():
    names = {name for _, name, _ in simulator_classes()}
    assert {"Simulation", "SimRequest", "Scheduler"} <= names


def test_no_simulator_class_over_the_limit():
    too_long = [f"{path}:{name} ({lines} lines)" for path, name, lines in simulator_classes() if lines > MAX_CLASS_LINES]
    assert too_long == [], f"split these into smaller pieces: {too_long}"
