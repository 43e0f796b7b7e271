"""Test-only SGLang plugin: times the scheduler's prefill scheduling (``get_new_batch_prefill``) per round.

Found by SGLang's ``sglang.srt.plugins`` entry point through the ``.dist-info`` beside this file,
when the harness puts this directory on a server's ``PYTHONPATH`` (``SGLangServer(..., time_rounds=True)``).
``get_new_batch_prefill`` is where a round orders the waiting list (``calc_priority``, with the
OUTLETS hook inside it) and admits from it. Every ``EVERY`` calls it logs one line with their
mean time and the waiting-queue length, which ``benchmarks/scheduler_server_check.py`` reads.
"""

import logging
import time

EVERY = 50
logger = logging.getLogger("outlets_harness_timer")
_calls, _seconds = [0], [0.0]


def _timed(original, self, *args, **kwargs):
    start = time.perf_counter()
    result = original(self, *args, **kwargs)
    _seconds[0] += time.perf_counter() - start
    _calls[0] += 1
    if _calls[0] == EVERY:
        logger.warning("HARNESS prefill scheduling: calls=%d mean_ms=%.4f queue=%d",
                       _calls[0], 1e3 * _seconds[0] / _calls[0], len(self.waiting_queue))
        _calls[0], _seconds[0] = 0, 0.0
    return result


def load() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register("sglang.srt.managers.scheduler.Scheduler.get_new_batch_prefill", _timed, HookType.AROUND)
