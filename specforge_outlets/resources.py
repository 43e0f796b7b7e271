"""Files the package ships (recipes, the llama-server build script) and data it reads when present (``../shared``), wherever it is installed.

A wheel (``pip install .``) carries ``recipes/`` and ``scripts/build-llama-server.sh`` inside the
package (setup.py copies them at build time); an editable install reads the checkout's ``recipes/``. The shared benchmark data is never
shipped: it is read from ``$OUTLETS_SHARED_DIR``, or from ``../shared`` beside a checkout.
"""

from __future__ import annotations

import os
from typing import Optional

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
CHECKOUT_DIR = os.path.dirname(PACKAGE_DIR)
ENV_SHARED_DIR = "OUTLETS_SHARED_DIR"


def recipes_dir() -> str:
    """The directory of the recipes: the installed package's copy, else the checkout's."""
    bundled = os.path.join(PACKAGE_DIR, "recipes")
    return bundled if os.path.isdir(bundled) else os.path.join(CHECKOUT_DIR, "recipes")


def recipe(name: str) -> str:
    """Path of a shipped recipe file, e.g. ``recipe("cluster-h100-1p3d.yaml")``."""
    return os.path.join(recipes_dir(), name)


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
