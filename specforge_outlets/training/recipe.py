"""A recipe is a SpecForge run config plus an ``outlets:`` block.

``section.key=value`` overrides address either part (``outlets.length_loss_weight=0`` or
``training.learning_rate=1e-4``). SpecForge's own validation errors are re-raised naming the
offending field, so a typo never reaches a training process.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence, Tuple

import yaml

from specforge_outlets.errors import OutletsError
from specforge_outlets.resources import resolve_recipe, where_recipes_are
from specforge_outlets.training.settings import OutletsSettings

OUTLETS_BLOCK = "outlets"


@dataclass(frozen=True)
class Recipe:
    config: Any  # specforge.config.Config
    settings: OutletsSettings


def read_recipe_file(path: str) -> Dict[str, Any]:
    try:
        with open(path) as f:
            raw = yaml.safe_load(f)
    except FileNotFoundError:
        raise OutletsError(f"recipe {path} does not exist; {where_recipes_are()}") from None
    except yaml.YAMLError as exc:
        raise OutletsError(f"recipe {path} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise OutletsError(f"recipe {path} must be a mapping of sections (model, data, training, outlets, ...)")
    return raw


def beside_recipe(recipe_path: str, value: str) -> str:
    """A relative path in a recipe (``recipes/drafts/...``): as given when it exists from the current
    directory, else from the folder that holds the recipe's ``recipes/`` (the checkout, or the installed
    package), so that `outlets train --config CHECKOUT/recipes/X.yaml` works from any directory."""
    if os.path.isabs(value) or os.path.exists(value):
        return value
    candidate = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(recipe_path))), value)
    return candidate if os.path.exists(candidate) else value


def split_overrides(overrides: Sequence[str]) -> Tuple[Dict[str, Any], List[str]]:
    """(``outlets.*`` overrides as parsed values, the rest for SpecForge)."""
    outlets: Dict[str, Any] = {}
    rest: List[str] = []
    for item in overrides:
        if "=" not in item:
            raise OutletsError(f"override {item!r} is not of the form section.key=value")
        path, value = item.split("=", 1)
        if path.startswith(f"{OUTLETS_BLOCK}."):
            outlets[path[len(OUTLETS_BLOCK) + 1 :]] = yaml.safe_load(value)
        else:
            rest.append(item)
    return outlets, rest


def load_recipe(path: str, overrides: Sequence[str] = ()) -> Recipe:
    from pydantic import ValidationError
    from specforge.config.schema import Config, apply_overrides, migrate_legacy_config

    from specforge_outlets.data.targets import resolve_target

    path = resolve_recipe(path)  # a shipped recipe's name works from any directory
    raw = read_recipe_file(path)
    model = raw.get("model")
    if isinstance(model, dict) and isinstance(model.get("target_model_path"), str):
        model["target_model_path"] = resolve_target(model["target_model_path"])  # e.g. smollm2-135m
    if isinstance(model, dict) and isinstance(model.get("draft_model_config"), str):
        model["draft_model_config"] = beside_recipe(path, model["draft_model_config"])
    block = copy.deepcopy(raw.pop(OUTLETS_BLOCK, None) or {})
    if not isinstance(block, dict):
        raise OutletsError(f"recipe {path}: the '{OUTLETS_BLOCK}:' block must be a mapping")
    outlets_overrides, specforge_overrides = split_overrides(overrides)
    target_key = "model.target_model_path="
    specforge_overrides = [  # the alias works on the command line too
        f"{target_key}{resolve_target(item[len(target_key):])}" if item.startswith(target_key) else item
        for item in specforge_overrides
    ]
    settings = OutletsSettings.from_mapping({**block, **outlets_overrides})
    try:
        config = Config.model_validate(migrate_legacy_config(raw))
        config = apply_overrides(config, specforge_overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}" for error in exc.errors()
        )
        raise OutletsError(f"recipe {path}: {problems}") from None
    except ValueError as exc:  # SpecForge's override errors
        raise OutletsError(f"recipe {path}: {exc}") from None
    return Recipe(config=config, settings=settings)
