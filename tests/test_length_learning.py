"""Training that learns: the length head's r_hat_0 must follow what the prompt says.

Two prompt families on the tiny random target, answered with 6-10 and 56-72 tokens (the first prompt
token decides). A short CPU run of the real step (``OutletsTrainStrategy``, SpecForge's
``BF16Optimizer``, the bias initialisation and head parameter group ``outlets train`` uses) at
learning rate 1e-3 with the default head scale (10: the head at 1e-2) and the method's lambda = 0.1
must predict, at the state evaluation reads as r_hat_0 (the last prompt position, TTT step 0),
lengths that separate the families by 2x. The earlier set-up (pooled loss, zero bias, the head at the
draft's learning rate) does not: its head stays near z = 0 and predicts well under a token for both
families. (On real data a jointly trained head at 1e-2 stayed at chance, so the CPU recipe runs its
head at 1e-3: docs/training.md, "The length head's learning rate on the CPU recipe".)
"""

import glob
from types import SimpleNamespace

import pytest
import torch
from specforge.modeling.target.target_head import TargetHead
from specforge.optimizer import BF16Optimizer
from specforge.runtime.contracts import TrainBatch

from specforge_outlets.data.features import load_features
from specforge_outlets.data.labels import response_spans
from specforge_outlets.model.inference import predict_log_remaining
from specforge_outlets.model.length_head import log_remaining_to_tokens
from specforge_outlets.training.algorithm import build_offline_collator, build_offline_normalizer, init_length_bias
from specforge_outlets.training.cpu_loss import install_cpu_loss
from specforge_outlets.training.head_lr import head_parameter_group
from specforge_outlets.training.ttt_with_length import OutletsEagle3Model
from specforge_outlets.training.settings import OutletsSettings
from specforge_outlets.training.strategy import OutletsTrainStrategy
from tests.test_training_step import TTT, make_draft
from tests.tiny_target import make_features

SHORT, LONG = 10, 11  # first prompt token of each family
FAMILIES = {SHORT: (6, 10), LONG: (56, 72)}
STEPS, LR, BATCH, MAX_LEN = 60, 1e-3, 4, 128  # the draft's lr of recipes/smollm2-135m-cpu-outlets.yaml
OLD = dict(length_weighting="pooled", length_static_weight=0.0, length_ttt_decay=1.0, length_bias_init="zero",
           length_head_lr_scale=1.0)


@pytest.fixture(scope="module")
def family_features(tiny_target, tmp_path_factory):
    return make_features(tiny_target, str(tmp_path_factory.mktemp("families")), count=16, seed=0, lengths=FAMILIES)


def train(target_dir, features_dir, settings: OutletsSettings):
    """The draft after STEPS optimizer steps of the OUTLETS step on random batches of the features."""
    install_cpu_loss()
    draft = make_draft(target_dir, **{k: getattr(settings, k) for k in ("head_type", "head_input")})
    cfg = SimpleNamespace(training=SimpleNamespace(resume_from=None), model=SimpleNamespace(draft_checkpoint_path=None),
                          data=SimpleNamespace(hidden_states_path=features_dir, max_length=MAX_LEN))
    init_length_bias(cfg, draft, settings)
    model = OutletsEagle3Model(draft_model=draft, length=TTT, attention_backend="sdpa")
    strategy = OutletsTrainStrategy(model, target_head=TargetHead.from_pretrained(target_dir).float(),
                                    **settings.objective_options())
    optimizer = BF16Optimizer(model, lr=LR, total_steps=STEPS, warmup_ratio=0.0)
    if settings.length_head_lr_scale != 1.0:
        head_parameter_group(optimizer, model, settings.length_head_lr_scale, total_steps=STEPS, warmup_steps=0)
    normalize, collate = build_offline_normalizer(MAX_LEN, dtype="float32"), build_offline_collator()
    samples = [normalize(load_features(path)) for path in sorted(glob.glob(f"{features_dir}/*.ckpt"))]
    order = torch.Generator().manual_seed(0)
    for _ in range(STEPS):
        chosen = torch.randperm(len(samples), generator=order)[:BATCH].tolist()
        batch = TrainBatch(sample_ids=[str(i) for i in chosen], strategy="eagle3-outlets",
                           tensors=collate([samples[i] for i in chosen]), metadata={"target_repr": "hidden_state"})
        strategy.forward_loss(batch).loss.backward()
        optimizer.step()
    return draft.eval()


def mean_static_prediction(draft, features_dir):
    """{family: mean r_hat_0 in tokens}, read where ``outlets eval`` reads it (state at start - 1)."""
    predictions = {SHORT: [], LONG: []}
    for path in sorted(glob.glob(f"{features_dir}/*.ckpt")):
        features = load_features(path)
        z = predict_log_remaining(draft, features["input_ids"][None], features["aux_hidden_state"])[0]
        (start, _end), = response_spans(features["loss_mask"])
        predictions[int(features["input_ids"][0])].append(float(log_remaining_to_tokens(z[start - 1])))
    return {family: sum(values) / len(values) for family, values in predictions.items()}


@pytest.mark.parametrize("setup", ["defaults", "earlier-setup"])
def test_static_prediction_separates_prompt_families(tiny_target, family_features, setup):
    settings = OutletsSettings(**(OLD if setup == "earlier-setup" else {}))
    assert settings.length_loss_weight == 0.1  # the method's lambda
    r0 = mean_static_prediction(train(tiny_target, family_features, settings), family_features)
    print(f"{setup}: mean r_hat_0 short {r0[SHORT]:.2f}, long {r0[LONG]:.2f} tokens")
    if setup == "defaults":
        assert r0[LONG] >= 2 * r0[SHORT], r0
        assert 3 <= r0[SHORT] <= 20 and 32 <= r0[LONG] <= 128, r0  # and each near its family's length
    else:  # the old head never leaves z ~ 0: one length, under a token, for every prompt
        assert r0[LONG] < 1.5 * r0[SHORT] and r0[LONG] < 1.0, r0
