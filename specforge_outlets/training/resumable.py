"""Training that survives being killed: restarted on its output directory, a run resumes from its last checkpoint.

Long CPU runs are interrupted (a session ends, a machine is handed back). SpecForge writes each
checkpoint as ``<run_id>-step<N>/training_state.pt`` (the state file last, so a checkpoint without
it is incomplete) and resumes a run root from its newest complete one, the optimizer, scheduler,
data order and RNG included; these helpers find what is there and turn it into the override that
resumes, so a restart loses only the steps after the last checkpoint.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from typing import Callable, Dict, Iterable, List, Mapping

STATE_FILE = "training_state.pt"  # SpecForge's checkpoint payload, written last


def complete_checkpoints(output_dir: str, run_id: str) -> Dict[int, str]:
    """Step -> checkpoint directory, for the complete checkpoints of ``run_id`` under ``output_dir``."""
    if not os.path.isdir(output_dir):
        return {}
    pattern = re.compile(rf"^{re.escape(run_id)}-step(\d+)$")
    found = {}
    for name in os.listdir(output_dir):
        match = pattern.match(name)
        path = os.path.join(output_dir, name)
        if match and not os.path.islink(path) and os.path.isfile(os.path.join(path, STATE_FILE)):
            found[int(match.group(1))] = path
    return dict(sorted(found.items()))


def resume_overrides(output_dir: str, run_id: str) -> List[str]:
    """``training.resume_from=<output_dir>`` when a complete checkpoint exists, else nothing (a fresh start)."""
    return [f"training.resume_from={os.path.abspath(output_dir)}"] if complete_checkpoints(output_dir, run_id) else []


def prune_checkpoints(output_dir: str, run_id: str, keep: Iterable[int]) -> List[int]:
    """Remove complete checkpoints whose step is not in ``keep``, except the newest (the one a restart resumes)."""
    found = complete_checkpoints(output_dir, run_id)
    newest = max(found) if found else None
    kept = set(keep)
    removed = [step for step in found if step not in kept and step != newest]
    for step in removed:
        shutil.rmtree(found[step])
    return removed


def supervise(argv: List[str], env: Mapping[str, str], poll_s: float, should_stop: Callable[[], bool]) -> int:
    """Run the trainer ``argv``, calling ``should_stop`` every ``poll_s`` seconds; its exit code, or 0 once stopped.

    Whatever ends the supervisor (``should_stop``, an exception, SIGTERM, Ctrl-C) ends the trainer with it
    and waits for it: Python's default SIGTERM skips ``finally``, and an orphaned trainer would go on
    writing checkpoints beside the one a restart starts. ``outlets demo`` runs its stages' commands
    through it for the same reason (a stage's own servers stop with the stage).
    """
    previous = signal.signal(signal.SIGTERM, _raise_exit)
    process = subprocess.Popen(argv, env=dict(env))
    try:
        while process.poll() is None:
            time.sleep(poll_s)
            if process.poll() is None and should_stop():
                return 0
        return process.returncode
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait()
        signal.signal(signal.SIGTERM, previous)


def _raise_exit(signum, _frame) -> None:
    raise SystemExit(128 + signum)
