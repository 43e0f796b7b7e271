"""The ``eagle3-outlets`` algorithm: SpecForge's ``eagle3`` registration with OUTLETS providers.

SpecForge's providers are frozen dataclasses; every field we do not name here is EAGLE-3's own
(resume contract, checkpoint policy, capture layout, vocabulary mapping). What changes:
- the draft architecture (gated attention + length head) and its ``outlets_config``;
- the training model and step (length objective on every TTT draft state);
- the offline reader, normaliser and collator carry ``remaining_length``.
Online (streaming) capture is not registered: SpecForge's capture servers do not produce
length labels.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from specforge.algorithms.common.providers import make_registration
from specforge.algorithms.contracts import FeatureMode
from specforge.algorithms.eagle3 import providers as eagle3
from specforge.algorithms.registry import AlgorithmRegistration, AlgorithmRegistry

from specforge_outlets.data.features import FEATURE_KEYS, LENGTH_KEY, LOWER_BOUND_KEY
from specforge_outlets.data.fusion_layers import to_specforge_layer_ids
from specforge_outlets.data.labels import NO_LABEL
from specforge_outlets.errors import OutletsError
from specforge_outlets.model.draft import DRAFT_ARCHITECTURE
from specforge_outlets.training.settings import OutletsSettings

ALGORITHM_NAME = "eagle3-outlets"


def apply_outlets_draft_config(cfg, draft_config, *, settings: OutletsSettings) -> None:
    """Write ``outlets_config`` and the matching EAGLE-3 capture layer ids into the draft config."""
    from specforge.modeling.target.target_utils import load_target_config, target_text_config

    target = target_text_config(
        load_target_config(
            cfg.model.target_model_path,
            cache_dir=cfg.model.cache_dir,
            trust_remote_code=cfg.model.trust_remote_code,
        )
    )
    if cfg.model.load_target_embedding and draft_config.hidden_size != target.hidden_size:
        raise OutletsError(
            f"draft config hidden_size={draft_config.hidden_size} does not match the target's "
            f"hidden_size={target.hidden_size}; the draft reuses the target's embedding, so set "
            "hidden_size to the target's in model.draft_model_config (or omit it to derive one)"
        )
    draft_vocab = getattr(draft_config, "draft_vocab_size", None) or draft_config.vocab_size
    if draft_vocab > target.vocab_size:
        raise OutletsError(
            f"draft_vocab_size={draft_vocab} exceeds the target's vocab_size={target.vocab_size}; set "
            "draft_vocab_size <= vocab_size in model.draft_model_config"
        )
    outlets = settings.draft_config(draft_config.hidden_size, int(target.num_hidden_layers))
    layer_ids = to_specforge_layer_ids(outlets.fusion_layers)
    if cfg.model.aux_hidden_state_layer_ids not in (None, layer_ids):
        raise OutletsError(
            f"model.aux_hidden_state_layer_ids={cfg.model.aux_hidden_state_layer_ids} disagrees with "
            f"outlets.fusion_layers={list(outlets.fusion_layers)} (SpecForge ids {layer_ids}); "
            "set only outlets.fusion_layers"
        )
    draft_config.outlets_config = outlets.to_dict()
    eagle_config = dict(getattr(draft_config, "eagle_config", None) or {})
    eagle_config["eagle_aux_hidden_state_layer_ids"] = layer_ids
    draft_config.eagle_config = eagle_config


def training_labels(hidden_states_path: str, max_len: int):
    """The step-0 length labels of every training file, as the reader and normaliser cut them."""
    from specforge.runtime.data_plane.feature_store import load_feature_file
    from specforge.runtime.data_plane.offline_reader import list_feature_files

    from specforge_outlets.data.labels import shift_left

    for path in list_feature_files(hidden_states_path):  # memory-mapped: only the labels are read
        yield shift_left(load_feature_file(path)[LENGTH_KEY][:max_len], 1)


def init_length_bias(cfg, draft_model, settings: OutletsSettings) -> None:
    """``length_bias_init: mean``: start the heads at the best constant fit of the training labels.

    A resumed or warm-started run brings its own head, so it is left alone there.
    """
    from specforge_outlets.training.objective import LengthWeighting, constant_fit, constant_quantile_fit

    if settings.length_bias_init == "zero" or cfg.training.resume_from or cfg.model.draft_checkpoint_path:
        return
    try:
        bias = constant_fit(
            training_labels(cfg.data.hidden_states_path, cfg.data.max_length),
            draft_model.outlets.bucket_edges,
            LengthWeighting.from_settings(settings),
        )
    except ValueError as exc:
        raise OutletsError(f"data.hidden_states_path={cfg.data.hidden_states_path}: {exc}") from None
    draft_model.length_head.init_output_bias(bias)
    if draft_model.quantile_head is not None:
        draft_model.quantile_head.init_output_bias(constant_quantile_fit(
            training_labels(cfg.data.hidden_states_path, cfg.data.max_length), draft_model.quantile_head.levels,
            LengthWeighting.from_settings(settings)))


def build_training_model(cfg, draft_model, draft_config, target_config, tokenizer, *, settings: OutletsSettings):
    """EAGLE-3's training model and target head, with the OUTLETS TTT forward.

    SpecForge builds the frozen target head in bfloat16 whatever ``model.torch_dtype`` says; it is
    cast to the run's dtype so float32 runs (CPUs without native bfloat16) type-check. The length
    head's output bias is set here, before training, from the training labels (``init_length_bias``).
    """
    import torch
    from specforge.algorithms.model_providers import build_eagle3_model

    from specforge_outlets.training.cpu_loss import install_cpu_loss
    from specforge_outlets.training.loss_rows import install_loss_row_teacher
    from specforge_outlets.training.ttt_with_length import OutletsEagle3Model

    install_cpu_loss()
    install_loss_row_teacher()
    init_length_bias(cfg, draft_model, settings)
    parts = build_eagle3_model(cfg, draft_model, draft_config, target_config, tokenizer)
    base = parts.model
    parts.model = OutletsEagle3Model(
        draft_model=base.draft_model,
        length=base.length,
        attention_backend=base.attention_backend,
        lk_loss_type=base.lk_loss_type,
        kl_scale=base.kl_scale,
        kl_decay=base.kl_decay,
    )
    if parts.target_head is not None:
        parts.target_head = parts.target_head.to(dtype=getattr(torch, cfg.model.torch_dtype))
    return parts


def build_step(wrapped_model, *, target_head=None, **options):
    from specforge_outlets.training.strategy import OutletsTrainStrategy

    return OutletsTrainStrategy(wrapped_model, target_head=target_head, **options)


def step_options(config, *, settings: OutletsSettings):
    return {**eagle3.step_options(config), **settings.objective_options()}


def build_offline_reader(hidden_states_path, *, run_id, ttt_length, max_len):
    from specforge.runtime.data_plane.offline_reader import OfflineManifestReader

    return OfflineManifestReader(
        hidden_states_path,
        run_id=run_id,
        strategy=ALGORITHM_NAME,
        feature_keys=FEATURE_KEYS,
        ttt_length=ttt_length,
        max_len=max_len,
        target_repr="hidden_state",
    )


def normalize_offline_sample(raw, max_len: int, dtype: str):
    """EAGLE-3's normalisation, plus the labels, with target states in the run's dtype.

    Captures store bfloat16 (as SGLang does); a float32 CPU run reads the same files.
    """
    import torch
    from specforge.algorithms.eagle3.data import normalize_offline_sample as eagle3_normalize

    sample = eagle3_normalize(raw, max_len)
    for key in ("hidden_state", "target"):
        sample[key] = sample[key].to(getattr(torch, dtype))
    sample[LENGTH_KEY] = raw[LENGTH_KEY][:max_len].long().unsqueeze(0)  # [1, T]
    bounds = raw.get(LOWER_BOUND_KEY)  # files captured before censored bounds were written have none
    sample[LOWER_BOUND_KEY] = (torch.full_like(sample[LENGTH_KEY], NO_LABEL) if bounds is None
                               else bounds[:max_len].long().unsqueeze(0))  # [1, T]
    return sample


def build_offline_normalizer(max_len, *, ttt_length=1, use_usp_preprocess=False, dtype: str):
    assert not use_usp_preprocess, "eagle3-outlets does not register the usp backend"
    return partial(normalize_offline_sample, max_len=max_len, dtype=dtype)


def collate_with_labels(features, *, collate):
    import torch

    batch = collate(features)
    width = batch["input_ids"].shape[1]
    for key in (LENGTH_KEY, LOWER_BOUND_KEY):
        batch[key] = torch.cat(
            [torch.nn.functional.pad(item[key], (0, width - item[key].shape[1]), value=NO_LABEL) for item in features]
        )  # [B, T]
    return batch


def build_offline_collator():
    return partial(collate_with_labels, collate=eagle3.build_offline_collator())


def create_registration(settings: OutletsSettings, torch_dtype: str) -> AlgorithmRegistration:
    spec = eagle3.algorithm_spec()
    offline_contract = next(c for c in spec.feature_contracts if c.mode is FeatureMode.OFFLINE)
    spec = replace(
        spec,
        name=ALGORITHM_NAME,
        draft=replace(
            spec.draft,
            compatible_architectures=frozenset({DRAFT_ARCHITECTURE}),
            default_architecture=DRAFT_ARCHITECTURE,
        ),
        feature_contracts=(
            replace(
                offline_contract,
                required_tensors=offline_contract.required_tensors | {LENGTH_KEY},
                storage=replace(
                    offline_contract.storage,
                    format="specforge_hidden_states_v1+remaining_length",
                    required_tensors=offline_contract.storage.required_tensors | {LENGTH_KEY},
                    normalizer="eagle3_outlets_offline_v1",
                ),
            ),
        ),
        capabilities=replace(
            spec.capabilities, attention_backends=spec.capabilities.attention_backends - {"usp"}
        ),
    )
    providers = eagle3.algorithm_providers()
    model = providers.model
    providers = replace(
        providers,
        algorithm_name=ALGORITHM_NAME,
        step=replace(
            providers.step,
            build=build_step,
            options=partial(step_options, settings=settings),
        ),
        model=replace(
            model,
            draft_config=replace(
                model.draft_config,
                architecture=DRAFT_ARCHITECTURE,
                compatible_architectures=frozenset({DRAFT_ARCHITECTURE}),
                apply_overrides=partial(apply_outlets_draft_config, settings=settings),
            ),
            build_training_model=partial(build_training_model, settings=settings),
        ),
        offline=tuple(
            replace(
                offline,
                normalizer_id="eagle3_outlets_offline_v1",
                build_reader=build_offline_reader,
                build_normalizer=partial(build_offline_normalizer, dtype=torch_dtype),
                build_collator=build_offline_collator,
                capture_layout=None,  # features come from `outlets capture`, which adds the labels
            )
            for offline in providers.offline
        ),
        server_streaming=(),
        vocab_mapping_modes=frozenset({FeatureMode.OFFLINE}),
    )
    return make_registration(spec, providers)


def outlets_registry(settings: OutletsSettings, torch_dtype: str) -> AlgorithmRegistry:
    """SpecForge's built-in algorithms plus ``eagle3-outlets``, for SpecForge's composition root."""
    from specforge.algorithms.builtin import builtin_algorithm_registry

    import specforge_outlets.model.draft  # noqa: F401  (registers the draft architecture)

    return builtin_algorithm_registry().with_registration(create_registration(settings, torch_dtype))
