"""``outlets recipes``: the recipes this installation ships, with their paths.

A wheel carries the recipes inside the package (``resources.py``), where a user who did not clone
the repository would not look; each is listed by the name the commands take (``outlets train
--config llama3.1-8b-outlets``), the command that reads it, its path (to copy and edit) and the
first line of its own comment.
"""

from __future__ import annotations

import os

import yaml

from specforge_outlets import resources

# A recipe's top-level key -> the command that reads it (training recipes carry an ``outlets:`` block,
# cluster configs a serving ``mode``).
COMMAND_BY_KEY = (("outlets", "outlets train --config"), ("mode", "outlets simulate --config"))


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "recipes",
        help="list the shipped recipes (training recipes, cluster configs) with their paths",
        description="List the recipes this installation ships: the name `outlets train --config` and "
                    "`outlets simulate --config` take, the command, the path (copy it to edit) and what it is.",
    )
    parser.set_defaults(func=run)


def run(args) -> int:
    paths = resources.shipped_recipes()
    print(f"recipes shipped in {resources.recipes_dir()} ({len(paths)}); give the name, or a path to your own copy:")
    for path in paths:
        name = os.path.basename(path)[: -len(resources.RECIPE_SUFFIX)]
        print(f"  {name:<40} {_command(path):<27} {path}")
        summary = _first_comment(path)
        if summary:
            print(f"      {summary}")
    return 0


def _command(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        keys = yaml.safe_load(handle) or {}
    return next((command for key, command in COMMAND_BY_KEY if key in keys), "")


def _first_comment(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        first = handle.readline().strip()
    return first.lstrip("#").strip() if first.startswith("#") else ""
