"""Runtime state of the plugin in one SGLang process: settings, who runs OUTLETS, hooks, metrics, start-up log.

A leaf: it imports no other plugin module but ``settings`` (flags and their validation, stateless),
so the hook modules (``cli``, ``ordering``, ``kv_admission``, ``meta_info``, ``client_predictions``,
``routing``, ``load_endpoint``, ``predictor_mode``, ``speculative``, ``pd_transfer``) all read it and none imports another
(they share helpers that hold no hooks: ``predictions``, ``snapshots``). Tests set state through
:func:`use_settings` and :func:`reset_settings`.
"""

from __future__ import annotations

import logging
from typing import Dict, FrozenSet, Iterable, List, Optional

from sglang_patches.settings import POLICY_NAME, OutletsSettingsError, PluginSettings, read_settings
from specforge_outlets.scheduling import rule_knobs

logger = logging.getLogger("sglang_patches")

# --------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------

_settings: Optional[PluginSettings] = None


def settings() -> PluginSettings:
    """The plugin's settings in this process (read once from the OUTLETS_* environment)."""
    global _settings
    if _settings is None:
        _settings = read_settings()
    return _settings


def use_settings(chosen: Optional[PluginSettings]) -> None:
    """Make ``chosen`` this process's settings (None: read the environment again on next use)."""
    global _settings
    _settings = chosen


def reset_settings() -> None:
    use_settings(None)


# --------------------------------------------------------------------------------------------
# Who runs OUTLETS in this process (SGLang's runtime context)
# --------------------------------------------------------------------------------------------

def schedule_policy_is_outlets() -> bool:
    try:
        from sglang.srt.runtime_context import get_schedule

        return get_schedule().schedule_policy == POLICY_NAME
    except Exception:  # no runtime context in this process
        return False


def load_balance_is_outlets() -> bool:
    try:
        from sglang.srt.runtime_context import get_parallel

        return str(get_parallel().load_balance_method).lower() == POLICY_NAME
    except Exception:
        return False


def plugin_active() -> bool:
    return schedule_policy_is_outlets() or load_balance_is_outlets() or settings().draft_path is not None


# --------------------------------------------------------------------------------------------
# Hooks: what each feature needs, what applied, and the refusal when something is missing
# --------------------------------------------------------------------------------------------

CLI = "command line"
ORDERING = "--schedule-policy outlets"
ROUTING = "--load-balance-method outlets"
PREDICTOR = "--outlets-draft-path"
SPECULATIVE = "EAGLE-3 mode (an outlets export as --speculative-draft-model-path)"

# The SGLang releases these hook targets were written for and the serve tests run against
# (requirements/serve-cpu.txt pins the newest); private methods among them move between releases.
TESTED_SGLANG_VERSIONS = ("0.5.23",)

_features_of: Dict[str, FrozenSet[str]] = {}  # every registered target -> the features that need it


def record_target(target: str, features: Iterable[str]) -> None:
    """Note a target the registry registered and the features that need it."""
    _features_of[target] = frozenset(features)


def registered_targets() -> List[str]:
    return list(_features_of)


def applied_targets() -> List[str]:
    from sglang.srt.plugins.hook_registry import HookRegistry

    return [target for target in _features_of if target in HookRegistry._patched]


def installed_sglang_version() -> str:
    from importlib.metadata import version

    return version("sglang")


def check_hooks(features) -> None:
    """Refuse an asked-for OUTLETS feature that would silently run as stock SGLang.

    SGLang logs and swallows a hook that fails to apply (a private method renamed in another
    release), so the server would start and behave as stock while the user believes otherwise.
    """
    features = set(features) | {CLI}
    problems = []
    version = installed_sglang_version()
    if version not in TESTED_SGLANG_VERSIONS:
        problems.append(f"SGLang {version} is installed, the plugin is tested with {', '.join(TESTED_SGLANG_VERSIONS)}")
    applied = set(applied_targets())
    missing = [target for target, needed in _features_of.items() if needed & features and target not in applied]
    if missing:
        problems.append(f"hooks that {', '.join(sorted(features - {CLI}))} needs did not apply: {', '.join(missing)}")
    if problems:
        raise OutletsSettingsError(
            "OUTLETS cannot run as asked: " + "; ".join(problems) + ". Install the tested SGLang "
            f"(pip install 'sglang=={TESTED_SGLANG_VERSIONS[-1]}'), or start without the OUTLETS flags for stock SGLang.")


def features_asked(schedule_policy, load_balance_method, draft_path, speculative_outlets_draft: bool = False) -> set:
    """The OUTLETS features a server's arguments ask for (none: stock SGLang, nothing is checked).

    ``speculative_outlets_draft``: EAGLE-3 speculative decoding runs an ``outlets export``. Its
    predictions are asked for only together with an OUTLETS policy; as a plain draft it is stock."""
    asked = set()
    if schedule_policy == POLICY_NAME:
        asked.add(ORDERING)
    if str(load_balance_method).lower() == POLICY_NAME:
        asked.add(ROUTING)
    if draft_path is not None:
        asked.add(PREDICTOR)
    if speculative_outlets_draft and asked & {ORDERING, ROUTING}:
        asked.add(SPECULATIVE)
    return asked


# --------------------------------------------------------------------------------------------
# Metrics and the start-up log line
# --------------------------------------------------------------------------------------------

class _Metrics:
    """Prometheus metrics, created only when SGLang runs with --enable-metrics."""

    def __init__(self) -> None:
        self._ready = False
        self._error = self._changes = self._unpredicted_transfers = None

    def _init(self) -> None:
        self._ready = True
        try:
            from sglang.srt.runtime_context import get_observability

            if not get_observability().enable_metrics:
                return
            from prometheus_client import Counter, Histogram

            self._error = Histogram(
                "outlets_prediction_abs_error_tokens",
                "Absolute error of the predicted output length when a request finishes (tokens)",
                buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000),
            )
            self._changes = Counter(
                "outlets_queue_order_changes", "Scheduling rounds in which the outlets policy reordered the waiting queue"
            )
            self._unpredicted_transfers = Counter(
                "outlets_transfers_without_prediction",
                "Requests a PD decode instance received with no prediction from the prefill or the request (prior used)",
            )
        except Exception as error:  # metrics are best effort, never fatal
            logger.warning("OUTLETS metrics unavailable: %s", error)

    def prediction_error(self, value: float) -> None:
        if not self._ready:
            self._init()
        if self._error is not None:
            self._error.observe(value)

    def order_changes(self) -> None:
        if not self._ready:
            self._init()
        if self._changes is not None:
            self._changes.inc()

    def transfer_without_prediction(self) -> None:
        if not self._ready:
            self._init()
        if self._unpredicted_transfers is not None:
            self._unpredicted_transfers.inc()


_metrics = _Metrics()


def metrics() -> _Metrics:
    return _metrics


_logged = set()
_speculative_predictions = False  # EAGLE-3 mode found our draft behind this process's speculative worker


def use_speculative_predictions() -> None:
    """Note that this process predicts from the running EAGLE-3 draft (``speculative.worker_init_after``)."""
    global _speculative_predictions
    _speculative_predictions = True


def log_startup(where: str) -> None:
    if where in _logged:
        return
    _logged.add(where)
    current = settings()
    if current.draft_path:
        mode = f"predictor-only (OUTLETS draft {current.draft_path})"
    elif _speculative_predictions:
        mode = "EAGLE-3 (the speculative OUTLETS draft's length head: r̂_0 at prefill, r̂_t after each verify)"
    else:
        mode = "external predictions (sampling_params.custom_params) with the prior as fallback"
    config = current.scheduling
    kv = current.kv_admission.value + "".join(f" ({knob.name}={getattr(current, knob.name):g})"
                                               for knob in rule_knobs(current.kv_admission))
    long_class = "" if config.long_class_quantile is None else f", long_class_quantile={config.long_class_quantile:g}"
    logger.info(
        "OUTLETS %s: mode=%s, order=%s (long_output_len=%g, long_holdback=%g, aging_tokens_per_s=%g, "
        "order_key=%s%s, quantile_levels=%s), kv_admission=%s, prior_output_len=%g, hooks applied: %d/%d",
        where, mode, current.order.value, config.long_output_len, config.long_holdback, config.aging_tokens_per_s,
        config.order_key.value, long_class, ",".join(f"{level:g}" for level in config.quantile_levels),
        kv, config.prior_output_len, len(applied_targets()), len(_features_of),
    )
