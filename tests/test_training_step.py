"""The OUTLETS training step on the real SpecForge code path, without launching a run."""

import json
import os

import pytest
import torch
from specforge.modeling.target.target_head import TargetHead
from specforge.runtime.contracts import TrainBatch
from transformers import LlamaConfig

from specforge_outlets.errors import OutletsError
from specforge_outlets.model.draft import OutletsLlamaForCausalLMEagle3
from specforge_outlets.training.cpu_loss import install_cpu_loss, reference_log_softmax_loss
from specforge_outlets.training.ttt_with_length import OutletsEagle3Model
from specforge_outlets.training.settings import OutletsSettings
from specforge_outlets.training.strategy import OutletsTrainStrategy
from tests.tiny_target import TINY_DRAFT_VOCAB, TINY_HIDDEN, TINY_LAYERS

TTT = 3


def make_draft(target_dir, **settings) -> OutletsLlamaForCausalLMEagle3:
    with open(os.path.join(target_dir, "draft_config.json")) as f:
        config = LlamaConfig(**json.load(f))
    config.outlets_config = OutletsSettings(**settings).draft_config(TINY_HIDDEN, TINY_LAYERS).to_dict()
    torch.manual_seed(0)
    draft = OutletsLlamaForCausalLMEagle3(config, attention_backend="sdpa").float()
    draft.t2d.zero_()
    draft.t2d[:TINY_DRAFT_VOCAB] = True  # draft token i is target token i
    return draft


def make_step(target_dir, **settings):
    install_cpu_loss()
    draft = make_draft(target_dir, **settings)
    model = OutletsEagle3Model(draft_model=draft, length=TTT, attention_backend="sdpa")
    head = TargetHead.from_pretrained(target_dir).float()
    options = {**OutletsSettings(**settings).objective_options(), "length_loss_weight": 1.0, "length_l2_weight": 1e-3}
    strategy = OutletsTrainStrategy(model, target_head=head, **options)
    return draft, model, strategy


def make_batch(seq_len=12):
    torch.manual_seed(1)
    ids = torch.arange(seq_len)[None] + 20  # token id encodes its position
    return TrainBatch(
        sample_ids=["conversation"],
        strategy="eagle3-outlets",
        tensors={
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "loss_mask": torch.ones_like(ids),
            "hidden_state": torch.randn(1, seq_len, 3 * TINY_HIDDEN),
            "target": torch.randn(1, seq_len, TINY_HIDDEN),
            "remaining_length": 1000 + ids,  # the label names the token it belongs to
        },
        metadata={"target_repr": "hidden_state"},
    )


def test_labels_follow_specforge_shift_at_every_ttt_step(tiny_target):
    """At TTT step k the draft embeds token j + 1 + k at position j; its label must be that token's."""
    draft, model, strategy = make_step(tiny_target)
    seen_ids, labels = [], []
    draft.embed_tokens.register_forward_hook(lambda _m, inputs, _out: seen_ids.append(inputs[0].clone()))
    model.register_forward_hook(lambda _m, _i, output: labels.extend(output[-1].labels))
    strategy.forward_loss(make_batch())
    assert len(seen_ids) == len(labels) == TTT
    seq_len = seen_ids[0].shape[1]
    for step, (ids, step_labels) in enumerate(zip(seen_ids, labels)):
        real = seq_len - 1 - step  # positions whose embedded token exists (the rest is padding)
        assert ids[0, :real].tolist() == list(range(21 + step, 21 + step + real))
        assert step_labels[0, :real].tolist() == (1000 + ids[0, :real]).tolist()
        assert (step_labels[0, real:] == -1).all()


def test_step_reports_length_metrics_and_backpropagates_into_head_and_gate(tiny_target):
    draft, _, strategy = make_step(tiny_target)
    out = strategy.forward_loss(make_batch())
    out.loss.backward()
    assert {"sd_loss", "length_loss", "length_l2"} <= set(out.metrics)
    assert {"length_mse", "length_mae_tokens"} <= set(out.ratio_metrics)
    expected = out.metrics["sd_loss"] + out.metrics["length_loss"] + 1e-3 * out.metrics["length_l2"]
    assert torch.allclose(out.loss.detach(), expected)
    assert draft.length_head.mlp[0].weight.grad.abs().sum() > 0
    assert draft.midlayer.self_attn.gate_proj.weight.grad.abs().sum() > 0


def test_lp_only_ablation_drops_drafting_loss(tiny_target):
    install_cpu_loss()
    draft = make_draft(tiny_target)
    model = OutletsEagle3Model(draft_model=draft, length=TTT, attention_backend="sdpa")
    head = TargetHead.from_pretrained(tiny_target).float()
    options = {**OutletsSettings().objective_options(), "length_l2_weight": 0.0, "sd_loss_weight": 0.0}
    strategy = OutletsTrainStrategy(model, target_head=head, **options)
    out = strategy.forward_loss(make_batch())
    assert torch.allclose(out.loss.detach(), 0.1 * out.metrics["length_loss"])


@pytest.mark.parametrize("head_input", ["draft", "fused"])
def test_bucket_and_fused_ablations_read_the_state_they_name(tiny_target, head_input):
    """The length loss alone reaches the draft's decoder layer only when the head reads the draft state."""
    install_cpu_loss()
    settings = dict(head_type="buckets", head_input=head_input, gated_attention=False, bucket_edges=(4, 16, 64))
    draft = make_draft(tiny_target, **settings)
    model = OutletsEagle3Model(draft_model=draft, length=TTT, attention_backend="sdpa")
    head = TargetHead.from_pretrained(tiny_target).float()
    options = {**OutletsSettings(**settings).objective_options(), "length_l2_weight": 0.0, "sd_loss_weight": 0.0}
    out = OutletsTrainStrategy(model, target_head=head, **options).forward_loss(make_batch())
    out.loss.backward()
    assert draft.length_head.mlp[-1].out_features == 4  # one logit per bucket: (1, 4], (4, 16], (16, 64], > 64
    assert not hasattr(draft.midlayer.self_attn, "gate_proj")
    assert draft.fc.weight.grad.abs().sum() > 0  # both heads read through the fusion projection
    layer_grad = draft.midlayer.mlp.down_proj.weight.grad
    reaches_layer = layer_grad is not None and bool(layer_grad.abs().sum() > 0)
    assert reaches_layer is (head_input == "draft")


def test_cpu_loss_matches_the_kernel_definition_and_its_gradient():
    """Per position: -sum_v p(v) log softmax(logits)(v) if masked in, else 0; mean over B*T."""
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7, requires_grad=True)
    target = torch.softmax(torch.randn(2, 5, 7), -1)
    mask = torch.tensor([[1, 0, 1, 1, 0], [0, 1, 1, 0, 1]])[..., None]
    loss = reference_log_softmax_loss(logits, target, mask)
    rows = []
    for b in range(2):
        for t in range(5):
            lse = torch.logsumexp(logits[b, t].detach(), 0)
            rows.append(-(target[b, t] * (logits[b, t].detach() - lse)).sum() if mask[b, t] else torch.tensor(0.0))
    assert torch.allclose(loss, torch.stack(rows).mean())
    loss.backward()
    # the kernel's backward: -(p * g - softmax * sum(p * g)) * 1/(B*T) on masked-in rows, 0 elsewhere
    softmax = torch.softmax(logits.detach(), -1)
    expected = -(target - softmax * target.sum(-1, keepdim=True)) / 10 * mask
    assert torch.allclose(logits.grad, expected, atol=1e-6)


def test_gate_multiplies_attention_output_before_o_proj(tiny_target):
    draft = make_draft(tiny_target)
    attention = draft.midlayer.self_attn
    x = torch.randn(1, 4, 2 * TINY_HIDDEN)
    with torch.no_grad():
        attention.gate_proj.weight.zero_()
        attention.gate_proj.bias.fill_(-1e4)  # gate closed: o_proj sees zeros
        closed = attention(hidden_states=x, cache_hidden=None, attention_mask=None,
                           position_ids=torch.arange(4)[None])
        attention.gate_proj.bias.fill_(1e4)  # gate open: plain EAGLE-3 attention
        opened = attention(hidden_states=x, cache_hidden=None, attention_mask=None,
                           position_ids=torch.arange(4)[None])
    assert torch.allclose(closed, torch.zeros_like(closed))
    assert opened.abs().sum() > 0


def test_offline_reader_path_casts_states_and_pads_labels():
    """bfloat16 captures feed a float32 run; labels are cut to max_len and padded with NO_LABEL."""
    from specforge_outlets.training.algorithm import build_offline_collator, build_offline_normalizer

    normalize = build_offline_normalizer(6, dtype="float32")
    samples = []
    for length in (8, 4):
        raw = {
            "input_ids": torch.arange(length), "loss_mask": torch.ones(length, dtype=torch.long),
            "hidden_state": torch.randn(1, length, 4, dtype=torch.bfloat16),
            "aux_hidden_state": torch.randn(1, length, 12, dtype=torch.bfloat16),
            "remaining_length": torch.arange(length, 0, -1),
        }
        if length == 4:  # a censored capture: bounds instead of labels (the first file predates bounds)
            raw["remaining_lower_bound"], raw["remaining_length"] = raw["remaining_length"], torch.full((4,), -1)
        samples.append(normalize(raw))
    assert samples[0]["hidden_state"].dtype == samples[0]["target"].dtype == torch.float32
    batch = build_offline_collator()(samples)
    assert batch["remaining_length"].tolist() == [[8, 7, 6, 5, 4, 3], [-1] * 6]
    assert batch["remaining_lower_bound"].tolist() == [[-1] * 6, [4, 3, 2, 1, -1, -1]]


def test_per_response_weights_each_response_once_plus_its_static_position():
    """Two responses (L = 4 and L = 2) after the step-0 shift: the static position, labelled L, is
    the last prompt position, where ``outlets eval`` reads r_hat_0 (``Request.prompt_end``)."""
    from specforge_outlets.data.labels import remaining_length_labels, shift_left
    from specforge_outlets.training.objective import LengthWeighting

    loss_mask = torch.tensor([0, 0, 1, 1, 1, 1, 0, 1, 1])
    labels = shift_left(remaining_length_labels(loss_mask)[None], 1)
    assert labels.tolist() == [[-1, 4, 3, 2, 1, -1, 2, 1, -1]]
    prompt_ends = [1, 6]  # start - 1 of each response
    weights = LengthWeighting("per_response", static_weight=1.0, ttt_decay=0.5).position_weights(labels)
    assert torch.allclose(weights, torch.tensor([[0, 1.25, 0.25, 0.25, 0.25, 0, 1.5, 0.5, 0]]))
    assert weights[0, prompt_ends].tolist() == [1.25, 1.5]
    pooled = LengthWeighting("pooled", static_weight=0.5, ttt_decay=0.5).position_weights(labels, step=1)
    assert torch.allclose(pooled, 0.5 * torch.tensor([[0, 3.0, 1, 1, 1, 0, 2.0, 1, 0]]))  # static: +0.5 * L


def test_constant_fit_is_the_weighted_mean_target_and_starts_the_head_there():
    from specforge_outlets.model.length_head import LengthHead
    from specforge_outlets.training.objective import LengthWeighting, constant_fit

    labels = [torch.tensor([-1, 2, 1]), torch.tensor([-1, 1])]  # responses of 2 and 1 tokens
    pooled = constant_fit(labels, None, LengthWeighting("pooled", 0.0, 1.0))
    assert torch.allclose(pooled, torch.log1p(torch.tensor([2.0, 1, 1])).mean().reshape(1))
    per_response = constant_fit(labels, None, LengthWeighting("per_response", 0.0, 1.0))
    expected = (0.5 * torch.log1p(torch.tensor(2.0)) + 0.5 * torch.log1p(torch.tensor(1.0)) + torch.log1p(torch.tensor(1.0))) / 2
    assert torch.allclose(per_response, expected.reshape(1))
    head = LengthHead((8, 4))
    head.init_output_bias(per_response)
    assert torch.allclose(head.mlp[-1].bias, expected)
    buckets = constant_fit(labels, (2,), LengthWeighting("pooled", 0.0, 1.0))  # [0, 2): two positions, [2, 4): one
    assert torch.allclose(buckets.exp(), torch.tensor([2 / 3, 1 / 3]))


def test_length_head_gets_its_own_learning_rate_group(tiny_target):
    from specforge.optimizer import BF16Optimizer

    from specforge_outlets.training.head_lr import head_parameter_group

    _, model, _ = make_step(tiny_target)
    optimizer = BF16Optimizer(model, lr=1e-3, total_steps=10, warmup_ratio=0.0)
    head_parameter_group(optimizer, model, 10.0, total_steps=10, warmup_steps=0)
    rest, head = optimizer.optimizer.param_groups
    assert len(head["params"]) == len(list(model.draft_model.length_head.parameters()))
    assert len(rest["params"]) + len(head["params"]) == len(optimizer.fp32_params)
    unsplit = BF16Optimizer(model, lr=1e-3, total_steps=10, warmup_ratio=0.0).optimizer.param_groups[0]["lr"]
    assert (rest["lr"], head["lr"]) == pytest.approx((unsplit, 10 * unsplit))
    for _ in range(5):  # one schedule scales both groups
        optimizer.scheduler.step()
        assert head["lr"] / rest["lr"] == pytest.approx(10.0)


def test_resume_with_another_head_grouping_names_the_scale_to_resume_with(tiny_target, monkeypatch):
    from specforge.optimizer import BF16Optimizer

    from specforge_outlets.training.head_lr import check_resumed_groups, head_parameter_group

    _, model, _ = make_step(tiny_target)
    split = BF16Optimizer(model, lr=1e-3, total_steps=10, warmup_ratio=0.0)
    head_parameter_group(split, model, 10.0, total_steps=10, warmup_steps=0)
    saved = {"optimizer_state_dict": split.optimizer.state_dict(), "scheduler_state_dict": split.scheduler.state_dict(),
             "lr_scheduler_type": split.lr_scheduler_type, "max_grad_norm": split.max_grad_norm}  # no process group
    single = BF16Optimizer(model, lr=1e-3, total_steps=10, warmup_ratio=0.0)
    check_resumed_groups(single, 1.0)
    with pytest.raises(OutletsError, match=r"resume with outlets.length_head_lr_scale=10\b"):
        single.load_state_dict(saved)
    monkeypatch.setattr("specforge.optimizer.print_on_rank0", lambda *_: None)  # no process group
    check_resumed_groups(split, 10.0)
    split.load_state_dict(saved)  # the same grouping resumes


def test_censored_positions_are_penalised_only_below_their_bound():
    """One-sided: a censored position costs nothing while predicting at least its bound."""
    from specforge_outlets.training.objective import LengthWeighting, fit_length

    class RawIsZ:  # a head whose raw output is the predicted z itself
        @staticmethod
        def log_remaining(raw):
            return raw.squeeze(-1)

    weighting = LengthWeighting("per_response", 1.0, 1.0)
    labels = [torch.tensor([[-1, 5, 4, 3, 2, 1, -1, -1, -1]])]
    bounds = [torch.tensor([[-1, -1, -1, -1, -1, -1, 3, 2, 1]])]  # a censored response of 3 tokens so far

    def fit(censored_prediction, one_sided=True):
        z = torch.log1p(torch.tensor([0.0, 5, 4, 3, 2, 1, *censored_prediction]))  # exact where labelled
        raw = z.requires_grad_(True)
        out = fit_length(RawIsZ(), [raw[None, :, None]], labels, None, weighting, bounds if one_sided else None)
        out.loss.backward()
        return out, raw.grad[6:]

    above, grad = fit([10.0, 10, 10])
    assert float(above.loss) == 0.0 and torch.equal(grad, torch.zeros(3))
    below, grad = fit([0.5, 0.5, 0.5])
    assert float(below.loss) > 0 and bool((grad < 0).all())  # descent raises the prediction
    assert float(below.count) == 5 and float(below.static_count) == 1  # metrics over exact labels only
    dropped, grad = fit([0.5, 0.5, 0.5], one_sided=False)
    assert float(dropped.loss) == 0.0 and torch.equal(grad, torch.zeros(3))


def test_one_sided_recipe_setting_reaches_the_step(tiny_target):
    draft, _, strategy = make_step(tiny_target, length_censored="one_sided")
    batch = make_batch()
    labels = batch.tensors["remaining_length"].clone()
    batch.tensors["remaining_length"] = torch.full_like(labels, -1)
    batch.tensors["remaining_lower_bound"] = torch.arange(labels.shape[1], 0, -1)[None] + 10**6  # all censored, huge bounds
    out = strategy.forward_loss(batch)
    assert float(out.metrics["length_loss"]) > 0  # below every bound: only the one-sided term is there
    _, _, dropping = make_step(tiny_target)
    assert float(dropping.forward_loss(batch).metrics["length_loss"]) == 0.0
