"""Reading what an offline wandb run wrote (``WANDB_MODE=offline``), for the ``--report-to wandb`` tests."""

from __future__ import annotations

import glob
import json
import os
from typing import Dict, List


def offline_run(output_dir: str) -> str:
    """The one offline run directory under ``output_dir/wandb``."""
    runs = glob.glob(os.path.join(output_dir, "wandb", "offline-run-*"))
    assert len(runs) == 1, runs
    return runs[0]


def logged_tables(run: str) -> Dict[str, dict]:
    """name -> the table JSON (``columns``, ``data``) the run logged."""
    return {os.path.basename(path).split("_")[0]: json.load(open(path))
            for path in glob.glob(os.path.join(run, "files", "media", "table", "*.table.json"))}


def logged_images(run: str) -> List[str]:
    """Names of the images the run logged (wandb adds a step and a hash to each)."""
    return sorted(os.path.basename(path).rsplit("_", 2)[0]
                  for path in glob.glob(os.path.join(run, "files", "media", "images", "*.png")))


def run_records(run: str) -> bytes:
    """The run's protobuf records: config keys and values are stored as plain strings."""
    (records,) = glob.glob(os.path.join(run, "run-*.wandb"))
    with open(records, "rb") as handle:
        return handle.read()
