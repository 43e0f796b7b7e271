"""Settings of the OUTLETS SGLang plugin: CLI flags, the environment variables that carry them to
SGLang's spawned processes, and their validation. Imports nothing from SGLang or torch.

SGLang spawns its scheduler, data-parallel-controller and detokenizer processes after parsing the
command line; the spawned processes inherit ``os.environ`` but re-create everything else, so the
plugin's flags are copied into ``OUTLETS_*`` environment variables once parsed. The variables can
also be set directly (for ``sglang.Engine(...)`` users, who have no command line).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Tuple

from specforge_outlets.model.draft_config import OutletsDraftConfig
from specforge_outlets.data.fusion_layers import validate_fusion_layers
from specforge_outlets.scheduling import (
    DEFAULT_AGING_TOKENS_PER_S,
    DEFAULT_KV_ADMISSION,
    DEFAULT_KV_MARGIN,
    DEFAULT_KV_QUANTILE,
    DEFAULT_LONG_CLASS_SHARE,
    DEFAULT_RANK_WINDOW,
    KVAdmission,
    DEFAULT_LONG_HOLDBACK,
    DEFAULT_LONG_OUTPUT_LEN,
    DEFAULT_MAX_RETRACTIONS,
    DEFAULT_PRIOR_OUTPUT_LEN,
    DEFAULT_QUANTILE_LEVELS,
    OrderKey,
    QueuePolicy,
    SchedulingConfig,
    kv_knob_values,
)
from specforge_outlets.model.draft_modes import min_target_layers, target_features_refusal, target_hidden_size

POLICY_NAME = "outlets"  # --schedule-policy outlets, --load-balance-method outlets
# The architecture an `outlets export` names in its config.json (sglang_patches/eagle3_draft.py implements it).
DRAFT_ARCHITECTURE = "OutletsLlamaForCausalLMEagle3"
# --speculative-algorithm values whose draft worker EAGLE-3 mode reads (SGLang runs EAGLE-3 drafts under both).
EAGLE_ALGORITHMS = ("EAGLE3", "EAGLE")

ENV_PRIOR = "OUTLETS_PRIOR_OUTPUT_LEN"
ENV_AGING = "OUTLETS_AGING_TOKENS_PER_S"
ENV_ORDER = "OUTLETS_ORDER"
ENV_LONG_OUTPUT_LEN = "OUTLETS_LONG_OUTPUT_LEN"
ENV_LONG_HOLDBACK = "OUTLETS_LONG_HOLDBACK"
ENV_KV_ADMISSION = "OUTLETS_KV_ADMISSION"
ENV_KV_MARGIN = "OUTLETS_KV_MARGIN"
ENV_MAX_RETRACTIONS = "OUTLETS_MAX_RETRACTIONS"
ENV_DRAFT = "OUTLETS_DRAFT_PATH"
# Predicted length distributions: what the SJF order reads, the tail-safe class, KV admission by a quantile,
# and the levels of every request's quantiles
ENV_ORDER_KEY = "OUTLETS_ORDER_KEY"
ENV_LONG_CLASS_QUANTILE = "OUTLETS_LONG_CLASS_QUANTILE"
ENV_KV_QUANTILE = "OUTLETS_KV_QUANTILE"
ENV_QUANTILE_LEVELS = "OUTLETS_QUANTILE_LEVELS"
# tail-safe-ranks: the long class from the ranks of recent predictions
ENV_LONG_CLASS_SHARE = "OUTLETS_LONG_CLASS_SHARE"
ENV_RANK_WINDOW = "OUTLETS_RANK_WINDOW"

# KV admission rules --schedule-policy outlets offers (the scheduling core's KVAdmission values), the default (the
# core's, the simulator's too: sglang, SGLang's own estimate, the plugin's KV admission off) first; each rule's
# strategy declares the knobs it reads beside it (--outlets-kv-margin, --outlets-kv-quantile: kv_admission.rule_knobs).
KV_ADMISSIONS = (DEFAULT_KV_ADMISSION, KVAdmission.PEAK, KVAdmission.PREDICTED, KVAdmission.QUANTILE,
                 KVAdmission.PAST_FUTURE)
# The variable and flag of each KV knob (the core's Knob names)
KV_KNOB_SETTINGS = {"kv_margin": (ENV_KV_MARGIN, "--outlets-kv-margin"),
                    "kv_quantile": (ENV_KV_QUANTILE, "--outlets-kv-quantile")}

# Waiting-queue orders --schedule-policy outlets offers; tail-safe first, the default: SJF can make a
# length class's P99 several times worse than FCFS under overload (docs/serving.md).
ORDERS = (QueuePolicy.TAIL_SAFE, QueuePolicy.SJF, QueuePolicy.TAIL_SAFE_RANKS, QueuePolicy.LONGEST_FIRST)

# Key of an externally supplied prediction in a request's ``sampling_params.custom_params``.
CUSTOM_PARAM_KEY = "outlets_predicted_output_len"
# Key of the prediction in each response's ``meta_info``.
META_INFO_KEY = "predicted_output_len"
# Keys of the latest remaining-length estimate in EAGLE-3 mode (r̂_t) and of the output length it was made at.
REMAINING_META_KEY = "predicted_remaining_len"
REMAINING_AFTER_META_KEY = "predicted_remaining_after"
# Key of externally supplied quantiles of the TOTAL output length (token counts at the server's quantile levels) in
# ``custom_params`` (or ``custom_labels``, as a string "q1,q2,..."), and of the quantiles in ``meta_info``: the
# total-length quantiles at prefill (beside predicted_output_len) and, in EAGLE-3 mode, the latest remaining-length
# quantiles (beside predicted_remaining_len, read at predicted_remaining_after).
QUANTILES_PARAM_KEY = "outlets_predicted_quantiles"
QUANTILES_META_KEY = "predicted_output_quantiles"
REMAINING_QUANTILES_META_KEY = "predicted_remaining_quantiles"

# (flag, dest, env, type, help); --help adds "Env: <env>" to each
FLAGS = (
    ("--outlets-draft-path", "outlets_draft_path", ENV_DRAFT, str,
     "OUTLETS: an `outlets export` directory. Predictor-only mode: the draft's length head predicts each "
     "request's output length at prefill (speculative decoding off)."),
    ("--outlets-prior-output-len", "outlets_prior_output_len", ENV_PRIOR, float,
     f"OUTLETS: output length assumed for a request without a prediction (default {DEFAULT_PRIOR_OUTPUT_LEN:g})."),
    ("--outlets-order", "outlets_order", ENV_ORDER, str,
     f"OUTLETS: waiting-queue order, one of {', '.join(order.value for order in ORDERS)} (default "
     f"{ORDERS[0].value}: FCFS within predicted-length classes, bounded hold-back of predicted-long requests; "
     "sjf: shortest predicted remaining first with aging; tail-safe-ranks: tail-safe with the long class the top "
     "--outlets-long-class-share of recent predictions; longest-predicted-first: for offline batches' makespan)."),
    ("--outlets-long-output-len", "outlets_long_output_len", ENV_LONG_OUTPUT_LEN, float,
     f"OUTLETS tail-safe: predicted remaining length from which a request is in the long class (default "
     f"{DEFAULT_LONG_OUTPUT_LEN:g})."),
    ("--outlets-long-holdback", "outlets_long_holdback", ENV_LONG_HOLDBACK, float,
     f"OUTLETS tail-safe: a predicted-long request that waited W s yields to short ones that arrived within "
     f"this share of W after it (default {DEFAULT_LONG_HOLDBACK:g}; 0 = FCFS, >= 1 = strict priority)."),
    ("--outlets-kv-admission", "outlets_kv_admission", ENV_KV_ADMISSION, str,
     f"OUTLETS: how the KV cache admits a waiting request, one of {', '.join(rule.value for rule in KV_ADMISSIONS)} "
     f"(default {DEFAULT_KV_ADMISSION.value}: SGLang's own estimate, tuned by its own knobs). "
     f"{KVAdmission.PEAK.value}: admit a request only while the predicted "
     "future peak of the KV cache with it fits (nothing charged ahead; each request grows to its predicted end, its "
     "--outlets-kv-quantile quantile when it has quantiles, then frees its KV; one that outlived its prediction, or "
     "has none, is predicted from the output lengths seen); "
     f"{KVAdmission.PREDICTED.value}: a request with a prediction is charged its predicted remaining length x "
     "(1 + --outlets-kv-margin) of output KV, at most SGLang's own cap, instead of its remaining max_new_tokens "
     f"(new_token_ratio of it once running); {KVAdmission.QUANTILE.value}: the --outlets-kv-quantile quantile of its "
     f"predicted remaining length instead; {KVAdmission.PAST_FUTURE.value}: the peak from the output lengths seen "
     f"only, no prediction (LightLLM's past-future scheduler)."),
    ("--outlets-kv-margin", "outlets_kv_margin", ENV_KV_MARGIN, float,
     f"OUTLETS --outlets-kv-admission {KVAdmission.PREDICTED.value} only (refused without it): the share of the "
     f"predicted remaining length charged on top of it (default {DEFAULT_KV_MARGIN:g}; >= 0)."),
    ("--outlets-max-retractions", "outlets_max_retractions", ENV_MAX_RETRACTIONS, int,
     f"OUTLETS: a request retracted this often (KV cache full) is retracted again only when no other running "
     f"request can be (default {DEFAULT_MAX_RETRACTIONS})."),
    ("--outlets-aging-tokens-per-s", "outlets_aging_tokens_per_s", ENV_AGING, float,
     f"OUTLETS sjf: tokens of predicted remaining length one second of waiting is worth (default "
     f"{DEFAULT_AGING_TOKENS_PER_S:g}; 0 = plain SJF, no starvation bound)."),
    ("--outlets-order-key", "outlets_order_key", ENV_ORDER_KEY, str,
     f"OUTLETS sjf: what the order sorts by, one of {', '.join(key.value for key in OrderKey)} (default "
     f"{OrderKey.POINT.value}: the point prediction's remaining length; the others read the request's predicted "
     "quantiles: mean remaining, mean + CVaR_0.9, Gittins rank, KV footprint). Needs --outlets-order sjf."),
    ("--outlets-long-class-quantile", "outlets_long_class_quantile", ENV_LONG_CLASS_QUANTILE, float,
     "OUTLETS tail-safe: a request is in the long class when this quantile of its predicted remaining length "
     "reaches --outlets-long-output-len (default: its point prediction). A level strictly between 0 and 1."),
    ("--outlets-long-class-share", "outlets_long_class_share", ENV_LONG_CLASS_SHARE, float,
     f"OUTLETS tail-safe-ranks: a request is in the long class when its predicted remaining length is among this top "
     f"share of the last --outlets-rank-window predictions (default {DEFAULT_LONG_CLASS_SHARE:g}; strictly between 0 "
     "and 1). Needs --outlets-order tail-safe-ranks."),
    ("--outlets-rank-window", "outlets_rank_window", ENV_RANK_WINDOW, int,
     f"OUTLETS tail-safe-ranks: how many recent predictions the long class is read from (default "
     f"{DEFAULT_RANK_WINDOW}). Needs --outlets-order tail-safe-ranks."),
    ("--outlets-kv-quantile", "outlets_kv_quantile", ENV_KV_QUANTILE, float,
     f"OUTLETS --outlets-kv-admission {KVAdmission.PEAK.value}: the quantile of a request's predicted "
     f"remaining length read as its end (a request without quantiles ends at its point prediction); "
     f"{KVAdmission.QUANTILE.value}: the quantile charged. Default {DEFAULT_KV_QUANTILE:g}; a level strictly between "
     "0 and 1; refused with the other rules."),
    ("--outlets-quantile-levels", "outlets_quantile_levels", ENV_QUANTILE_LEVELS, str,
     f"OUTLETS: levels of the predicted quantiles, comma-separated (default: the OUTLETS draft's quantile_levels "
     f"when it has a quantile head, else {','.join(f'{level:g}' for level in DEFAULT_QUANTILE_LEVELS)}); a client's "
     f"{QUANTILES_PARAM_KEY} gives one token count per level."),
)


class OutletsSettingsError(ValueError):
    """A plugin setting is invalid; the server refuses to start."""


@dataclass(frozen=True)
class PluginSettings:
    scheduling: SchedulingConfig
    order: QueuePolicy
    draft_path: Optional[str]
    # the KV admission rule, the share charged on top of a prediction (predicted) and the quantile of the
    # predicted remaining length charged (quantile) or read as a request's end (peak): the simulator's
    # ClusterConfig fields of the same names
    kv_admission: KVAdmission = DEFAULT_KV_ADMISSION
    kv_margin: float = DEFAULT_KV_MARGIN
    kv_quantile: float = DEFAULT_KV_QUANTILE


def _env_number(env: Mapping[str, str], name: str, default, kind=float):
    """The variable as a ``kind`` (float or int), or ``default`` if unset or empty."""
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        raise OutletsSettingsError(f"{name}={raw!r} is not {'an integer' if kind is int else 'a number'}") from None


def read_settings(env: Mapping[str, str] = os.environ) -> PluginSettings:
    order_name = env.get(ENV_ORDER) or ORDERS[0].value
    orders = {order.value: order for order in ORDERS}
    if order_name not in orders:
        raise OutletsSettingsError(
            f"{ENV_ORDER} (--outlets-order)={order_name!r}: choose one of {', '.join(orders)}"
        )
    order = orders[order_name]
    key_name = env.get(ENV_ORDER_KEY) or OrderKey.POINT.value
    keys = {key.value: key for key in OrderKey}
    if key_name not in keys:
        raise OutletsSettingsError(f"{ENV_ORDER_KEY} (--outlets-order-key)={key_name!r}: choose one of {', '.join(keys)}")
    order_key = keys[key_name]
    if order_key is not OrderKey.POINT and order is not QueuePolicy.SJF:
        raise OutletsSettingsError(
            f"{ENV_ORDER_KEY} (--outlets-order-key)={key_name!r} sets what the sjf order sorts by, but the order is "
            f"{order.value}: add --outlets-order sjf (tail-safe reads a distribution through --outlets-long-class-quantile)")
    long_class_quantile = _env_level(env, ENV_LONG_CLASS_QUANTILE, "--outlets-long-class-quantile")
    if long_class_quantile is not None and order is not QueuePolicy.TAIL_SAFE:
        raise OutletsSettingsError(
            f"{ENV_LONG_CLASS_QUANTILE} (--outlets-long-class-quantile) sets the tail-safe order's long class, but the "
            f"order is {order.value}: leave it out, or use --outlets-order {QueuePolicy.TAIL_SAFE.value}")
    for name, flag in ((ENV_LONG_CLASS_SHARE, "--outlets-long-class-share"), (ENV_RANK_WINDOW, "--outlets-rank-window")):
        if env.get(name) and order is not QueuePolicy.TAIL_SAFE_RANKS:
            raise OutletsSettingsError(f"{name} ({flag}) sets the tail-safe-ranks order's long class, but the order is "
                                       f"{order.value}: leave it out, or use --outlets-order tail-safe-ranks")
    kv_admission, kv_margin, kv_quantile = _kv_settings(env)
    draft = env.get(ENV_DRAFT) or None
    levels = quantile_levels(env.get(ENV_QUANTILE_LEVELS) or "", draft_quantile_levels(draft) if draft else None,
                             f"--outlets-draft-path {draft}")
    try:
        config = SchedulingConfig(
            prior_output_len=_env_number(env, ENV_PRIOR, DEFAULT_PRIOR_OUTPUT_LEN),
            aging_tokens_per_s=_env_number(env, ENV_AGING, DEFAULT_AGING_TOKENS_PER_S),
            long_output_len=_env_number(env, ENV_LONG_OUTPUT_LEN, DEFAULT_LONG_OUTPUT_LEN),
            long_holdback=_env_number(env, ENV_LONG_HOLDBACK, DEFAULT_LONG_HOLDBACK),
            max_retractions=_env_number(env, ENV_MAX_RETRACTIONS, DEFAULT_MAX_RETRACTIONS, int),
            order_key=order_key,
            long_class_quantile=long_class_quantile,
            quantile_levels=levels,
            long_class_share=_env_number(env, ENV_LONG_CLASS_SHARE, DEFAULT_LONG_CLASS_SHARE),
            rank_window=_env_number(env, ENV_RANK_WINDOW, DEFAULT_RANK_WINDOW, int),
        )
    except ValueError as error:
        raise OutletsSettingsError(f"OUTLETS settings: {error}") from None
    return PluginSettings(scheduling=config, order=order, draft_path=draft, kv_admission=kv_admission,
                          kv_margin=kv_margin, kv_quantile=kv_quantile)


def _env_level(env: Mapping[str, str], name: str, flag: str) -> Optional[float]:
    """A probability level strictly between 0 and 1 from the variable, or None if unset or empty."""
    raw = (env.get(name) or "").strip()
    if not raw:
        return None
    try:
        level = float(raw)
    except ValueError:
        level = math.nan
    if not 0.0 < level < 1.0:
        raise OutletsSettingsError(f"{name} ({flag})={raw!r}: give a level strictly between 0 and 1, e.g. 0.9")
    return level


def quantile_levels(raw: str, draft_levels: Optional[Sequence[float]] = None,
                    draft: str = "the OUTLETS draft") -> Tuple[float, ...]:
    """The levels of every request's quantiles: ``--outlets-quantile-levels`` (comma-separated), else the draft's
    (its quantile head's), else the core's default; refused when given and different from the draft's."""
    raw = raw.strip()
    given = None
    if raw:
        try:
            given = tuple(float(part) for part in raw.strip("[]()").split(","))
            SchedulingConfig(quantile_levels=given)  # the core's rule: strictly increasing, inside (0, 1)
        except ValueError as error:
            reason = str(error).removeprefix("quantile_levels: ") if "quantile_levels" in str(error) else (
                "not a comma-separated list of numbers")
            raise OutletsSettingsError(f"{ENV_QUANTILE_LEVELS} (--outlets-quantile-levels)={raw!r}: {reason}") from None
    if draft_levels is not None:
        draft_levels = tuple(float(level) for level in draft_levels)
        if given is not None and not same_levels(given, draft_levels):
            raise OutletsSettingsError(
                f"{ENV_QUANTILE_LEVELS} (--outlets-quantile-levels)={raw!r} differs from the quantile levels of "
                f"{draft}, {_levels_text(draft_levels)}: its quantile head predicts at those; leave the flag out "
                f"or give them")
        return draft_levels
    return given if given is not None else tuple(DEFAULT_QUANTILE_LEVELS)


def same_levels(a: Sequence[float], b: Sequence[float], tolerance: float = 1e-6) -> bool:
    """Equal quantile levels (up to float32 rounding: levels travel as float32 in a PD transfer)."""
    return len(a) == len(b) and all(abs(float(x) - float(y)) <= tolerance for x, y in zip(a, b))


def _levels_text(levels: Sequence[float]) -> str:
    return ",".join(f"{level:g}" for level in levels)


def draft_quantile_levels(path: Optional[str]) -> Optional[Tuple[float, ...]]:
    """The quantile levels of an ``outlets export``'s quantile head, None without one (or without a readable
    config: the draft checks refuse such a directory with their own message)."""
    try:
        with open(os.path.join(str(path), "config.json")) as handle:
            levels = (json.load(handle).get("outlets_config") or {}).get("quantile_levels")
        return None if levels is None else tuple(float(level) for level in levels)
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _kv_settings(env: Mapping[str, str]) -> Tuple[KVAdmission, float, float]:
    """--outlets-kv-admission, --outlets-kv-margin and --outlets-kv-quantile, checked by the scheduling core's
    ``kv_knob_values`` (the simulator's cluster file's check too)."""
    given = (env.get(ENV_KV_ADMISSION) or "").strip().lower()
    raw = given or DEFAULT_KV_ADMISSION.value
    rules = {rule.value: rule for rule in KV_ADMISSIONS}
    if raw not in rules:
        raise OutletsSettingsError(f"{ENV_KV_ADMISSION} (--outlets-kv-admission)={raw!r}: choose one of "
                                   f"{', '.join(rules)}")
    rule = rules[raw]
    chosen = (f"{ENV_KV_ADMISSION}={rule.value}" if given else
              f"the default, --outlets-kv-admission {rule.value} ({ENV_KV_ADMISSION} unset)")
    knobs = {name: (env.get(variable) or "").strip() or None for name, (variable, _) in KV_KNOB_SETTINGS.items()}
    try:
        values = kv_knob_values(rule, knobs, lambda name: "{} ({})".format(*KV_KNOB_SETTINGS[name]),
                                "--outlets-kv-admission", chosen)
    except ValueError as error:
        raise OutletsSettingsError(str(error)) from None
    return rule, values["kv_margin"], values["kv_quantile"]


def validate_draft_dir(path: str) -> dict:
    """The export's config.json, or a clear refusal for a missing or incompatible directory."""
    if not os.path.isdir(path):
        raise OutletsSettingsError(f"--outlets-draft-path {path!r}: no such directory")
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise OutletsSettingsError(f"--outlets-draft-path {path!r}: no config.json (expected an `outlets export` directory)")
    with open(config_path) as handle:
        config = json.load(handle)
    if DRAFT_ARCHITECTURE not in (config.get("architectures") or []):
        raise OutletsSettingsError(
            f"--outlets-draft-path {path!r}: architectures={config.get('architectures')} is not an OUTLETS draft "
            f"(expected {DRAFT_ARCHITECTURE}; a plain EAGLE-3 draft has no length head)"
        )
    try:
        OutletsDraftConfig.from_dict(config.get("outlets_config") or {})  # the one parser of the block
    except (KeyError, TypeError, ValueError, AssertionError) as error:
        raise OutletsSettingsError(f"--outlets-draft-path {path!r}: outlets_config is malformed "
                                   f"({type(error).__name__}: {error}); re-export it with `outlets export`") from None
    if not any(name.endswith(".safetensors") for name in os.listdir(path)):
        raise OutletsSettingsError(f"--outlets-draft-path {path!r}: no .safetensors weights")
    return config


def is_outlets_speculative_draft(speculative_algorithm, speculative_draft_model_path) -> bool:
    """EAGLE-3 speculative decoding with an ``outlets export`` as its draft (its config.json names our class).

    A hub id (no local config.json) is not recognised here; the draft worker's hook still reads
    the head once the draft has loaded, but the refusal of missing hooks then comes at start-up."""
    if str(speculative_algorithm or "").upper() not in EAGLE_ALGORITHMS:
        return False
    config = os.path.join(str(speculative_draft_model_path or ""), "config.json")
    if not os.path.isfile(config):
        return False
    with open(config) as handle:
        return DRAFT_ARCHITECTURE in (json.load(handle).get("architectures") or [])


def check_draft_fits_target(draft_path: str, draft_config: dict, num_layers: int, hidden_size: int) -> None:
    """Refuse a draft whose fused depths or width do not fit the target (a draft trained for another target?), or
    one trained on the last layer alone (``draft_modes.target_features_refusal``).

    One rule for both places that check it: the launcher (from the target's config.json) and the
    scheduler at model load (from the loaded model). Depths count as everywhere in OUTLETS
    (``specforge_outlets.data.fusion_layers``); serving adds one limit: SGLang captures a decoder layer's
    input, so the last layer's output (index N) cannot be read. The limit and the width are
    ``specforge_outlets.model.draft_modes``' rules, which ``outlets export`` prints.
    """
    outlets = OutletsDraftConfig.from_dict(draft_config["outlets_config"])
    refusal = target_features_refusal(outlets)
    if refusal is not None:
        raise OutletsSettingsError(f"--outlets-draft-path {draft_path}: {refusal}")
    fusion = outlets.fusion_layers
    try:
        validate_fusion_layers(list(fusion), int(num_layers))
    except ValueError as error:
        raise OutletsSettingsError(f"--outlets-draft-path {draft_path}: fusion layers {list(fusion)} do not fit the "
                                   f"{num_layers}-layer target (a draft trained for another target?): {error}") from None
    if int(num_layers) < min_target_layers(outlets):
        raise OutletsSettingsError(
            f"--outlets-draft-path {draft_path}: fusion layer {num_layers} is the last layer's output, which SGLang "
            f"does not capture (it reads a layer's input); train the draft with fusion layers below {num_layers}")
    expected = target_hidden_size(draft_config)
    if expected is not None and expected != int(hidden_size):
        raise OutletsSettingsError(f"--outlets-draft-path {draft_path}: the draft expects target hidden size "
                                   f"{expected}, the target has {hidden_size}")


def check_radix_cache_disabled(disabled: bool) -> None:
    if not disabled:
        raise OutletsSettingsError(
            "--outlets-draft-path needs --disable-radix-cache: the draft reads the target's features at every "
            "prompt position, and a prefix served from the radix cache is not recomputed")


def parse_prediction(value) -> float:
    """A predicted output length from a request parameter; ValueError if it is not a usable number."""
    if isinstance(value, bool):
        raise ValueError(f"not a number: {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"not a finite non-negative number: {value!r}")
    return number


def parse_quantiles(value, levels: Sequence[float]) -> Tuple[float, ...]:
    """Quantiles of the total output length from a request parameter: one positive token count per level,
    non-decreasing; a list, or a string of comma-separated numbers (as ``custom_labels`` carry it). ValueError
    with the reason if unusable."""
    if isinstance(value, str):
        parts = [part for part in value.strip().strip("[]").split(",")]
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        raise ValueError(f"not a list of token counts: {value!r}")
    numbers = []
    for part in parts:
        if isinstance(part, bool):
            raise ValueError(f"{part!r} is not a number")
        try:
            number = float(part)
        except (TypeError, ValueError):
            raise ValueError(f"{part!r} is not a number") from None
        if not (math.isfinite(number) and number > 0):
            raise ValueError(f"{part!r} is not a positive number of tokens")
        numbers.append(number)
    if len(numbers) != len(levels):
        raise ValueError(f"{len(numbers)} values for the server's {len(levels)} quantile levels ({_levels_text(levels)})")
    if any(b < a for a, b in zip(numbers, numbers[1:])):
        raise ValueError("the quantiles decrease; give them in the order of the levels, non-decreasing")
    return tuple(numbers)
