"""The quantile head (issue 27): non-crossing quantiles, the censored pinball loss, joint and detached training."""

import math

import pytest
import torch
from specforge.modeling.target.target_head import TargetHead

from specforge_outlets.errors import OutletsError
from specforge_outlets.model.quantile_head import QuantileHead, constant_quantiles, pinball_rows
from specforge_outlets.training.cpu_loss import install_cpu_loss
from specforge_outlets.training.ttt_with_length import OutletsEagle3Model
from specforge_outlets.training.settings import OutletsSettings
from specforge_outlets.training.strategy import OutletsTrainStrategy
from tests.test_training_step import TTT, make_batch, make_draft

LEVELS = (0.1, 0.5, 0.9)


def test_quantiles_never_cross_whatever_the_raw_outputs():
    raw = torch.randn(500, 3) * 10
    z = QuantileHead.log_remaining_quantiles(raw)
    assert bool((z[:, 1:] >= z[:, :-1]).all())


def test_output_bias_starts_at_the_given_constant_quantiles():
    head = QuantileHead([8, 4], LEVELS)
    with torch.no_grad():
        head.mlp[-1].weight.zero_()
    target = torch.tensor([2.0, 4.5, 6.0])
    head.init_output_bias(target)
    z = QuantileHead.log_remaining_quantiles(head(torch.randn(2, 8)))
    assert torch.allclose(z, target.expand(2, 3), atol=1e-5)


def test_pinball_minimiser_is_the_empirical_quantile():
    torch.manual_seed(0)
    z_true = torch.randn(4000)
    grid = torch.linspace(-3, 3, 601)
    for tau in LEVELS:
        losses = [pinball_rows(torch.full((4000, 1), float(g)), z_true, (tau,), torch.zeros(4000, dtype=torch.bool)).mean()
                  for g in grid]
        best = float(grid[int(torch.stack(losses).argmin())])
        assert abs(best - float(torch.quantile(z_true, tau))) < 0.02


def test_censored_rows_are_penalised_only_below_their_bound():
    levels = (0.5,)
    censored = torch.tensor([True, True])
    bound = torch.tensor([5.0, 5.0])
    loss = pinball_rows(torch.tensor([[4.0], [7.0]]), bound, levels, censored)
    assert loss.tolist() == [0.5, 0.0]  # tau * (c - q) below the bound, nothing above
    exact = pinball_rows(torch.tensor([[7.0]]), torch.tensor([5.0]), levels, torch.tensor([False]))
    assert exact.item() == pytest.approx(1.0)  # (1 - tau) * (q - y) for an exact label


def test_censored_pinball_recovers_a_quantile_below_the_cap():
    """Powell: with every response cut at one cap, the one-sided loss still finds quantiles under the cap."""
    torch.manual_seed(1)
    z = torch.randn(20000) * 0.8 + 5.0
    cap = 5.6  # about the 77th percentile: q0.5 lies below it
    censored = z > cap
    observed = torch.where(censored, torch.full_like(z, cap), z)
    grid = torch.linspace(3.5, 6.5, 301)
    losses = torch.stack([pinball_rows(torch.full((len(z), 1), float(g)), observed, (0.5,), censored).mean() for g in grid])
    assert abs(float(grid[int(losses.argmin())]) - 5.0) < 0.03


def test_constant_quantiles_are_weighted():
    z = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert constant_quantiles(z, torch.ones(4), (0.5,)).tolist() == [2.0]
    assert constant_quantiles(z, torch.tensor([1.0, 1.0, 1.0, 10.0]), (0.5,)).tolist() == [4.0]


def test_settings_refuse_bad_levels_and_modes():
    with pytest.raises(OutletsError, match="quantile_levels"):
        OutletsSettings.from_mapping({"quantile_levels": [0.9, 0.1]})
    with pytest.raises(OutletsError, match="quantile_levels"):
        OutletsSettings.from_mapping({"quantile_levels": [0.1, 1.0]})
    with pytest.raises(OutletsError, match="quantile_mode"):
        OutletsSettings.from_mapping({"quantile_levels": [0.1, 0.9], "quantile_mode": "frozen"})
    settings = OutletsSettings.from_mapping({"quantile_levels": [0.1, 0.5, 0.9], "quantile_mode": "detached"})
    assert settings.quantile_levels == LEVELS


def make_quantile_step(target_dir, mode: str, sd_loss_weight: float = 1.0, length_loss_weight: float = 1.0):
    install_cpu_loss()
    settings = dict(quantile_levels=LEVELS, quantile_mode=mode)
    draft = make_draft(target_dir, **settings)
    model = OutletsEagle3Model(draft_model=draft, length=TTT, attention_backend="sdpa")
    head = TargetHead.from_pretrained(target_dir).float()
    options = {**OutletsSettings(**settings).objective_options(), "length_loss_weight": length_loss_weight,
               "length_l2_weight": 0.0, "sd_loss_weight": sd_loss_weight, "quantile_loss_weight": 1.0}
    return draft, OutletsTrainStrategy(model, target_head=head, **options)


@pytest.mark.parametrize("mode", ["joint", "detached"])
def test_quantile_loss_reaches_the_draft_only_when_joint(tiny_target, mode):
    """With only the quantile loss on, the draft's decoder gets a gradient in joint mode and none detached."""
    draft, strategy = make_quantile_step(tiny_target, mode, sd_loss_weight=0.0, length_loss_weight=0.0)
    out = strategy.forward_loss(make_batch())
    out.loss.backward()
    assert out.loss.item() == pytest.approx(out.metrics["quantile_loss"].item())
    assert draft.quantile_head.mlp[0].weight.grad.abs().sum() > 0
    layer_grad = draft.midlayer.mlp.down_proj.weight.grad
    reaches_layer = layer_grad is not None and bool(layer_grad.abs().sum() > 0)
    assert reaches_layer is (mode == "joint")
    assert {f"quantile_coverage_q{round(100 * level)}" for level in LEVELS} <= set(out.ratio_metrics)


def test_detached_mode_leaves_the_drafting_gradient_as_without_the_head(tiny_target):
    with_head, strategy = make_quantile_step(tiny_target, "detached", length_loss_weight=0.0)
    strategy.forward_loss(make_batch()).loss.backward()
    plain = make_draft(tiny_target)
    plain.load_state_dict({k: v for k, v in with_head.state_dict().items() if not k.startswith("quantile_head.")})
    model = OutletsEagle3Model(draft_model=plain, length=TTT, attention_backend="sdpa")
    head = TargetHead.from_pretrained(tiny_target).float()
    options = {**OutletsSettings().objective_options(), "length_loss_weight": 0.0, "length_l2_weight": 0.0}
    OutletsTrainStrategy(model, target_head=head, **options).forward_loss(make_batch()).loss.backward()
    for name in ("midlayer.mlp.down_proj.weight", "fc.weight"):
        a = dict(with_head.named_parameters())[name].grad
        b = dict(plain.named_parameters())[name].grad
        assert torch.allclose(a, b, atol=1e-6), name


def test_joint_training_moves_the_quantiles_towards_the_labels(tiny_target):
    draft, strategy = make_quantile_step(tiny_target, "joint", sd_loss_weight=0.0, length_loss_weight=0.0)
    optimiser = torch.optim.Adam(draft.parameters(), lr=1e-2)
    batch = make_batch()
    losses = []
    for _ in range(40):
        out = strategy.forward_loss(batch)
        optimiser.zero_grad()
        out.loss.backward()
        optimiser.step()
        losses.append(out.loss.item())
    assert losses[-1] < 0.2 * losses[0]
    assert math.isfinite(losses[-1])


def test_a_trained_quantile_draft_exports_and_serves_the_same_quantiles(tiny_target, tiny_features, tmp_path):
    """`outlets train` with outlets.quantile_levels, `outlets export`, then the serving forward
    (plain_draft, predictor-only mode and `outlets eval`) gives the PyTorch draft's quantiles."""
    import glob
    import os

    from specforge_outlets.data.features import load_features
    from specforge_outlets.model.draft import OutletsLlamaForCausalLMEagle3
    from specforge_outlets.model.inference import draft_states
    from specforge_outlets.model.plain_draft import OutletsLengthPredictor
    from specforge_outlets.data.labels import shift_left
    from specforge_outlets.training.export_command import export_draft
    from tests.test_train_command import outlets
    from tests.tiny_target import write_recipe

    recipe = write_recipe(str(tmp_path / "recipe.yaml"), tiny_target, tiny_features, str(tmp_path))
    result = outlets("train", "--config", recipe, "outlets.quantile_levels=[0.1,0.5,0.9]",
                     "outlets.quantile_mode=detached")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    runs = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert b"quantile_coverage_q90" in open(runs[0], "rb").read()
    export = export_draft(str(tmp_path), str(tmp_path / "draft"))
    draft = OutletsLlamaForCausalLMEagle3.from_export(export, target_model_path=tiny_target)
    assert draft.outlets.quantile_levels == LEVELS and draft.outlets.quantile_mode == "detached"
    features = load_features(sorted(glob.glob(os.path.join(tiny_features, "*.ckpt")))[0])
    states = draft_states(draft, features["input_ids"][None], features["aux_hidden_state"])
    expected = draft.predict_log_remaining_quantiles(states)[0]  # [T, K]
    served = OutletsLengthPredictor(export, draft.embed_tokens)
    next_ids = shift_left(features["input_ids"][None], 1)[0].clamp_min(0)
    got = served.log_remaining_quantiles(served.states(features["aux_hidden_state"][0], next_ids))
    assert got.shape == expected.shape == (features["input_ids"].shape[0], 3)
    assert torch.allclose(got, expected, atol=1e-4)
    assert bool((got[:, 1:] >= got[:, :-1]).all())
