"""The ``outlets:`` recipe block in the training run's wandb config.

SpecForge makes its wandb run's config from its own ``Config`` (``assembly._configured_logger``:
the tracking options and the resolved run config). ``load_recipe`` takes the ``outlets:`` block out
before SpecForge validates the rest, so λ, γ, the fusion layers and the head settings never reached
the run. ``install_outlets_config`` wraps that function: once SpecForge's tracker has opened the run
(rank 0), the run's config gains ``outlets`` (the block with every default filled in) and
``outlets_draft`` (what the draft was built with: fusion layers, head widths, as ``outlets train``
wrote them to ``draft_config.json``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Dict

from specforge_outlets.model.draft_config import DRAFT_CONFIG_FILE
from specforge_outlets.training.settings import OutletsSettings


def outlets_config(settings: OutletsSettings, output_dir: str) -> Dict[str, Any]:
    """The wandb config entries of an OUTLETS run."""
    entries: Dict[str, Any] = {"outlets": dataclasses.asdict(settings)}
    path = os.path.join(output_dir, DRAFT_CONFIG_FILE)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as handle:
            entries["outlets_draft"] = json.load(handle).get("outlets_config")
    return entries


def install_outlets_config(settings: OutletsSettings, output_dir: str) -> None:
    """Add :func:`outlets_config` to the wandb run SpecForge's tracker opens (``tracking.report_to: wandb``)."""
    from specforge.training import assembly

    build = assembly._configured_logger

    def configured_logger(cfg):
        logger = build(cfg)
        if cfg.tracking.report_to == "wandb":
            import wandb

            if wandb.run is not None:  # rank 0: the only rank whose tracker opens a run
                wandb.run.config.update(outlets_config(settings, output_dir), allow_val_change=True)
        return logger

    assembly._configured_logger = configured_logger
