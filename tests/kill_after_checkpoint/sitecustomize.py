"""Test-only: SIGKILL a training process right after its first checkpoint is complete.

Put this folder on PYTHONPATH of the run to kill. Polling the run directory from the test raced
the tiny run (it could finish all its steps between two polls); dying inside SpecForge's own
``CheckpointManager.save``, after it returns, is a kill at a known point on any machine.
"""

import importlib.abc
import importlib.util
import os
import signal
import sys

TARGET = "specforge.training.checkpoint"


def _kill_after_first_save(module) -> None:
    manager = module.CheckpointManager
    save = manager.save

    def save_then_die(self, *args, **kwargs):
        path = save(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)
        return path

    manager.save = save_then_die


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Wraps the module's loader so the patch lands as soon as SpecForge imports it."""

    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _kill_after_first_save(module)

        spec.loader.exec_module = exec_and_patch
        return spec

sys.meta_path.insert(0, _PatchOnImport())
