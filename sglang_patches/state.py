"""Runtime state of the plugin in one SGLang process: settings, who runs OUTLETS, hooks, metrics, start-up log.

Everything the plugin keeps between hook calls lives in one object, :data:`PLUGIN` (a :class:`PluginState`):
no other plugin module keeps a module-level value it changes.

A leaf: it imports no other plugin module but ``settings`` (flags and their validation, stateless),
so the hook modules (``cli``, ``ordering``, ``kv_admission``, ``meta_info``, ``client_predictions``,
``routing``, ``load_endpoint``, ``predictor_mode``, ``speculative``, ``pd_transfer``) all read it and none imports another
(they share helpers that hold no hooks: ``predictions``, ``snapshots``). Tests set state through
:func:`use_settings` and :func:`reset_settings`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Set

from sglang_patches.settings import POLICY_NAME, OutletsSettingsError, PluginSettings, read_settings
from specforge_outlets.scheduling import OutputLengthHistory, SchedulingConfig, rule_knobs

logger = logging.getLogger("sglang_patches")

# --------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------

def settings() -> PluginSettings:
    """The plugin's settings in this process (read once from the OUTLETS_* environment)."""
    if PLUGIN.settings is None:
        PLUGIN.settings = read_settings()
    return PLUGIN.settings


def use_settings(chosen: Optional[PluginSettings]) -> None:
    """Make ``chosen`` this process's settings (None: read the environment again on next use)."""
    PLUGIN.settings = chosen


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


def disaggregation_mode(owner) -> str:
    """The PD role of a scheduler or tokenizer manager (its ``disaggregation_mode``): "null", "prefill" or "decode"."""
    mode = getattr(owner, "disaggregation_mode", None)
    return str(getattr(mode, "value", mode))


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


def record_target(target: str, features: Iterable[str]) -> None:
    """Note a target the registry registered and the features that need it."""
    PLUGIN.features_of[target] = frozenset(features)


def registered_targets() -> List[str]:
    return list(PLUGIN.features_of)


def applied_targets() -> List[str]:
    from sglang.srt.plugins.hook_registry import HookRegistry

    return [target for target in PLUGIN.features_of if target in HookRegistry._patched]


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
    missing = [target for target, needed in PLUGIN.features_of.items() if needed & features and target not in applied]
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

# Buckets of the absolute- and signed-error histograms (tokens; the signed one mirrored below 0)
ERROR_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
SIGNED_ERROR_BUCKETS = tuple(-bound for bound in reversed(ERROR_BUCKETS)) + (0,) + ERROR_BUCKETS
# Buckets of the predicted-length histogram (tokens): 1 to 32k, each about twice the last
LENGTH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 4000, 8000, 16000, 32000)


class _Metrics:
    """Prometheus metrics, created on first use only when SGLang runs with --enable-metrics (a no-op otherwise).

    SGLang runs prometheus_client in multiprocess mode, so a metric observed in the scheduler process (the order
    changes, the requests on the prior) and one observed in the tokenizer process (the finished requests') are both
    on the server's ``/metrics``."""

    def __init__(self) -> None:
        self._made: Optional[Dict[str, Any]] = None  # name -> metric, once made ({} without --enable-metrics)

    def _metric(self, name: str):
        if self._made is None:
            self._made = self._make()
        return self._made.get(name)

    @staticmethod
    def _make() -> Dict[str, Any]:
        try:
            from sglang.srt.runtime_context import get_observability

            if not get_observability().enable_metrics:
                return {}
            from prometheus_client import Counter, Histogram

            return {
                "abs_error": Histogram(
                    "outlets_prediction_abs_error_tokens",
                    "Absolute error of the predicted output length when a request finishes (tokens)",
                    buckets=ERROR_BUCKETS),
                "signed_error": Histogram(
                    "outlets_prediction_error_tokens",
                    "Completion tokens minus the predicted output length when a request finishes (tokens; > 0: "
                    "under-predicted)", buckets=SIGNED_ERROR_BUCKETS),
                "predicted": Histogram(
                    "outlets_predicted_output_len_tokens",
                    "Predicted output length (meta_info.predicted_output_len) of each finished request (tokens)",
                    buckets=LENGTH_BUCKETS),
                "order_changes": Counter(
                    "outlets_queue_order_changes",
                    "Scheduling rounds in which the outlets policy reordered the waiting queue"),
                "unpredicted_transfers": Counter(
                    "outlets_transfers_without_prediction",
                    "Requests a PD decode instance received with no prediction from the prefill or the request "
                    "(prior used)"),
                "on_prior": Counter(
                    "outlets_requests_on_prior",
                    "Requests this instance scheduled on the prior (--outlets-prior-output-len): no prediction of "
                    "their own and no predictor, a failed prediction, or a PD transfer without one"),
            }
        except Exception as error:  # metrics are best effort, never fatal
            logger.warning("OUTLETS metrics unavailable: %s", error)
            return {}

    def _observe(self, name: str, value: float) -> None:
        metric = self._metric(name)
        if metric is not None:
            metric.observe(value)

    def _count(self, name: str) -> None:
        metric = self._metric(name)
        if metric is not None:
            metric.inc()

    def finished(self, predicted: float, completion: int) -> None:
        """A request with a prediction finished after ``completion`` output tokens."""
        self._observe("abs_error", abs(predicted - completion))
        self._observe("signed_error", completion - predicted)
        self._observe("predicted", predicted)

    def order_changes(self) -> None:
        self._count("order_changes")

    def transfer_without_prediction(self) -> None:
        self._count("unpredicted_transfers")

    def served_on_prior(self) -> None:
        self._count("on_prior")


class FallbackCounter:
    """Counts predictions that failed and fell back to the prior (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def record(self, rid, reason: str, using: str = "the prior") -> int:
        with self._lock:
            self.count += 1
            count = self.count
        logger.warning("OUTLETS prediction failed for request %s (%s): using %s; failures so far: %d",
                       rid, reason, using, count)
        return count


@dataclass
class PluginState:
    """What the plugin keeps between hook calls in one process, in one place (:data:`PLUGIN`)."""

    settings: Optional[PluginSettings] = None  # read once from the OUTLETS_* environment (settings())
    loaded: bool = False  # sglang_patches.load() registered the hooks
    features_of: Dict[str, FrozenSet[str]] = field(default_factory=dict)  # registered target -> features needing it
    metrics: _Metrics = field(default_factory=_Metrics)
    once: Set[str] = field(default_factory=set)  # the one-time log lines given (first_time())
    speculative_predictions: bool = False  # EAGLE-3 mode found our draft behind this process's speculative worker
    fallbacks: FallbackCounter = field(default_factory=FallbackCounter)  # predictions that fell back
    output_lengths: OutputLengthHistory = field(default_factory=OutputLengthHistory)  # finished requests' (peak rules)
    order_keys: Any = None  # ordering's CachedOrderKeys, for the scheduling config it was made for
    key_tables: Dict[SchedulingConfig, Any] = field(default_factory=dict)  # key_tables.KeyTable per scheduling config
    predictor: Any = None  # predictor-only mode: this scheduler's OutletsLengthPredictor
    feature_capture: threading.local = field(default_factory=threading.local)  # predictor-only: the target's features
    received_requests: int = 0  # generate requests this scheduler (= data-parallel rank) received
    load_failures: int = 0  # /get_load reads that fell back to SGLang's token load
    snapshot_class: Optional[type] = None  # LoadSnapshot with the plugin's fields (snapshots.snapshot_class())


PLUGIN = PluginState()


def metrics() -> _Metrics:
    return PLUGIN.metrics


def first_time(what: str) -> bool:
    """True the first time it is asked about ``what`` in this process: for log lines given once."""
    if what in PLUGIN.once:
        return False
    PLUGIN.once.add(what)
    return True


def use_speculative_predictions() -> None:
    """Note that this process predicts from the running EAGLE-3 draft (``speculative.worker_init_after``)."""
    PLUGIN.speculative_predictions = True


def log_startup(where: str) -> None:
    if not first_time(f"start-up log: {where}"):
        return
    current = settings()
    if current.draft_path:
        mode = f"predictor-only (OUTLETS draft {current.draft_path})"
    elif PLUGIN.speculative_predictions:
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
        kv, config.prior_output_len, len(applied_targets()), len(PLUGIN.features_of),
    )
