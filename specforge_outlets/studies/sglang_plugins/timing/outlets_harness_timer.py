"""A tests' and studies' SGLang plugin: times the scheduler's prefill scheduling per round, and decode steps.

Found by SGLang's ``sglang.srt.plugins`` entry point through the ``.dist-info`` beside this file,
when the harness puts this directory on a server's ``PYTHONPATH`` (``SGLangServer(..., time_rounds=True)``).

- ``get_new_batch_prefill`` is where a round orders the waiting list (``calc_priority``, with the
  OUTLETS hook inside it) and admits from it. Every ``EVERY`` calls it logs one line with their
  mean time, the waiting-queue length and the mean time of the sort inside it (the OUTLETS plugin's,
  or SGLang's ``lof``), which ``benchmarks/scheduler_server_check.py`` reads.
- A decode step is ``Scheduler.run_batch`` (the forward: with EAGLE-3 the draft, the verify, the
  draft extend and the plugin's head read) plus ``Scheduler.process_batch_result`` (committing the
  tokens, where the plugin sets the estimates). Per batch size, every ``EVERY_DECODE`` steps, one line
  with their mean time; with the OUTLETS plugin in EAGLE-3 mode also the share of it spent in the
  plugin's own code (``attach_estimates`` and ``consume``). ``benchmarks/eagle3_cpu.py`` reads them.
"""

import logging
import time
from collections import defaultdict

EVERY = 50
EVERY_DECODE = 10
logger = logging.getLogger("outlets_harness_timer")
_calls, _seconds = [0], [0.0]
_order_seconds = [0.0]  # of that, in the sort of the waiting list (the OUTLETS plugin's, or SGLang's lof)
_decode = defaultdict(lambda: [0, 0.0, 0.0])  # batch size -> [steps, step seconds, plugin seconds]
_plugin_seconds = [0.0]


def _timed(original, self, *args, **kwargs):
    start = time.perf_counter()
    result = original(self, *args, **kwargs)
    _seconds[0] += time.perf_counter() - start
    _calls[0] += 1
    if _calls[0] == EVERY:
        logger.warning("HARNESS prefill scheduling: calls=%d mean_ms=%.4f queue=%d order_ms=%.4f",
                       _calls[0], 1e3 * _seconds[0] / _calls[0], len(self.waiting_queue),
                       1e3 * _order_seconds[0] / _calls[0])
        _calls[0], _seconds[0], _order_seconds[0] = 0, 0.0, 0.0
    return result


def _is_decode(batch) -> bool:
    return batch is not None and not batch.forward_mode.is_extend() and not batch.forward_mode.is_idle()


def _timed_forward(original, self, batch, *args, **kwargs):
    if not _is_decode(batch):
        return original(self, batch, *args, **kwargs)
    start = time.perf_counter()
    result = original(self, batch, *args, **kwargs)
    _decode[len(batch.reqs)][1] += time.perf_counter() - start
    return result


def _timed_commit(original, self, batch, *args, **kwargs):
    """The step's second half; the step is complete after it."""
    if not _is_decode(batch):
        return original(self, batch, *args, **kwargs)
    start = time.perf_counter()
    result = original(self, batch, *args, **kwargs)
    entry = _decode[len(batch.reqs)]
    entry[0] += 1
    entry[1] += time.perf_counter() - start
    entry[2] += _plugin_seconds[0]
    _plugin_seconds[0] = 0.0
    if entry[0] == EVERY_DECODE:
        logger.warning("HARNESS decode step: batch=%d steps=%d mean_ms=%.3f plugin_ms=%.4f", len(batch.reqs),
                       entry[0], 1e3 * entry[1] / entry[0], 1e3 * entry[2] / entry[0])
        entry[:] = [0, 0.0, 0.0]
    return result


def _counted(function, into=_plugin_seconds):
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            into[0] += time.perf_counter() - start

    return timed


def load() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register("sglang.srt.managers.scheduler.Scheduler.get_new_batch_prefill", _timed, HookType.AROUND)
    HookRegistry.register("sglang.srt.managers.scheduler.Scheduler.run_batch", _timed_forward, HookType.AROUND)
    HookRegistry.register("sglang.srt.managers.scheduler.Scheduler.process_batch_result", _timed_commit,
                          HookType.AROUND)
    from sglang.srt.managers.schedule_policy import SchedulePolicy

    SchedulePolicy._sort_by_longest_output = staticmethod(
        _counted(SchedulePolicy._sort_by_longest_output, into=_order_seconds))
    try:
        from sglang_patches import ordering, speculative
    except ImportError:  # timing stock SGLang
        return
    ordering.sort_waiting = _counted(ordering.sort_waiting, into=_order_seconds)
    speculative.attach_estimates = _counted(speculative.attach_estimates)
    speculative.HostDraftLengthEstimates.consume = _counted(speculative.HostDraftLengthEstimates.consume)
