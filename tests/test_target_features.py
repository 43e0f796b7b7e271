"""The last-layer ablation: the draft reads the target's last layer alone, in training, evaluation and serving checks."""

import glob

import pytest
import torch
from specforge.modeling.target.target_head import TargetHead

from specforge_outlets.data.features import read_feature_file, save_features
from specforge_outlets.evaluation.drafting import drafting_metrics
from specforge_outlets.model.draft_config import TargetFeatures
from specforge_outlets.model.draft_modes import EAGLE3, PREDICTOR_ONLY, serving_modes
from specforge_outlets.model.inference import labelled_predictions
from specforge_outlets.model.target_features import draft_input
from specforge_outlets.training.cpu_loss import install_cpu_loss
from specforge_outlets.training.settings import OutletsSettings
from specforge_outlets.training.strategy import OutletsTrainStrategy
from specforge_outlets.training.ttt_with_length import OutletsEagle3Model
from tests.test_training_step import TTT, make_batch, make_draft
from tests.tiny_target import TINY_HIDDEN

LAST = {"target_features": "last_layer"}


def test_the_fused_input_is_passed_through_and_the_last_layer_fills_the_top_third():
    aux, last = torch.randn(2, 5, 3 * TINY_HIDDEN), torch.randn(2, 5, TINY_HIDDEN)
    assert draft_input(aux, last, TargetFeatures.FUSED) is aux
    ablated = draft_input(aux, last, TargetFeatures.LAST_LAYER)
    assert ablated.shape == aux.shape
    assert (ablated[..., : 2 * TINY_HIDDEN] == 0).all() and torch.equal(ablated[..., 2 * TINY_HIDDEN:], last)
    with pytest.raises(AssertionError, match="3 x"):
        draft_input(aux[..., :-1], last, TargetFeatures.LAST_LAYER)


def step_gradient(tiny_target, batch, **settings):
    """(loss, fc weight gradient, the fc's inputs) of one training step."""
    install_cpu_loss()
    draft = make_draft(tiny_target, **settings)
    model = OutletsEagle3Model(draft_model=draft, length=TTT, attention_backend="sdpa")
    head = TargetHead.from_pretrained(tiny_target).float()
    options = {**OutletsSettings(**settings).objective_options(), "length_loss_weight": 1.0}
    inputs = []
    handle = draft.fc.register_forward_hook(lambda _module, args, _output: inputs.append(args[0].detach()))
    out = OutletsTrainStrategy(model, target_head=head, **options).forward_loss(batch)
    handle.remove()
    out.loss.backward()
    return out.loss.detach(), draft.fc.weight.grad, inputs


def test_a_last_layer_draft_trains_on_the_last_layer_alone(tiny_target):
    """The fc reads zeros and the batch's last layer at the same positions; the loss does not move with the fused
    depths; the fc columns of the two lower thirds get no gradient. The fused draft reads all three thirds."""
    batch = make_batch()
    loss, grad, inputs = step_gradient(tiny_target, batch, **LAST)
    expected = torch.cat([torch.zeros(1, batch.tensors["target"].shape[1], 2 * TINY_HIDDEN), batch.tensors["target"]], -1)
    assert inputs and all(torch.equal(seen.float(), expected) for seen in inputs)
    assert grad[:, : 2 * TINY_HIDDEN].abs().sum() == 0 and grad[:, 2 * TINY_HIDDEN:].abs().sum() > 0
    other_aux = make_batch()
    other_aux.tensors["hidden_state"] = torch.randn_like(other_aux.tensors["hidden_state"])
    assert torch.equal(step_gradient(tiny_target, other_aux, **LAST)[0], loss)
    _, fused_grad, fused_inputs = step_gradient(tiny_target, make_batch())
    assert torch.equal(fused_inputs[0].float(), batch.tensors["hidden_state"])
    assert (fused_grad[:, : 2 * TINY_HIDDEN].abs().sum(dim=0) > 0).all()


def test_evaluation_reads_a_last_layer_draft_the_way_it_trained(tiny_target, tiny_features, tmp_path):
    """Length predictions and drafting metrics of a last-layer draft ignore the fused depths of a capture file
    (the fused draft's do not)."""
    files = sorted(glob.glob(f"{tiny_features}/*.ckpt*"))[:2]
    scrambled = []
    for number, path in enumerate(files):
        features = read_feature_file(path)
        features["aux_hidden_state"] = torch.randn_like(features["aux_hidden_state"])
        scrambled.append(str(tmp_path / f"data_{number}.ckpt"))
        save_features(scrambled[-1], features)
    head = TargetHead.from_pretrained(tiny_target).float()
    for settings, ignores in ((LAST, True), ({}, False)):
        draft = make_draft(tiny_target, **settings).eval()
        original, changed = read_feature_file(files[0]), read_feature_file(scrambled[0])
        same_lengths = torch.equal(labelled_predictions(draft, original)[0], labelled_predictions(draft, changed)[0])
        same_drafting = (drafting_metrics(draft, head, files, progress=False)
                         == drafting_metrics(draft, head, scrambled, progress=False))
        assert same_lengths is ignores and same_drafting is ignores, settings


def test_no_serving_mode_accepts_a_last_layer_draft():
    """SGLang's capture gives the draft the fused depths: both modes refuse the ablation, naming the setting."""
    config = {"hidden_size": TINY_HIDDEN,
              "outlets_config": OutletsSettings(**LAST).draft_config(TINY_HIDDEN, 6).to_dict()}
    modes = {mode.name: mode for mode in serving_modes("DIR", config)}
    for name in (EAGLE3, PREDICTOR_ONLY):
        assert "target_features='last_layer'" in modes[name].refusal
    fused = {"hidden_size": TINY_HIDDEN, "outlets_config": OutletsSettings().draft_config(TINY_HIDDEN, 6).to_dict()}
    assert all(mode.refusal is None for mode in serving_modes("DIR", fused) if mode.name == PREDICTOR_ONLY)
