"""Fixtures the in-process plugin tests share (import them by name into a test module)."""

import logging
import os

import pytest

from sglang_patches import state


@pytest.fixture(scope="module")
def plugins_loaded():
    """SGLang's plugin loading, as a server does: the hooks applied."""
    from sglang.srt.plugins import load_plugins

    load_plugins()
    return state.applied_targets()


@pytest.fixture(autouse=True)
def keep_logging():
    """``prepare_server_args`` reconfigures the root logger (basicConfig(force=True)); undo it."""
    handlers, level = list(logging.root.handlers), logging.root.level
    yield
    logging.root.handlers[:] = handlers
    logging.root.setLevel(level)


@pytest.fixture(autouse=True)
def no_outlets_settings(monkeypatch):
    """No OUTLETS_* setting from the caller or from a parse in another test (the CLI writes os.environ itself)."""
    for name in [name for name in os.environ if name.startswith("OUTLETS_")]:
        monkeypatch.delenv(name)
    state.reset_settings()
    yield
    for name in [name for name in os.environ if name.startswith("OUTLETS_")]:
        os.environ.pop(name)
    state.reset_settings()
