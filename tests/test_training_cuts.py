"""The cheap training step equals SpecForge's own EAGLE-3 step: loss, metrics and gradients.

Each cut (training/loss_rows.py: teacher and draft LM head at loss rows; model/ttt_attention.py:
the TTT cache branch merged by logsumexp; LP-only skipping the drafting loss) is compared with
SpecForge's unmodified classes on a padded batch of two responses, one of them censored. A
SpecForge upgrade that changes the step's math makes these fail.
"""

import copy

import pytest
import torch
from specforge.algorithms.eagle3 import model as eagle3_model
from specforge.algorithms.eagle3.model import OnlineEagle3Model
from specforge.modeling.draft.llama3_eagle import LlamaAttention
from specforge.modeling.target.target_head import TargetHead
from specforge.runtime.contracts import TrainBatch
from specforge.training.strategies.base import Eagle3TrainStrategy

from specforge_outlets.data.labels import NO_LABEL
from specforge_outlets.model.ttt_attention import TTTCacheAttention
from specforge_outlets.training.cpu_loss import install_cpu_loss
from specforge_outlets.training.loss_rows import install_loss_row_teacher
from specforge_outlets.training.ttt_with_length import OutletsEagle3Model
from specforge_outlets.training.settings import OutletsSettings
from specforge_outlets.training.strategy import OutletsTrainStrategy
from tests.test_training_step import TTT, make_draft
from tests.tiny_target import TINY_HIDDEN

SPECFORGE_TEACHER = eagle3_model.compute_target_p_padded_from_hidden
SEQ_LEN = 14


def padded_batch() -> TrainBatch:
    """Two conversations: a finished one of 14 tokens, a censored one of 10 padded to 14."""
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(20, 64, (2, SEQ_LEN), generator=generator)
    attention = torch.ones(2, SEQ_LEN, dtype=torch.long)
    attention[1, 10:] = 0
    loss_mask = torch.zeros(2, SEQ_LEN, dtype=torch.long)
    loss_mask[0, 5:] = 1  # prompt of 5 tokens, then the response
    loss_mask[1, 4:10] = 1
    remaining = torch.full((2, SEQ_LEN), NO_LABEL)
    remaining[0, 5:] = torch.arange(SEQ_LEN - 5, 0, -1)
    lower_bound = torch.full((2, SEQ_LEN), NO_LABEL)
    lower_bound[1, 4:10] = torch.arange(6, 0, -1)  # cut by the token limit: at least this many to come
    return TrainBatch(
        sample_ids=["finished", "censored"], strategy="eagle3-outlets",
        tensors={"input_ids": ids * attention, "attention_mask": attention, "loss_mask": loss_mask,
                 "hidden_state": torch.randn(2, SEQ_LEN, 3 * TINY_HIDDEN, generator=generator),
                 "target": torch.randn(2, SEQ_LEN, TINY_HIDDEN, generator=generator),
                 "remaining_length": remaining, "remaining_lower_bound": lower_bound},
        metadata={"target_repr": "hidden_state"},
    )


def specforge_draft(draft):
    """The same weights with SpecForge's own attention and LM head (no cut)."""
    reference = copy.deepcopy(draft)
    reference.midlayer.self_attn.__class__ = LlamaAttention
    return reference


def grads(module) -> dict:
    return {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}


def assert_grads_equal(ours: dict, reference: dict) -> None:
    """Equal where the reference has a gradient; zero where only ours has one (a head the loss weighs 0)."""
    assert reference.keys() <= ours.keys()
    assert all(ours[name].abs().max() == 0 for name in ours.keys() - reference.keys())
    for name in reference:
        scale = reference[name].abs().max().clamp_min(1e-6)
        assert (ours[name] - reference[name]).abs().max() / scale < 1e-4, name


@pytest.fixture()
def specforge_teacher(monkeypatch):
    """Run the reference with SpecForge's compact teacher, ours with the loss-row teacher."""
    install_cpu_loss()
    install_loss_row_teacher()
    yield lambda: monkeypatch.setattr(eagle3_model, "compute_target_p_padded_from_hidden", SPECFORGE_TEACHER)


def run_ours(draft, head, **settings):
    options = {**OutletsSettings(**settings).objective_options(), "length_censored": "one_sided"}
    model = OutletsEagle3Model(draft_model=draft, length=TTT, attention_backend="sdpa")
    out = OutletsTrainStrategy(model, target_head=head, compact_teacher=True, **options).forward_loss(padded_batch())
    out.loss.backward()
    return out


def test_drafting_step_equals_specforge(tiny_target, specforge_teacher):
    draft = make_draft(tiny_target)
    assert isinstance(draft.midlayer.self_attn, TTTCacheAttention)
    reference_draft = specforge_draft(draft)
    head = TargetHead.from_pretrained(tiny_target).float()
    ours = run_ours(draft, head, length_loss_weight=0.0, length_l2_weight=0.0)
    specforge_teacher()
    model = OnlineEagle3Model(draft_model=reference_draft, length=TTT, attention_backend="sdpa")
    reference = Eagle3TrainStrategy(model, target_head=head, compact_teacher=True).forward_loss(padded_batch())
    reference.loss.backward()

    assert torch.allclose(ours.loss, reference.loss, rtol=1e-5, atol=1e-7)
    for key in ("plosses", "acces", "acceptance_rates", "acc_corrects", "acc_denoms", "metric_losses",
                "metric_loss_denoms"):
        assert torch.allclose(torch.stack(ours.metrics[key]), torch.stack(reference.metrics[key]),
                              rtol=1e-5, atol=1e-7), key
    assert_grads_equal(grads(draft), grads(reference_draft))


class AlwaysDrafting(OutletsEagle3Model):
    """The step before the LP-only cut: the drafting loss is computed, then weighed 0."""

    def forward(self, *, drafting: bool, **inputs):
        return super().forward(drafting=True, **inputs)


def test_lp_only_skips_drafting_with_the_same_loss_and_gradients(tiny_target, specforge_teacher):
    draft = make_draft(tiny_target)
    reference_draft = specforge_draft(draft)
    head = TargetHead.from_pretrained(tiny_target).float()
    ours = run_ours(draft, head, sd_loss_weight=0.0)
    specforge_teacher()
    options = {**OutletsSettings(sd_loss_weight=0.0).objective_options(), "length_censored": "one_sided"}
    model = AlwaysDrafting(draft_model=reference_draft, length=TTT, attention_backend="sdpa")
    reference = OutletsTrainStrategy(model, target_head=head, compact_teacher=True, **options)
    reference = reference.forward_loss(padded_batch())
    reference.loss.backward()

    assert reference.metrics["sd_loss"] > 0 and ours.metrics["sd_loss"] == 0  # drafting did not run
    assert torch.allclose(ours.loss, reference.loss, rtol=1e-5)
    assert torch.allclose(ours.metrics["length_loss"], reference.metrics["length_loss"], rtol=1e-5)
    reference_grads = {name: g for name, g in grads(reference_draft).items() if g.abs().sum() > 0}
    assert_grads_equal({name: g for name, g in grads(draft).items() if g.abs().sum() > 0}, reference_grads)
    assert draft.lm_head.weight.grad is None or draft.lm_head.weight.grad.abs().sum() == 0


def test_loss_row_teacher_equals_specforge_compact_teacher(tiny_target):
    head = TargetHead.from_pretrained(tiny_target).float()
    batch = padded_batch()
    hidden = batch.tensors["target"]
    loss_mask = batch.tensors["loss_mask"][..., None]
    t2d = torch.zeros(head.fc.weight.shape[0], dtype=torch.bool)
    t2d[::2] = True
    from specforge_outlets.training.loss_rows import teacher_at_loss_rows

    ours = teacher_at_loss_rows(hidden, head.fc.weight, t2d, loss_mask, TTT)
    reference = SPECFORGE_TEACHER(hidden, head.fc.weight, t2d, loss_mask, TTT)
    rows = torch.nn.functional.pad(loss_mask[..., 0], (0, TTT)).bool()
    for mine, theirs in zip(ours[:3], reference[:3]):
        assert mine.shape == theirs.shape
        assert torch.allclose(mine[rows].float(), theirs[rows].float(), atol=1e-6)  # every row a loss reads
    assert torch.equal(ours[3], reference[3])  # position mask


def test_cache_attention_equals_specforge_with_padding_and_its_gate():
    """Three TTT steps through the merged branch: outputs and every gradient equal SpecForge's."""
    from transformers import LlamaConfig

    from specforge_outlets.model.gated_attention import add_output_gate

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    reference = LlamaAttention(config)
    add_output_gate(reference, input_size=64)
    ours = copy.deepcopy(reference)
    ours.__class__ = TTTCacheAttention
    attention = torch.ones(2, 9)
    attention[1, 6:] = 0
    from specforge.modeling._mask_utils import _expand_mask, _make_causal_mask

    for mask_2d in (torch.ones(2, 9), attention):
        mask = _make_causal_mask((2, 9), torch.float32, device="cpu") + _expand_mask(mask_2d, torch.float32, tgt_len=9)
        outputs = []
        for module in (reference, ours):
            module.zero_grad()
            x = torch.randn(2, 9, 64, generator=torch.Generator().manual_seed(1), requires_grad=True)
            cache, state, loss = [[], []], x, 0.0
            for step in range(TTT):
                out = module(state, cache_hidden=cache, attention_mask=mask, position_ids=torch.arange(9)[None])
                loss = loss + (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum() * (step + 1)
                state = torch.cat([out, out.flip(-1)], dim=-1)
            loss.backward()
            outputs.append((loss.detach(), x.grad, grads(module)))
        assert torch.allclose(outputs[0][0], outputs[1][0], rtol=1e-5)
        assert torch.allclose(outputs[0][1], outputs[1][1], atol=1e-5)
        assert_grads_equal(outputs[1][2], outputs[0][2])
