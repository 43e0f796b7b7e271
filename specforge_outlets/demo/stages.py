"""Content-addressed pipeline stages, so an interrupted or repeated demo reuses finished work.

A stage's directory is named by a hash of its name, its parameters and the keys of the stages it
reads, and is marked finished by a ``.done`` file written last. Changing a setting re-runs that
stage and everything downstream; an interrupted stage is re-run in place (the commands it calls
write atomically or resume).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Sequence

from specforge_outlets.training.resumable import supervise

DONE = ".done"
# Seconds between checks of a running stage command (the demo waits; a signal interrupts the wait at once).
CHILD_POLL_S = 0.5


@dataclass(frozen=True)
class Stage:
    name: str
    params: Dict[str, object]
    run: Callable[[str, Dict[str, str]], None]  # (own directory, upstream directories by name)
    needs: Sequence[str] = field(default_factory=tuple)


def stage_key(stage: Stage, upstream_keys: Sequence[str]) -> str:
    payload = json.dumps([stage.name, stage.params, list(upstream_keys)], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def run_stages(root: str, stages: List[Stage]) -> Dict[str, str]:
    """Run (or reuse) every stage in order; returns each stage's directory."""
    keys: Dict[str, str] = {}
    dirs: Dict[str, str] = {}
    for number, stage in enumerate(stages, 1):
        keys[stage.name] = stage_key(stage, [keys[name] for name in stage.needs])
        directory = os.path.join(root, "stages", f"{stage.name}-{keys[stage.name]}")
        dirs[stage.name] = directory
        header = f"[{number}/{len(stages)}] {stage.name}"
        if os.path.exists(os.path.join(directory, DONE)):
            print(f"{header}: cached ({directory})", flush=True)
            continue
        print(f"{header} -> {directory}", flush=True)
        os.makedirs(directory, exist_ok=True)
        started = time.time()
        stage.run(directory, {name: dirs[name] for name in stage.needs})
        with open(os.path.join(directory, DONE), "w") as f:
            json.dump({"seconds": round(time.time() - started, 1), "params": stage.params}, f, default=str)
        print(f"{header}: done in {time.time() - started:.0f} s", flush=True)
    return dirs


def written(path: str) -> bool:
    """A benchmark stage whose output file exists is skipped: True (and says so) if ``path`` exists.

    The benchmarks' stages write one file each, atomically, so its presence means the stage finished;
    delete the file to run the stage again.
    """
    if os.path.exists(path):
        print(f"skip (exists): {path}", flush=True)
        return True
    return False


def outlets(*args: str) -> None:
    """Run one ``outlets`` sub-command in its own process (training initialises torch.distributed).

    Supervised: SIGTERM or Ctrl-C to the demo ends the command (which stops the servers it started)
    and waits for it before the demo exits, so nothing is left running.
    """
    argv = [sys.executable, "-m", "specforge_outlets.cli", *map(str, args)]
    returncode = supervise(argv, os.environ, CHILD_POLL_S, lambda: False)
    if returncode != 0:
        raise subprocess.CalledProcessError(returncode, argv)


def stage_seconds(directory: str) -> float:
    with open(os.path.join(directory, DONE)) as f:
        return float(json.load(f)["seconds"])
