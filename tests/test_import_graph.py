"""The import graph of ``specforge_outlets/``: no cycle between modules, and every arrow between rooms goes down.

A room is a sub-package (``data``, ``model``, ...) or a top-level module (``errors``, ``cli``, ...). The graph
is read from the source with ``ast``, so imports inside functions count as much as those at the top: a
function-level import hides an arrow from Python's import order, not from the design. ``cli`` reaches its
commands through ``COMMAND_MODULES`` (strings, for a fast ``outlets --help``); those count as arrows too.
"""

from __future__ import annotations

import ast
import os
from collections import defaultdict
from typing import Dict, List, Set, Tuple

PACKAGE = "specforge_outlets"
ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), PACKAGE)

# The rooms, bottom first: a room may import only rooms of a lower layer (rooms of one layer know nothing
# of each other). The order follows the data: prompts and targets (data) -> the draft and its heads
# (model) -> training -> evaluation of the trained predictors -> serving metrics -> the simulator ->
# load generation and the demo -> the CLI that dispatches to every command -> studies, which script
# those commands the way a user would. ``scheduling`` sits low because it is the pure core (length
# distributions, order keys, KV admission: no torch, no project imports) that training's quantile
# levels, the simulator and the SGLang plugin all read.
LAYERS: Tuple[Tuple[str, ...], ...] = (
    ("errors", "atomic", "resources", "strict_json"),  # base helpers
    ("scheduling", "wandb_report"),
    ("data",),
    ("model",),
    ("training",),
    ("evaluation",),
    ("serving",),
    ("simulation",),
    ("loadgen", "demo", "recipes_command"),
    ("cli",),
    ("studies",),
)
LAYER_OF = {room: index for index, rooms in enumerate(LAYERS) for room in rooms}


def module_files() -> Dict[str, str]:
    """Dotted module name -> source path, for every module of the package."""
    modules = {}
    for directory, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                dotted = os.path.relpath(path[:-3], os.path.dirname(ROOT)).replace(os.sep, ".")
                modules[dotted.removesuffix(".__init__")] = path
    return modules


def imported_modules(module: str, path: str, modules: Dict[str, str]) -> Set[str]:
    """The package's modules that ``module`` imports anywhere in its source."""
    package = module.split(".") if path.endswith("__init__.py") else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    found.add(f"{base}.{alias.name}")
                elif base in modules:
                    found.add(base)
    return found


def import_graph() -> Dict[str, Set[str]]:
    modules = module_files()
    graph = {module: imported_modules(module, path, modules) for module, path in modules.items()}
    from specforge_outlets.cli import COMMAND_MODULES

    graph[f"{PACKAGE}.cli"] |= set(COMMAND_MODULES)
    return graph


def room(module: str) -> str:
    return module.split(".")[1] if "." in module else "<package>"


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            successor = next(successors, None)
            if successor is not None:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph.get(successor, ())))))
                elif successor in on_stack:
                    low[node] = min(low[node], index[successor])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def room_graph(graph: Dict[str, Set[str]]) -> Dict[str, Set[str]]:
    rooms = defaultdict(set)
    for module, imported in graph.items():
        rooms[room(module)].update(room(other) for other in imported if room(other) != room(module))
    return rooms


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_every_room_has_a_layer():
    rooms = {room(module) for module in module_files()} - {"<package>"}
    assert sorted(rooms - set(LAYER_OF)) == [], "a new room: give it a layer in LAYERS"
    assert sorted(set(LAYER_OF) - rooms) == [], "LAYERS names a room that no longer exists"


def test_no_module_imports_itself_through_others():
    assert cycles(import_graph()) == []


def test_no_two_rooms_import_each_other():
    assert cycles(room_graph(import_graph())) == []


def test_every_arrow_between_rooms_goes_down():
    upward = sorted(f"{module} -> {other}" for module, imported in import_graph().items() for other in imported
                    if room(other) != room(module) and LAYER_OF[room(other)] >= LAYER_OF[room(module)])
    assert upward == []
