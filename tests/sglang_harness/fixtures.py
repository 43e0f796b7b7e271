"""Fixtures the in-process plugin tests share (import them by name into a test module)."""

import logging

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
