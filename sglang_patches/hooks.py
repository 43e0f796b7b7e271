"""The hooks the plugin registers in SGLang's ``HookRegistry`` (SGLang 0.5.23).

Every hook is a pass-through unless the plugin's policy or routing method was asked for, so a
server started without the plugin's flags behaves exactly as stock. ``HOOK_TARGETS`` lists every
target; ``applied_targets()`` tells which of them the registry actually patched. SGLang logs and
swallows failures to apply a hook, so a server asked for an OUTLETS feature refuses to start when
a hook that feature needs is missing or the SGLang release is not a tested one (``check_hooks``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from sglang_patches import predictions as P
from specforge_outlets.scheduling import admission_order, predicted_output_budget, retraction_order_key
from sglang_patches.settings import (
    FLAGS,
    META_INFO_KEY,
    POLICY_NAME,
    OutletsSettingsError,
    check_draft_fits_target,
    check_radix_cache_disabled,
    read_settings,
    validate_draft_dir,
)

logger = logging.getLogger("sglang_patches")

_SERVER_ARGS = "sglang.srt.server_args.ServerArgs"
_POLICY = "sglang.srt.managers.schedule_policy.SchedulePolicy"
_ADDER = "sglang.srt.managers.schedule_policy.PrefillAdder"
_SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
_BATCH = "sglang.srt.managers.schedule_batch.ScheduleBatch"
_DECODE_MIXIN = "sglang.srt.disaggregation.decode.SchedulerDisaggregationDecodeMixin"
_TOKENIZER = "sglang.srt.managers.tokenizer_manager.TokenizerManager"
_INQUIRER = "sglang.srt.managers.scheduler_components.load_inquirer.SchedulerLoadInquirer"
_DPC = "sglang.srt.managers.data_parallel_controller"


# --------------------------------------------------------------------------------------------
# State of this process
# --------------------------------------------------------------------------------------------

_settings = None


def settings():
    global _settings
    if _settings is None:
        _settings = read_settings()
    return _settings


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
# Command line
# --------------------------------------------------------------------------------------------


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
    global _settings
    _settings = None
    try:
        current = settings()
        asked = features_asked(getattr(args, "schedule_policy", None), getattr(args, "load_balance_method", None),
                               current.draft_path)
        if asked:
            check_hooks(asked)
        if current.draft_path is not None:
            check_predictor_only_args(current.draft_path, args)
    except OutletsSettingsError as error:
        sys.stderr.write(f"error: {error}\n")
        raise SystemExit(2) from None
    return server_args


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


# --------------------------------------------------------------------------------------------
# Scheduler: predictions, waiting-queue order, retraction order, PD decode queue
# --------------------------------------------------------------------------------------------

def policy_init_around(original, self, policy, *args, **kwargs):
    outlets = policy == POLICY_NAME
    original(self, "fcfs" if outlets else policy, *args, **kwargs)
    self.outlets_config = settings().scheduling if outlets else None
    if outlets:  # also here: sglang.Engine users have no command line
        check_hooks(features_asked(POLICY_NAME, None, settings().draft_path))
        log_startup("schedule-policy")
    return None


def calc_priority_around(original, self, waiting_queue, *args, **kwargs):
    result = original(self, waiting_queue, *args, **kwargs)
    config = getattr(self, "outlets_config", None)
    if config is not None and len(waiting_queue) > 1:
        sort_waiting(waiting_queue, config)
    return result


def sort_waiting(waiting_queue, config) -> None:
    """Put SGLang's waiting list in the order the core's queue for ``--outlets-order`` admits it now."""
    ordered = admission_order(waiting_queue, settings().order, config, now=time.monotonic(),
                              keys=_order_keys(config))
    if ordered != waiting_queue:  # list comparison: identity first, at C speed
        waiting_queue[:] = ordered
        metrics().order_changes()


_cached_order_keys = None


def _order_keys(config) -> P.CachedOrderKeys:
    """One key provider per scheduling config, so that the keys cached on requests stay valid across rounds."""
    global _cached_order_keys
    if _cached_order_keys is None or _cached_order_keys.config is not config:
        _cached_order_keys = P.CachedOrderKeys(config)
    return _cached_order_keys


def add_request_to_queue_before(self, req, *args, **kwargs):
    if plugin_active():
        P.stamp_arrival(req)
        # Without an external prediction, predictor-only mode predicts at prefill; until then (and
        # without a predictor) the key uses the prior.
        P.assign_external_prediction(req, settings().scheduling)
    return None


def retraction_order_around(original, reqs):
    if not schedule_policy_is_outlets():
        return original(reqs)
    config = settings().scheduling
    # Most preferred to keep first; SGLang's loop retracts from the end.
    keys = [retraction_order_key(P.prediction(req), P.num_generated(req), P.arrival_time(req),
                                 getattr(req, "retraction_count", 0), config) for req in reqs]
    return sorted(range(len(reqs)), key=keys.__getitem__)


def running_token_offset_around(original, self, req):
    """KV admission by prediction: a running request holds its predicted remaining (+ margin) of output KV."""
    margin = settings().kv_margin
    if margin is None or not schedule_policy_is_outlets() or P.prediction(req) is None:
        return original(self, req)
    if getattr(getattr(req, "sampling_params", None), "ignore_eos", False):
        return original(self, req)  # runs to max_new_tokens whatever is predicted
    from sglang.srt.managers.schedule_policy import CLIP_MAX_NEW_TOKENS

    cap = min(max(req.sampling_params.max_new_tokens - len(req.output_ids), 0), CLIP_MAX_NEW_TOKENS)
    return predicted_output_budget(P.prediction(req), P.num_generated(req), margin, cap, settings().scheduling)


def prebuilt_batch_around(original, self, running_batch, *args, **kwargs):
    if schedule_policy_is_outlets() and len(self.waiting_queue) > 1:
        sort_waiting(self.waiting_queue, settings().scheduling)
    return original(self, running_batch, *args, **kwargs)


# --------------------------------------------------------------------------------------------
# Responses: the prediction in meta_info; metrics when a request finishes
# --------------------------------------------------------------------------------------------


def update_meta_info_after(result, self, meta_info, state, customized_info, index, finish_reason):
    values = meta_info.get(META_INFO_KEY)
    if isinstance(values, list):
        known = [value for value in values if value is not None]
        if not known:  # a request without a prediction (the prior was used): no key, as stock
            meta_info.pop(META_INFO_KEY, None)
            return result
        meta_info[META_INFO_KEY] = known[-1]
        if finish_reason is not None:
            completion = meta_info.get("completion_tokens")
            if isinstance(completion, int):
                metrics().prediction_error(abs(float(meta_info[META_INFO_KEY]) - completion))
    return result


class _Metrics:
    """Prometheus metrics, created only when SGLang runs with --enable-metrics."""

    def __init__(self) -> None:
        self._ready = False
        self._error = self._changes = None

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


_metrics = _Metrics()


def metrics() -> _Metrics:
    return _metrics


# --------------------------------------------------------------------------------------------
# Start-up log line
# --------------------------------------------------------------------------------------------

_logged = set()


def log_startup(where: str) -> None:
    if where in _logged:
        return
    _logged.add(where)
    current = settings()
    if current.draft_path:
        mode = f"predictor-only (OUTLETS draft {current.draft_path})"
    else:
        mode = "external predictions (sampling_params.custom_params) with the prior as fallback"
    config = current.scheduling
    kv = "SGLang's estimate" if current.kv_margin is None else f"predicted +{current.kv_margin:g}"
    logger.info(
        "OUTLETS %s: mode=%s, order=%s (long_output_len=%g, long_holdback=%g, aging_tokens_per_s=%g), "
        "kv_admission=%s, prior_output_len=%g, hooks applied: %d/%d",
        where, mode, current.order.value, config.long_output_len, config.long_holdback, config.aging_tokens_per_s,
        kv, config.prior_output_len, len(applied_targets()), len(HOOK_TARGETS),
    )


# --------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------


# What each OUTLETS feature needs patched. A target used by several features lists each.
CLI = "command line"
ORDERING = "--schedule-policy outlets"
ROUTING = "--load-balance-method outlets"
PREDICTOR = "--outlets-draft-path"

# The SGLang releases these hook targets were written for and the serve tests run against
# (requirements/serve-cpu.txt pins the newest); private methods among them move between releases.
TESTED_SGLANG_VERSIONS = ("0.5.23",)


def _targets():
    from sglang_patches import routing

    return [
        (f"{_SERVER_ARGS}.add_cli_args", add_cli_args_after, "AFTER", {CLI}),
        (f"{_SERVER_ARGS}.from_cli_args", from_cli_args_after, "AFTER", {CLI}),
        (f"{_POLICY}.__init__", policy_init_around, "AROUND", {ORDERING}),
        (f"{_POLICY}.calc_priority", calc_priority_around, "AROUND", {ORDERING}),
        (f"{_SCHEDULER}._add_request_to_queue", add_request_to_queue_before, "BEFORE", {ORDERING, ROUTING, PREDICTOR}),
        (f"{_BATCH}._get_decode_retraction_order", retraction_order_around, "AROUND", {ORDERING}),
        (f"{_ADDER}._get_running_request_total_token_offset", running_token_offset_around, "AROUND", {ORDERING}),
        (f"{_DECODE_MIXIN}._get_new_prebuilt_batch", prebuilt_batch_around, "AROUND", {ORDERING}),
        (f"{_TOKENIZER}.update_request_meta_info", update_meta_info_after, "AFTER", {ORDERING, PREDICTOR}),
        (f"{_INQUIRER}.get_loads", routing.get_loads_around, "AROUND", {ROUTING}),
        (f"{_SCHEDULER}.handle_generate_request", routing.handle_generate_request_before, "BEFORE", {ROUTING}),
        (f"{_DPC}.LoadBalanceMethod.from_str", routing.from_str_around, "AROUND", {ROUTING}),
        (f"{_DPC}.DataParallelController.__init__", routing.controller_init_after, "AFTER", {ROUTING}),
    ]


HOOK_TARGETS = []
_FEATURES_OF = {}  # target -> the features that need it


def register_all() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_patches import predictor

    targets = _targets() + [(target, fn, kind, {PREDICTOR}) for target, fn, kind in predictor.hook_targets()]
    for target, fn, kind, features in targets:
        if target not in HOOK_TARGETS:
            HOOK_TARGETS.append(target)
            _FEATURES_OF[target] = frozenset(features)
            HookRegistry.register(target, fn, getattr(HookType, kind))


def applied_targets():
    from sglang.srt.plugins.hook_registry import HookRegistry

    return [target for target in HOOK_TARGETS if target in HookRegistry._patched]


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
    missing = [target for target in HOOK_TARGETS if _FEATURES_OF[target] & features and target not in applied]
    if missing:
        problems.append(f"hooks that {', '.join(sorted(features - {CLI}))} needs did not apply: {', '.join(missing)}")
    if problems:
        raise OutletsSettingsError(
            "OUTLETS cannot run as asked: " + "; ".join(problems) + ". Install the tested SGLang "
            f"(pip install 'sglang=={TESTED_SGLANG_VERSIONS[-1]}'), or start without the OUTLETS flags for stock SGLang.")


def features_asked(schedule_policy, load_balance_method, draft_path) -> set:
    """The OUTLETS features a server's arguments ask for (none: stock SGLang, nothing is checked)."""
    asked = set()
    if schedule_policy == POLICY_NAME:
        asked.add(ORDERING)
    if str(load_balance_method).lower() == POLICY_NAME:
        asked.add(ROUTING)
    if draft_path is not None:
        asked.add(PREDICTOR)
    return asked
