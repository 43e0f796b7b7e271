"""Files the package ships (recipes, the llama-server build script) and data it reads when present (``../shared``), wherever it is installed.

A wheel (``pip install .``) carries ``recipes/`` and ``scripts/build-llama-server.sh`` inside the
package (setup.py copies them at build time); an editable install reads the checkout's ``recipes/``.
A recipe can be named instead of given by path (``outlets train --config llama3.1-8b-outlets``), so
that the commands written in the docs work from an installed package too; ``outlets recipes`` lists
them. The shared benchmark data is never shipped: it is read from ``$OUTLETS_SHARED_DIR``, or from
``../shared`` beside a checkout.
"""

from __future__ import annotations

import os
from typing import List, Optional

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
CHECKOUT_DIR = os.path.dirname(PACKAGE_DIR)
ENV_SHARED_DIR = "OUTLETS_SHARED_DIR"
RECIPE_SUFFIX = ".yaml"


def recipes_dir() -> str:
    """The directory of the recipes: the installed package's copy, else the checkout's."""
    bundled = os.path.join(PACKAGE_DIR, "recipes")
    return bundled if os.path.isdir(bundled) else os.path.join(CHECKOUT_DIR, "recipes")


def recipe(name: str) -> str:
    """Path of a shipped recipe file, e.g. ``recipe("cluster-h100-1p3d.yaml")``."""
    return os.path.join(recipes_dir(), name)


def shipped_recipes() -> List[str]:
    """Paths of the shipped recipes (training recipes and cluster configs), by name."""
    directory = recipes_dir()
    if not os.path.isdir(directory):
        return []
    return sorted(os.path.join(directory, name) for name in os.listdir(directory) if name.endswith(RECIPE_SUFFIX))


def resolve_recipe(path_or_name: str) -> str:
    """A recipe as given when that file exists, else the shipped recipe it names: ``llama3.1-8b-outlets``,
    ``llama3.1-8b-outlets.yaml`` or ``recipes/llama3.1-8b-outlets.yaml`` (a checkout's path, which an
    installed package reads from its own copy). Unknown: returned as given, for the caller's error and
    :func:`where_recipes_are`."""
    if os.path.exists(path_or_name):
        return path_or_name
    name = path_or_name[len("recipes/"):] if path_or_name.startswith("recipes/") else path_or_name
    for candidate in (name, name + RECIPE_SUFFIX):
        shipped = os.path.join(recipes_dir(), candidate)
        if os.sep not in candidate and os.path.isfile(shipped):
            return shipped
    return path_or_name


def where_recipes_are() -> str:
    """The end of a missing recipe's error: where the shipped copies are and how to list them."""
    return f"the shipped recipes are in {recipes_dir()} (list them: outlets recipes; name one without a path)"


def recipe_relative(path: str) -> str:
    """A path written in a recipe relative to the repository (``recipes/drafts/...``), made absolute."""
    return path if os.path.isabs(path) else os.path.join(os.path.dirname(recipes_dir()), path)


def script(name: str) -> str:
    """Path of a shipped script of ``scripts/`` (e.g. ``build-llama-server.sh``): the installed package's copy,
    else the checkout's."""
    bundled = os.path.join(PACKAGE_DIR, "scripts", name)
    return bundled if os.path.isfile(bundled) else os.path.join(CHECKOUT_DIR, "scripts", name)


def shared_data(relative: str) -> Optional[str]:
    """A file of the shared benchmark data (``data/traces/...``) if it is on this machine, else None."""
    roots = [os.environ[ENV_SHARED_DIR]] if os.environ.get(ENV_SHARED_DIR) else []
    roots.append(os.path.join(os.path.dirname(CHECKOUT_DIR), "shared"))
    for root in roots:
        path = os.path.join(root, relative)
        if os.path.isfile(path):
            return path
    return None
