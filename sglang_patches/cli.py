"""Command line: ``outlets`` as a --schedule-policy and --load-balance-method choice, our flags, refusals at parse time.

Runs in the launcher. Bad settings, settings no asked-for feature reads (``setting_readers``), a draft
that does not fit the target, and a feature whose hooks did not apply on this SGLang are refused here,
before any process starts.
"""

from __future__ import annotations

import argparse
import os
import sys

from sglang_patches import state
from sglang_patches.setting_readers import refuse_unread_settings
from sglang_patches.settings import (
    ENV_QUANTILE_LEVELS,
    FLAGS,
    POLICY_NAME,
    OutletsSettingsError,
    check_draft_fits_target,
    check_radix_cache_disabled,
    draft_quantile_levels,
    is_outlets_speculative_draft,
    quantile_levels,
    validate_draft_dir,
)

_SERVER_ARGS = "sglang.srt.server_args.ServerArgs"


def add_cli_args_after(result, parser: argparse.ArgumentParser):
    """Add ``outlets`` to the --schedule-policy and --load-balance-method choices, and our flags."""
    for action in parser._actions:
        if action.dest in ("schedule_policy", "load_balance_method") and action.choices is not None:
            if POLICY_NAME not in action.choices:
                action.choices = list(action.choices) + [POLICY_NAME]
    existing = {option for action in parser._actions for option in action.option_strings}
    for flag, dest, env, kind, help_text in FLAGS:
        if flag not in existing:
            parser.add_argument(flag, dest=dest, type=kind, default=None, help=f"{help_text} Env: {env}")
    return result


def from_cli_args_after(server_args, cls, args: argparse.Namespace):
    """Carry our flags to the spawned processes (environment), and refuse bad settings now."""
    for flag, dest, env, kind, help_text in FLAGS:
        value = getattr(args, dest, None)
        if value is not None:
            os.environ[env] = str(value)
    state.reset_settings()
    try:
        speculative = is_outlets_speculative_draft(getattr(args, "speculative_algorithm", None),
                                                   getattr(args, "speculative_draft_model_path", None))
        if speculative and state.features_asked(getattr(args, "schedule_policy", None),
                                                getattr(args, "load_balance_method", None), None, True):
            use_speculative_draft_levels(args.speculative_draft_model_path)
        current = state.settings()
        asked = state.features_asked(getattr(args, "schedule_policy", None), getattr(args, "load_balance_method", None),
                                     current.draft_path, speculative)
        refuse_unread_settings(os.environ, asked)
        if asked:
            state.check_hooks(asked)
        if current.draft_path is not None:
            check_predictor_only_args(current.draft_path, args)
    except OutletsSettingsError as error:
        sys.stderr.write(f"error: {error}\n")
        raise SystemExit(2) from None
    return server_args


def use_speculative_draft_levels(draft_path: str) -> None:
    """EAGLE-3 mode with a draft that has a quantile head: its levels become every process's quantile levels
    (the draft path is SGLang's flag, not ours, so the spawned processes learn them from the environment);
    ``--outlets-quantile-levels`` other than the draft's is refused."""
    levels = draft_quantile_levels(draft_path)
    if levels is not None:
        levels = quantile_levels(os.environ.get(ENV_QUANTILE_LEVELS) or "", levels,
                                 f"--speculative-draft-model-path {draft_path}")
        os.environ[ENV_QUANTILE_LEVELS] = ",".join(repr(level) for level in levels)
        state.reset_settings()


def check_predictor_only_args(draft_path: str, args: argparse.Namespace) -> None:
    """Refuse, before anything starts, a draft directory or flags predictor-only mode cannot use."""
    import json

    config = validate_draft_dir(draft_path)
    if getattr(args, "speculative_algorithm", None):
        raise OutletsSettingsError(
            "--outlets-draft-path is predictor-only mode (speculative decoding off); it cannot be combined "
            f"with --speculative-algorithm {args.speculative_algorithm}"
        )
    check_radix_cache_disabled(bool(getattr(args, "disable_radix_cache", False)))
    target_config = os.path.join(str(getattr(args, "model_path", "")), "config.json")
    if os.path.isfile(target_config):  # a hub id is checked at model load instead
        with open(target_config) as handle:
            target = json.load(handle)
        target = target.get("text_config", target)
        check_draft_fits_target(draft_path, config, target["num_hidden_layers"], target["hidden_size"])


HOOK_TARGETS = [
    (f"{_SERVER_ARGS}.add_cli_args", add_cli_args_after, "AFTER", {state.CLI}),
    (f"{_SERVER_ARGS}.from_cli_args", from_cli_args_after, "AFTER", {state.CLI}),
]
