"""SGLang 0.5.23's own KV admission and retraction (``kv_admission: sglang``), as arithmetic the simulator runs.

Read from the installed package (never copied): ``srt/managers/schedule_policy.py`` (``PrefillAdder``:
``_get_running_request_total_token_offset``, ``add_one_req``, ``_select_prefill_admission``),
``srt/mem_cache/prefill_budget.py`` (``PrefillBudget``), ``srt/managers/scheduler_components/
new_token_ratio_tracker.py``, ``srt/managers/schedule_batch.py`` (``retract_decode``,
``_get_decode_retraction_order``) and ``srt/managers/scheduler.py`` (``_get_new_batch_prefill_raw``,
``update_running_batch``). tests/test_sglang_admission.py drives those classes and this module with the
same requests and cache states and asserts the same decisions.

One admission round (``PrefillAdder``; its arithmetic is the scheduling core's ``SGLangAdmission``,
which the plugin's charges extend), with the cache holding ``free`` tokens:

- every running request with ``g`` output tokens of ``max_new_tokens`` m is charged
  ``min(m - g, CLIP_MAX_NEW_TOKENS) x ratio`` on top of the KV it holds;
- the next waiting request is admitted when ``extend + min(m - g, CLIP) + PAGE_SIZE`` (``extend``:
  its prompt, plus the tokens a retracted request recomputes) is below what is left, strictly; once
  admitted it is charged ``extend + PAGE_SIZE + min(m, CLIP)`` (its whole ``max_new_tokens``, even
  after a retraction); the round stops at the first that does not fit, or once nothing is left.

A refused round marks the batch full: SGLang tries again only after a running request leaves
(finishes or is retracted). ``ratio`` starts at ``INIT_NEW_TOKEN_RATIO``, falls by
``(init - min) / NEW_TOKEN_RATIO_DECAY_STEPS`` per decode step to ``init x MIN_NEW_TOKEN_RATIO_FACTOR``,
and after a retraction is re-estimated from the requests left running. When the next decode step
does not fit, the running request with the fewest output tokens (ties: the longest prompt, then the
latest to join the batch) is retracted, and the next, until it fits; one is always kept.

The ratio's knobs (``--schedule-conservativeness`` and two environment variables) are the cluster's
(``ClusterConfig``), SGLang's defaults unless a study tunes them. Assumed as the simulator's servers run: page size 1, no prefix cache (``--disable-radix-cache``),
no ``ignore_eos``, full attention, no speculative decoding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Tuple

# SGLANG_INIT_NEW_TOKEN_RATIO (srt/environ.py): the share of a running request's remaining
# max_new_tokens charged at start, and after every reset.
INIT_NEW_TOKEN_RATIO = 0.7
# SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR: the ratio decays to this share of its initial value.
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
# SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS: decode steps from the initial to the minimum ratio.
NEW_TOKEN_RATIO_DECAY_STEPS = 600
# SGLANG_RETRACT_DECODE_STEPS: output tokens per request still running that the ratio
# re-estimated after a retraction counts on top of those generated.
RETRACT_DECODE_STEPS = 20


@dataclass
class NewTokenRatio:
    """``NewTokenRatioTracker.from_config()``: SGLang's defaults, or the knobs an operator tunes it by
    (:meth:`tuned`), so that a study can compare the plugin with SGLang at its best, not only its default."""

    init: float = INIT_NEW_TOKEN_RATIO
    min_factor: float = MIN_NEW_TOKEN_RATIO_FACTOR
    steps_to_minimum: int = NEW_TOKEN_RATIO_DECAY_STEPS
    current: float = field(init=False)

    def __post_init__(self) -> None:
        self.current = self.init

    @classmethod
    def tuned(cls, conservativeness: float, min_factor: float, decay_steps: int) -> "NewTokenRatio":
        """``--schedule-conservativeness``, ``SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR``, ``SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS``:
        the initial ratio is 0.7 x the conservativeness (at most 1), the minimum that x the factor."""
        return cls(min(INIT_NEW_TOKEN_RATIO * conservativeness, 1.0), min_factor, decay_steps)

    @property
    def minimum(self) -> float:
        return min(self.init * self.min_factor, 1.0)

    @property
    def decay(self) -> float:
        return (self.init - self.minimum) / self.steps_to_minimum

    def decay_steps(self, steps: int) -> None:
        """``decay_step`` once per decode step run without a retraction (the same float steps as SGLang's)."""
        minimum, decay = self.minimum, self.decay
        for _ in range(steps):
            if self.current <= minimum:
                break
            self.current = max(self.current - decay, minimum)

    def after_retraction(self, running: Iterable[Tuple[int, int]]) -> None:
        """``estimate_new_token_ratio_after_retract`` of the requests left running, as (output tokens, max_new_tokens)."""
        running = list(running)
        generated = sum(g for g, _ in running)
        asked = sum(m for _, m in running)
        self.current = min(1.0, (generated + RETRACT_DECODE_STEPS * len(running)) / (asked + 1))


def retraction_victim_key(generated: int, input_len: int) -> Tuple[int, int]:
    """Smallest first: the request SGLang retracts first (fewest output tokens, then the longest prompt)."""
    return generated, -input_len
