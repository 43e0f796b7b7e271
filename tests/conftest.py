"""Shared fixtures: a tiny randomly initialised Llama target and OUTLETS features captured from it;
for the SGLang tests, a tiny chat target and an `outlets export` for it.

Nothing here touches the network: the target is built from a config and saved locally.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.tiny_target import TINY_FUSION_LAYERS, make_features, make_tiny_target

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory) -> str:
    return make_tiny_target(str(tmp_path_factory.mktemp("tiny-target")))


@pytest.fixture(scope="session")
def tiny_features(tiny_target, tmp_path_factory) -> str:
    """A directory of feature files whose response lengths depend on the prompt's first token."""
    return make_features(tiny_target, str(tmp_path_factory.mktemp("features")), count=24, seed=0)


@pytest.fixture(scope="session")
def chat_target(tmp_path_factory) -> str:
    """A tiny random Llama with the chat tokenizer (the SGLang server tests' target)."""
    from specforge_outlets.model.tiny_chat_target import make_chat_target

    return make_chat_target(str(tmp_path_factory.mktemp("chat-target")))


@pytest.fixture(scope="session")
def outlets_export(chat_target, tmp_path_factory) -> str:
    """A seeded random `outlets export` for ``chat_target``, made in the training environment."""
    from tests.sglang_harness.offline_reference import in_training_env

    return in_training_env("export", chat_target, str(tmp_path_factory.mktemp("export") / "draft"))


@pytest.fixture()
def fusion_layers():
    return list(TINY_FUSION_LAYERS)


def pytest_configure(config):
    torch.set_num_threads(2)
