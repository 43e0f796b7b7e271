"""The committed OUTLETS draft (SmolLM2-135M, trained to its budget; bf16, no embedding table) loads where
`outlets eval` and the plugin load it: the served forward and SpecForge's draft class."""

import json
import os

import pytest
import torch
from safetensors import safe_open

from specforge_outlets.model.plain_draft import OutletsLengthPredictor

DRAFT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "data", "sharegpt-smollm2", "convergence",
                     "draft-outlets")
pytestmark = pytest.mark.skipif(not os.path.isdir(DRAFT), reason="no committed draft")


def test_the_committed_draft_is_bf16_without_the_embedding_table():
    with safe_open(os.path.join(DRAFT, "model.safetensors"), "pt") as weights:
        names = list(weights.keys())
        assert not [name for name in names if "embed" in name]
        assert {weights.get_tensor(name).dtype for name in names if "quantile_head" in name or "midlayer" in name} == {
            torch.bfloat16}
    assert any(name.startswith("quantile_head.") for name in names)
    assert os.path.getsize(os.path.join(DRAFT, "model.safetensors")) < 25e6


def test_the_served_forward_gives_point_and_non_crossing_quantile_predictions():
    config = json.load(open(os.path.join(DRAFT, "config.json")))
    embedding = torch.nn.Embedding(config["vocab_size"], config["hidden_size"])  # the target's shape (random weights)
    predictor = OutletsLengthPredictor(DRAFT, embedding)
    g = torch.Generator().manual_seed(0)
    features = torch.randn(40, 3 * config["hidden_size"], generator=g)  # [T, 3H]: three target depths
    ids = torch.randint(0, config["vocab_size"], (40,), generator=g)
    states = predictor.states(features, ids)  # [T, H]
    z = predictor.log_remaining(states)
    quantiles = predictor.log_remaining_quantiles(states)
    assert z.shape == (40,) and quantiles.shape == (40, len(config["outlets_config"]["quantile_levels"]))
    assert torch.isfinite(z).all() and bool((quantiles[:, 1:] >= quantiles[:, :-1]).all())


def test_specforge_s_draft_class_loads_it():
    from specforge_outlets.model.draft import OutletsLlamaForCausalLMEagle3

    draft = OutletsLlamaForCausalLMEagle3.from_export(DRAFT)
    assert draft.quantile_head is not None and draft.outlets.gated_attention
