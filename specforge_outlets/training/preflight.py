"""Checks that refuse a bad run before any training process starts.

Each check names the recipe field or file and the fix. They run in the launching process; the
workers it starts (torchrun, several nodes) re-read the same recipe.
"""

from __future__ import annotations

import os

from specforge_outlets.data.manifest import LABELS_SUMMARY, manifest_path, read_manifest
from specforge_outlets.errors import OutletsError
from specforge_outlets.training.recipe import Recipe



def check_recipe(recipe: Recipe, algorithm):
    """Refuse a bad run; returns the resolved draft config (with ``outlets_config``)."""
    cfg = recipe.config
    from specforge_outlets.training.algorithm import ALGORITHM_NAME

    if cfg.training.strategy != ALGORITHM_NAME:
        raise OutletsError(
            f"training.strategy={cfg.training.strategy!r}: `outlets train` runs '{ALGORITHM_NAME}'; "
            "set training.strategy: eagle3-outlets (use `specforge train` for other algorithms)"
        )
    _check_device(cfg)
    _check_tracking(cfg)
    _check_target_weights(cfg)
    draft_config = _resolve_draft_config(cfg, algorithm)
    if cfg.mode == "offline":
        _check_features(cfg, draft_config)
        if recipe.settings.length_loss_weight > 0:
            _check_finished_labels(cfg.data.hidden_states_path)
    _check_resume(cfg)
    return draft_config


def _check_device(cfg) -> None:
    import torch

    if not torch.cuda.is_available() and cfg.training.fsdp_sharding != "NO_SHARD":
        raise OutletsError(
            f"training.fsdp_sharding={cfg.training.fsdp_sharding} needs an accelerator; on CPU set "
            "training.fsdp_sharding: NO_SHARD (DDP over gloo)"
        )


def _check_tracking(cfg) -> None:
    """SpecForge's wandb tracker asks for a key only once the models are loaded, on rank 0."""
    from specforge_outlets.wandb_report import has_login

    tracking = cfg.tracking
    if tracking.report_to == "wandb" and not (tracking.wandb_offline or tracking.wandb_key or has_login()):
        raise OutletsError(
            "tracking.report_to=wandb: wandb is not logged in (no WANDB_API_KEY, no ~/.netrc entry); run "
            "`wandb login`, or pass tracking.report_to=none (or tracking.wandb_offline=true)"
        )


def _check_target_weights(cfg) -> None:
    """SpecForge loads the frozen target head and embedding by key through the weight index."""
    from specforge_outlets.data.weight_index import INDEX_FILE, read_index

    target = cfg.model.target_model_path
    if not os.path.isdir(target):
        if target.startswith((os.sep, ".", "~")) or os.sep in target.strip(os.sep).replace("/", "", 1):
            raise OutletsError(f"model.target_model_path={target} is not a directory")
        return  # a hub name: SpecForge downloads a sharded checkpoint with its index
    weight_map = read_index(target)
    if weight_map is None:
        raise OutletsError(
            f"model.target_model_path={target} has no *.index.json, which SpecForge's target head "
            f"needs; write {INDEX_FILE} with `python -m specforge_outlets.data.weight_index {target}`"
        )
    for field in ("lm_head_key", "embedding_key"):
        key = getattr(cfg.model, field)
        if key not in weight_map:
            hint = " (a target with tied embeddings: use model.embed_tokens.weight)" if field == "lm_head_key" else ""
            raise OutletsError(f"model.{field}={key!r} is not a weight of {target}{hint}")


def _resolve_draft_config(cfg, algorithm):
    from specforge.training.model_loading import resolve_draft_config

    try:
        return resolve_draft_config(cfg, provider=algorithm.providers.model.draft_config)
    except OutletsError:
        raise
    except FileNotFoundError as exc:
        raise OutletsError(f"model.draft_model_config={cfg.model.draft_model_config}: {exc}; a relative path is read "
                           "from the current directory, then beside the recipe's recipes/ folder: pass "
                           "model.draft_model_config=PATH") from None
    except ValueError as exc:
        raise OutletsError(f"model.draft_model_config: {exc}") from None


def _check_features(cfg, draft_config) -> None:
    from specforge.runtime.data_plane.offline_reader import list_feature_files

    from specforge_outlets.data.features import load_features
    from specforge_outlets.model.draft_config import read_outlets_config

    path = cfg.data.hidden_states_path
    if not os.path.exists(path):
        raise OutletsError(f"data.hidden_states_path={path} does not exist; write features with `outlets capture`")
    files = list_feature_files(path)
    if not files:
        raise OutletsError(f"data.hidden_states_path={path} holds no .ckpt or .ckpt.gz feature files; run `outlets capture`")
    target_hidden = getattr(draft_config, "target_hidden_size", draft_config.hidden_size)
    load_features(files[0], hidden_size=target_hidden)
    if not os.path.isfile(manifest_path(path)) and not os.path.isfile(os.path.join(path, LABELS_SUMMARY)):
        raise OutletsError(
            f"data.hidden_states_path={path} has no manifest.json, which `outlets capture` writes last: the capture "
            "stopped before it finished; rerun it with --resume (same --input and --output) to finish it"
        )
    captured = read_manifest(path).get("fusion_layers")
    expected = list(read_outlets_config(draft_config).fusion_layers)
    if captured is not None and list(captured) != expected:
        raise OutletsError(
            f"{manifest_path(path)}: features were captured at fusion layers {captured} but the draft "
            f"fuses {expected}; set outlets.fusion_layers: {captured} or re-capture"
        )


def _check_finished_labels(path: str) -> None:
    """Refuse features in which no response finished: every label censored, the length loss has nothing
    to learn from. Stops at the first file with a label (the first, in any usable capture)."""
    from specforge.runtime.data_plane.offline_reader import list_feature_files

    from specforge_outlets.data.features import LENGTH_KEY, read_feature_file
    from specforge_outlets.data.labels import NO_LABEL

    files = list_feature_files(path)
    for file in files:
        if (read_feature_file(file)[LENGTH_KEY] != NO_LABEL).any():
            return
    raise OutletsError(
        f"data.hidden_states_path={path}: none of its {len(files)} feature files has a finished response "
        "(every response was cut by the generation limit, so no length label); regenerate with a larger "
        "--max-new-tokens, or train the SD-only draft with outlets.length_loss_weight=0"
    )


def _check_resume(cfg) -> None:
    source = cfg.training.resume_from
    if not source or not os.path.exists(source):
        return
    from specforge.export.checkpoint_io import resolve_training_state

    from specforge_outlets.training.algorithm import ALGORITHM_NAME

    try:
        strategy = resolve_training_state(source).get("strategy")
    except (FileNotFoundError, ValueError):
        return  # a run root without a checkpoint yet: SpecForge starts fresh
    if strategy != ALGORITHM_NAME:
        raise OutletsError(
            f"training.resume_from={source} is a {strategy!r} checkpoint; it cannot resume an "
            f"'{ALGORITHM_NAME}' run (use model.draft_checkpoint_path to warm-start from it)"
        )
