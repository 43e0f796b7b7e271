"""KV admission: whether an instance's KV cache takes in its next waiting request, one strategy per rule.

Shaped like vLLM v1's ``request_queue.py`` (and :mod:`request_queue` here): a policy enum, an abstract
strategy, one small class per rule and a factory. The engine acts: it holds the cache, runs the steps,
retracts and builds a :class:`CacheState` at each admission round; the strategy decides: what each
request is charged and whether the next waiting one fits. The SGLang plugin
(``sglang_patches/kv_admission.py``, around SGLang's ``PrefillAdder``) and the simulator
(``simulation/schedulers/``) call the same strategies, so what is simulated is what is served.

The rules on SGLang's ``PrefillAdder`` share its arithmetic (:class:`SGLangAdmission`): a round starts
from the free KV less a charge per running request, and admits waiting requests in queue order while
each one's need is below what is left, charging it as it goes. They differ only in the charge:

- SGLang's (``sglang``): a running request ``new_token_ratio`` x its remaining ``max_new_tokens``, a
  request being admitted all of its remaining ``max_new_tokens``;
- the plugin's charge by prediction (``predicted``, ``quantile``): a predicted request its predicted
  remaining x (1 + ``kv_margin``), or the ``kv_quantile``-quantile of its predicted remaining length, where SGLang charges
  its ``max_new_tokens``;
- the predicted future peak (``peak``, :class:`PeakAdmission`): nothing is charged ahead; a waiting
  request is admitted only while the most KV the running requests, those admitted and it will hold
  at once, each growing a token a step until its predicted end and then freeing everything, stays
  within the cache (:func:`future_peak`, the computation of LightLLM's past-future scheduler). A
  request that outlives its prediction is predicted again from what has been seen (:class:`OutputLengthHistory`),
  never charged nothing;
- the past-future peak (``past-future``, :class:`PastFutureAdmission`): the same peak with every
  request's remaining length from the history of output lengths alone, no prediction (LightLLM's
  ``PastFutureQueue``, deterministic).

On a disaggregated decode instance SGLang admits by another rule (``sglang`` there,
:class:`DecodePreallocAdmission`): a transferred prompt's KV is pre-allocated while the cache keeps
``num_reserved_decode_tokens`` free per active request and room for the running request that needs most.

vLLM's (``vllm``, ``vllm-0.13``; its arithmetic is ``simulation/vllm_admission.py``'s) reserves nothing
ahead: a request is admitted while the blocks of its sequence (v0.13: of its first chunk) are free.
"""

from __future__ import annotations

import bisect
import itertools
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Deque, Dict, Iterable, List, Mapping, NamedTuple, Optional, Protocol, Sequence, Tuple

from specforge_outlets.scheduling.keys import SchedulingConfig, request_distribution
from specforge_outlets.scheduling.prediction import LengthPrediction
from specforge_outlets.scheduling.kv_budget import (
    DEFAULT_KV_MARGIN,
    DEFAULT_KV_QUANTILE,
    KNOBS,
    KV_MARGIN,
    KV_QUANTILE,
    Knob,
    predicted_output_budget,
    quantile_output_budget,
)

# SGLang's CLIP_MAX_NEW_TOKENS (SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION, schedule_policy.py): the most
# output tokens its admission counts per request, whatever the request's max_new_tokens.
CLIP_MAX_NEW_TOKENS = 4096
# The KV pool's page size on the simulated and tested servers (SGLang's default, 1): SGLang's
# admission adds one page per request for alignment.
PAGE_SIZE = 1
# SGLang's --num-reserved-decode-tokens (its default): the KV tokens a disaggregated decode instance keeps
# free per active request (running, in transfer, waiting to join the batch) when it pre-allocates a prompt
NUM_RESERVED_DECODE_TOKENS = 512
# Output lengths of the requests that finished last that the history keeps (LightLLM's PastFutureQueue
# WINDOW_SIZE): enough for a stable mean of the remaining length given survival, short enough to
# follow a workload that drifts.
HISTORY_WINDOW = 200


class KVAdmission(Enum):
    """How an instance decides that its KV cache takes in a waiting request: one name, its values, from the
    plugin's ``--outlets-kv-admission`` and the simulator's ``kv_admission`` to :func:`create_admission`."""

    # prompt + max(max_new_tokens, its output) reserved per request: the cache can never overflow,
    # nothing is retracted (the simulator's reference; no engine admits this way)
    MAX_NEW_TOKENS = "max-new-tokens"
    # the plugin's charge (its default before peak): SGLang's rounds and retraction with a predicted request
    # charged its predicted remaining x (1 + kv_margin) instead of its share of max_new_tokens
    # (PredictedChargeAdmission); a request not (yet) predicted is charged as SGLang charges it. On the
    # simulator's disaggregated decode instances, whose admission the plugin does not hook: a reservation
    # of prompt + generated + that budget (the full one without a prediction, and after a retraction).
    # Under SGLang's own orders (fcfs, lof, ...), which no plugin server runs with it, a what-if: the
    # plugin's charge with SGLang's retraction order
    PREDICTED = "predicted"
    # SGLang 0.5.23's own (SGLangAdmission): running requests charged min(max_new_tokens - generated,
    # 4096) x a decaying new_token_ratio, a new one its prompt + min(max_new_tokens, 4096); on a
    # disaggregated decode instance its DecodePreallocQueue's (DecodePreallocAdmission). The default
    # (DEFAULT_KV_ADMISSION)
    SGLANG = "sglang"
    # vLLM 0.34.0's own (VLLMAdmission with simulation/vllm_admission.py's rules): nothing reserved
    # ahead, a request admitted when its whole sequence's blocks are free
    VLLM = "vllm"
    # vLLM v0.13's (the paper's baseline): as vllm, but admitted when its first chunk's blocks are free,
    # in blocks of 16 tokens
    VLLM_0_13 = "vllm-0.13"
    # as predicted, with the kv_quantile-quantile of the predicted remaining length instead of the
    # prediction x (1 + kv_margin) (QuantileChargeAdmission); a request
    # without quantiles (the oracle) is charged its point prediction
    QUANTILE = "quantile"
    # opt-in: the predicted future peak within the cache (PeakAdmission): each request's
    # predicted end (r̂ₜ where the draft re-predicts), its kv_quantile-quantile with quantiles, the history's
    # expected remaining once it outlived its prediction or without one
    PEAK = "peak"
    # the same peak from the history of output lengths only (PastFutureAdmission; LightLLM's)
    PAST_FUTURE = "past-future"


# The rule when none is named, the plugin's (--outlets-kv-admission) and the simulator's (kv_admission): SGLang's
# own. The regime map found the peak far ahead of SGLang's admission with its default knobs only where the cache
# binds, and behind SGLang tuned by its own knobs there (docs/admission.md, "Why SGLang's admission is the default"):
# the plugin leaves a user's admission, tuned or not, as it is; the peak is an opt-in.
DEFAULT_KV_ADMISSION = KVAdmission.SGLANG

# the plugin's charges by prediction (kv_margin on the prediction, or its kv_quantile-quantile)
PREDICTION_ADMISSIONS = (KVAdmission.PREDICTED, KVAdmission.QUANTILE)
# admission by the future peak of the cache, with predictions or without
PEAK_ADMISSIONS = (KVAdmission.PEAK, KVAdmission.PAST_FUTURE)
# SGLang's PrefillAdder rounds: its own charge, the plugin's, and the peak's gate on top of them
CHARGE_ADMISSIONS = (KVAdmission.SGLANG,) + PREDICTION_ADMISSIONS + PEAK_ADMISSIONS
# vLLM's own admissions, one per version modelled
VLLM_ADMISSIONS = (KVAdmission.VLLM, KVAdmission.VLLM_0_13)


class KVRequest(NamedTuple):
    """What admission reads from one request; the engine builds one per request and round."""

    extend: int  # tokens its next prefill computes: a waiting request's prompt, plus the output a retracted one recomputes
    generated: int  # output tokens so far
    max_new_tokens: int  # what its client asked for
    predicted_output_len: Optional[float] = None  # latest predicted total output length; None: not predicted
    predicted_output_quantiles: Optional[Tuple[float, ...]] = None  # at the scheduling config's levels
    ignore_eos: bool = False  # it runs to max_new_tokens whatever is predicted
    held: int = 0  # KV tokens it holds now (SGLang: prompt + output but the last token, which the next step writes)

    @classmethod
    def from_prediction(cls, prediction: Optional[LengthPrediction], extend: int, generated: int, max_new_tokens: int,
                        ignore_eos: bool = False, held: int = 0) -> "KVRequest":
        """A request whose latest prediction is ``prediction`` (None: not predicted), as admission reads it."""
        if prediction is None:
            return cls(extend, generated, max_new_tokens, None, None, ignore_eos, held)
        return cls(extend, generated, max_new_tokens, prediction.predicted_output_len,
                   prediction.predicted_output_quantiles, ignore_eos, held)


@dataclass(frozen=True)
class CacheState:
    """An instance's KV cache as an admission round starts."""

    free: float  # KV free now: tokens (SGLang: available + evictable), or blocks for a block-based rule
    running: Sequence[KVRequest] = ()  # decoding requests
    # admitted, prompt still being prefilled (charged at admission): held, the KV of what is prefilled so far,
    # extend, the rest of its prompt; the simulator's prefilling requests (their whole prompt held from
    # admission) and SGLang's chunked request (Scheduler.chunked_req: its prefilled chunks held)
    prefilling: Sequence[KVRequest] = ()
    ratio: float = 0.0  # SGLang's new_token_ratio
    step_tokens: int = 0  # vLLM: tokens left of the step's budget (max_num_batched_tokens)
    any_running: bool = False  # vLLM's watermark applies while any request runs


class AdmissionRound(ABC):
    """One admission round: asked about the waiting requests in queue order, it stops at the first refused."""

    @abstractmethod
    def admit(self, request: KVRequest) -> bool:
        """Whether the request fits; if it does, it counts as admitted for the rest of the round."""

    @property
    def exhausted(self) -> bool:
        """Nothing is left: the round ends after an admission (SGLang then marks its batch full)."""
        return False


class Admission(ABC):
    """One KV admission rule; ``knobs``: the settings beside its name that it reads (the others are refused)."""

    knobs: Tuple[Knob, ...] = ()

    @abstractmethod
    def open_round(self, state: CacheState) -> AdmissionRound:
        """Start an admission round on a cache in ``state``."""


class SGLangAdmission(Admission):
    """SGLang 0.5.23's ``PrefillAdder``; subclasses change only what a request is charged (:meth:`output_budget`).

    A running request with ``g`` output tokens of ``max_new_tokens`` m is charged ``min(m - g, CLIP) x
    ratio`` on top of the KV it holds (``_get_running_request_total_token_offset``); a waiting request
    fits when ``extend + min(m - g, CLIP) + PAGE_SIZE`` is below what is left, strictly (``add_one_req``,
    ``PrefillBudget.check_prefill``), and once admitted is charged ``extend + PAGE_SIZE + min(m, CLIP)``
    for the rest of the round, its whole ``max_new_tokens`` even after a retraction
    (``_select_prefill_admission``).
    """

    def output_budget(self, request: KVRequest) -> Optional[int]:
        """Output KV tokens to charge the request from now on, or None to charge as SGLang does."""
        return None

    def running_charge(self, request: KVRequest, ratio: float) -> float:
        """KV tokens a running request is charged on top of what it holds."""
        budget = self.output_budget(request)
        if budget is None:
            return min(request.max_new_tokens - request.generated, CLIP_MAX_NEW_TOKENS) * ratio
        return budget  # no ratio: the budget is already what is expected to be left

    def asked_max_new_tokens(self, request: KVRequest) -> int:
        """``max_new_tokens`` as SGLang's arithmetic reads it for a request being admitted: with a budget,
        its tokens so far plus the budget (the plugin has it ask for that during ``add_one_req``)."""
        budget = self.output_budget(request)
        return request.max_new_tokens if budget is None else request.generated + budget

    def open_round(self, state: CacheState) -> AdmissionRound:
        charged = sum(self.running_charge(request, state.ratio) for request in state.running)
        # a request still prefilling holds its prompt's KV (in the free count) and was charged its whole
        # max_new_tokens at admission
        charged += sum(admitted_charge(0, request.max_new_tokens) for request in state.prefilling)
        return ChargeRound(self, state.free, charged)


class ChargeRound(AdmissionRound):
    """A round of :class:`SGLangAdmission`: what is left is the free KV less everything charged."""

    def __init__(self, admission: SGLangAdmission, free: float, charged: float) -> None:
        self.admission, self.free, self.charged = admission, free, charged

    def admit(self, request: KVRequest) -> bool:
        asked = self.admission.asked_max_new_tokens(request)
        if not admission_need(request.extend, asked, request.generated) < self.free - self.charged:
            return False
        self.charged += admitted_charge(request.extend, asked)
        return True

    @property
    def exhausted(self) -> bool:
        return self.free - self.charged <= 0


def admission_need(extend: int, max_new_tokens: int, generated: int) -> int:
    """KV tokens a waiting request asks SGLang's round for; it fits when more than these are left."""
    return extend + min(max(max_new_tokens - generated, 0), CLIP_MAX_NEW_TOKENS) + PAGE_SIZE


def admitted_charge(extend: int, max_new_tokens: int) -> int:
    """KV tokens SGLang charges an admitted request for the rest of the round (its prefill's included)."""
    return extend + PAGE_SIZE + min(max_new_tokens, CLIP_MAX_NEW_TOKENS)


class PredictedChargeAdmission(SGLangAdmission):
    """``kv_admission predicted``: a predicted request charged its predicted remaining x (1 + ``kv_margin``)."""

    knobs = (KV_MARGIN,)

    def __init__(self, kv_margin: float, config: SchedulingConfig) -> None:
        self.kv_margin, self.config = kv_margin, config

    def output_budget(self, request: KVRequest) -> Optional[int]:
        cap = _budget_cap(request)
        if cap is None:
            return None
        return predicted_output_budget(request.predicted_output_len, request.generated, self.kv_margin, cap, self.config)


class QuantileChargeAdmission(SGLangAdmission):
    """``kv_admission quantile``: a predicted request charged the ``kv_quantile``-quantile of its remaining length,
    from its quantiles, else a point mass at its prediction (the predicted remaining, no margin)."""

    knobs = (KV_QUANTILE,)

    def __init__(self, kv_quantile: float, config: SchedulingConfig) -> None:
        self.kv_quantile, self.config = kv_quantile, config

    def output_budget(self, request: KVRequest) -> Optional[int]:
        cap = _budget_cap(request)
        if cap is None:
            return None
        distribution = request_distribution(request.predicted_output_len, request.predicted_output_quantiles,
                                            self.config)
        return quantile_output_budget(distribution, request.generated, self.kv_quantile, cap)


def _budget_cap(request: KVRequest) -> Optional[int]:
    """What is left of a predicted request's clipped ``max_new_tokens`` (a charge by prediction never exceeds
    SGLang's); None where the charge stays SGLang's: no prediction, or a request that ignores EOS."""
    if request.predicted_output_len is None or request.ignore_eos:
        return None
    return min(max(request.max_new_tokens - request.generated, 0), CLIP_MAX_NEW_TOKENS)


def future_peak(occupants: Iterable[Tuple[float, float]]) -> float:
    """The most KV tokens held at once from now on by requests that each hold ``h`` tokens now, add one
    per decode step for ``r`` more steps and then free all of theirs, given as ``(h, r)``.

    Between two finishes the total only grows, so the peak is reached at a finish: sorted by ``r``
    descending, when the k-th finishes (step ``r_k``) the first k still hold ``h_j + r_k`` each, so the
    peak is ``max_k (sum_{j <= k} h_j + k r_k)``, the computation of LightLLM's past-future scheduler
    (``ChunkedPrefillQueue._can_add_new_req``). The last term is at least what all hold now.
    """
    ordered = sorted(occupants, key=lambda occupant: -occupant[1])
    held = itertools.accumulate(h for h, _ in ordered)
    return max((total + count * r for count, (total, (_, r)) in enumerate(zip(held, ordered), 1)), default=0.0)


class OutputLengthHistory:
    """The output lengths of the last ``window`` requests to finish, and the remaining length they imply.

    Read as LightLLM's past-future scheduler reads its history: a request that has generated ``g``
    tokens ends like the recorded outputs longer than ``g``, or at the most it may generate, which
    counts as one more recorded length (so an empty history, or one with nothing above ``g``, gives
    what is left of ``max_new_tokens``). LightLLM draws from that range at random; the expected
    remaining length is its deterministic reading.
    """

    def __init__(self, window: int = HISTORY_WINDOW) -> None:
        self._recent: Deque[int] = deque(maxlen=window)
        self._sorted: List[int] = []
        self._suffix_sums: Optional[List[int]] = None  # _suffix_sums[i]: sum of _sorted[i:], built when read

    def record(self, output_len: int) -> None:
        """A request finished with ``output_len`` tokens."""
        if len(self._recent) == self._recent.maxlen:
            del self._sorted[bisect.bisect_left(self._sorted, self._recent[0])]
        self._recent.append(output_len)
        bisect.insort(self._sorted, output_len)
        self._suffix_sums = None

    def mean_remaining(self, generated: int, max_new_tokens: int) -> float:
        """E[L - g | L > g] over the recorded lengths ``L`` and ``max_new_tokens``, for ``g`` = ``generated``."""
        if self._suffix_sums is None:
            self._suffix_sums = list(itertools.accumulate(reversed(self._sorted), initial=0))[::-1]
        first = bisect.bisect_right(self._sorted, generated)
        longer = len(self._sorted) - first
        total = self._suffix_sums[first] + max(max_new_tokens, generated)
        return total / (longer + 1) - generated

    def __len__(self) -> int:
        return len(self._recent)

    def __iter__(self):
        """The recorded lengths, oldest first."""
        return iter(self._recent)


class PeakAdmission(SGLangAdmission):
    """The predicted future peak: a waiting request is admitted only while the peak with it fits the cache.

    Nothing is charged ahead (SGLang's arithmetic still checks that the prompt fits now). A running
    request holds its KV and grows a token a step for its predicted remaining length; a request being
    admitted, or still being prefilled (``CacheState.prefilling``: a prompt prefilled in chunks, which
    holds the KV of its chunks so far), holds its prompt (and the output a retracted one recomputes)
    once prefilled, which samples its next token, and grows for the rest. Each request's end: its quantiles' ``kv_quantile``-quantile
    of the remaining length given survival (the peak at that risk per request), else its point
    prediction (the latest: r̂ₜ where the draft re-predicts); once it outlived them, or without a
    prediction, the history's expected remaining given survival. With true lengths nothing it admits
    is ever retracted, and a request it refuses would overflow the cache before the running ones end.
    """

    knobs = (KV_QUANTILE,)

    def __init__(self, kv_quantile: float, config: SchedulingConfig, history: OutputLengthHistory) -> None:
        self.kv_quantile, self.config, self.history = kv_quantile, config, history

    def output_budget(self, request: KVRequest) -> Optional[int]:
        return 0  # charged nothing ahead: the peak is the gate

    def predicted_output_len(self, request: KVRequest) -> float:
        """The request's predicted total output length, at most its ``max_new_tokens``."""
        generated, total = request.generated, None
        if request.ignore_eos:  # it runs to max_new_tokens whatever is predicted
            total = request.max_new_tokens
        elif request.predicted_output_quantiles is not None:
            distribution = request_distribution(request.predicted_output_len, request.predicted_output_quantiles,
                                                self.config)
            if distribution.atoms[-1] > generated:
                total = generated + distribution.quantile_remaining(self.kv_quantile, generated)
        elif request.predicted_output_len is not None and request.predicted_output_len > generated:
            total = request.predicted_output_len
        if total is None:  # outlived its prediction, or none: predicted again from what finished
            total = generated + self.history.mean_remaining(generated, request.max_new_tokens)
        return min(total, max(request.max_new_tokens, generated))

    def occupant(self, request: KVRequest, decoding: bool) -> Tuple[float, float]:
        """``(h, r)`` of :func:`future_peak`: the KV it holds once prefilled, and the decode steps it has left."""
        steps = self.predicted_output_len(request) - request.generated - (0 if decoding else 1)
        return request.held + request.extend, max(steps, 0.0)

    def open_round(self, state: CacheState) -> AdmissionRound:
        occupants = [self.occupant(request, True) for request in state.running]
        occupants += [self.occupant(request, False) for request in state.prefilling]
        capacity = state.free + sum(request.held for request in itertools.chain(state.running, state.prefilling))
        charged = sum(admitted_charge(0, self.asked_max_new_tokens(request)) for request in state.prefilling)
        return PeakRound(self, state.free, charged, capacity, occupants)


class PeakRound(ChargeRound):
    """A round of :class:`PeakAdmission`: SGLang's arithmetic, and the peak gate before it."""

    def __init__(self, admission: PeakAdmission, free: float, charged: float, capacity: float,
                 occupants: List[Tuple[float, float]]) -> None:
        super().__init__(admission, free, charged)
        self.capacity, self.occupants = capacity, occupants

    def fits(self, request: KVRequest) -> bool:
        """Whether the future peak with the request stays within the cache (the gate the plugin adds to SGLang's)."""
        return future_peak(self.occupants + [self.admission.occupant(request, False)]) <= self.capacity

    def add(self, request: KVRequest) -> None:
        """Count an admitted request in the peak of the rest of the round."""
        self.occupants.append(self.admission.occupant(request, False))

    def admit(self, request: KVRequest) -> bool:
        if not self.fits(request) or not super().admit(request):
            return False
        self.add(request)
        return True


class PastFutureAdmission(PeakAdmission):
    """The future peak without predictions (LightLLM's ``PastFutureQueue``): every end from the history."""

    knobs = ()  # no quantiles read

    def predicted_output_len(self, request: KVRequest) -> float:
        return super().predicted_output_len(request._replace(predicted_output_len=None, predicted_output_quantiles=None))


class DecodePreallocAdmission(Admission):
    """SGLang 0.5.23's disaggregated decode instance (``DecodePreallocQueue``, page size 1, no radix cache).

    A transferred request's prompt KV is pre-allocated, in queue order (``pop_preallocated``), when
    ``max(prompt + R, prompt + min(max_new_tokens, CLIP) - retractable)`` is at most the allocatable
    tokens, ``free - max(R x active requests, the most any running request still needs beyond the KV
    all running ones hold)`` (``_required_admission_tokens``, ``_allocatable_token_budgets``): R is
    ``num_reserved_decode_tokens``, retractable the prompt + output tokens of the running requests.
    Nothing is charged for the output beyond that, so the cache can overflow, and the decode batch
    retracts as a colocated one does. A retracted request resumes from its KV backup first
    (``resume_retracted_reqs``, :meth:`open_resume_round`): its KV + R against ``free - R x active``,
    and no prompt is pre-allocated while one waits.
    """

    def __init__(self, reserved_per_request: int = NUM_RESERVED_DECODE_TOKENS) -> None:
        self.reserved_per_request = reserved_per_request

    def open_round(self, state: CacheState) -> AdmissionRound:
        """A ``pop_preallocated`` round: ``state.prefilling`` are the other active requests (resumed, not yet running)."""
        # a running request holds prompt + output but the last token: retractable counts the last token too
        retractable = sum(request.held + 1 for request in state.running)
        # the prompt and clipped max_new_tokens of the running request that needs most, beyond what all hold
        need_single = max((request.held + 1 - request.generated + min(request.max_new_tokens, CLIP_MAX_NEW_TOKENS)
                           for request in state.running), default=retractable) - retractable
        return PreallocRound(self, state.free, len(state.running) + len(state.prefilling), need_single, retractable)

    def open_resume_round(self, state: CacheState) -> AdmissionRound:
        """A ``resume_retracted_reqs`` round: no running request's own need, nothing against the retractable KV."""
        return PreallocRound(self, state.free, len(state.running) + len(state.prefilling), 0, None)


class PreallocRound(AdmissionRound):
    """A round of :class:`DecodePreallocAdmission`; a request's ``extend`` is the KV it is allocated (a
    transferred prompt, or a retracted request's prompt + output but the last token)."""

    def __init__(self, admission: DecodePreallocAdmission, free: float, active: int, need_single: int,
                 retractable: Optional[int]) -> None:
        self.admission, self.free, self.active = admission, free, active
        self.need_single, self.retractable = need_single, retractable

    def admit(self, request: KVRequest) -> bool:
        reserved = self.admission.reserved_per_request
        required = request.extend + reserved
        if self.retractable is not None:  # a new prompt: room for its own output beyond what could be retracted
            required = max(required, request.extend + min(request.max_new_tokens, CLIP_MAX_NEW_TOKENS) - self.retractable)
        if required > self.free - max(reserved * self.active, self.need_single):
            return False
        self.free -= request.extend  # allocated; one more active request reserves its share
        self.active += 1
        return True


class BlockRules(Protocol):
    """A vLLM version's admission arithmetic (``simulation.vllm_admission.VLLMRules``)."""

    def blocks_for(self, tokens): ...

    def admits(self, tokens: int, budget: int, free_blocks: int, watermark: int, any_running: bool) -> bool: ...


class VLLMAdmission(Admission):
    """vLLM v1's ``Scheduler.schedule`` waiting loop: nothing reserved ahead, blocks and step tokens only."""

    def __init__(self, rules: BlockRules, watermark_blocks: int) -> None:
        self.rules, self.watermark_blocks = rules, watermark_blocks

    def open_round(self, state: CacheState) -> AdmissionRound:
        return BlockRound(self, int(state.free), state.step_tokens, state.any_running)


class BlockRound(AdmissionRound):
    """A round of :class:`VLLMAdmission`: an admitted request takes its first chunk's blocks and step tokens."""

    def __init__(self, admission: VLLMAdmission, free_blocks: int, step_tokens: int, any_running: bool) -> None:
        self.admission, self.free_blocks, self.step_tokens, self.any_running = (admission, free_blocks, step_tokens,
                                                                                any_running)

    def admit(self, request: KVRequest) -> bool:
        rules = self.admission.rules
        if not rules.admits(request.extend, self.step_tokens, self.free_blocks, self.admission.watermark_blocks,
                            self.any_running):
            return False
        chunk = min(request.extend, self.step_tokens)
        self.free_blocks -= rules.blocks_for(chunk)
        self.step_tokens -= chunk
        self.any_running = True
        return True

    @property
    def exhausted(self) -> bool:
        return self.step_tokens <= 0


def create_admission(kv_admission: KVAdmission, config: SchedulingConfig, kv_margin: float = DEFAULT_KV_MARGIN,
                     kv_quantile: float = DEFAULT_KV_QUANTILE, block_rules: Optional[BlockRules] = None,
                     watermark_blocks: int = 0, history: Optional[OutputLengthHistory] = None,
                     decode_only: bool = False) -> Admission:
    """The strategy of a rule: ``kv_margin`` for ``predicted``, ``kv_quantile`` for ``quantile`` and ``peak``, the
    instance's ``history`` of output lengths for ``peak`` and ``past-future`` (a new one if None), a vLLM
    version's ``block_rules`` and ``watermark_blocks`` for ``vllm`` and ``vllm-0.13``; ``decode_only``: the
    instance is a disaggregated decode instance (``sglang`` is then SGLang's pre-allocation rule)."""
    if kv_admission is KVAdmission.SGLANG:
        return DecodePreallocAdmission() if decode_only else SGLangAdmission()
    if kv_admission is KVAdmission.PREDICTED:
        return PredictedChargeAdmission(kv_margin, config)
    if kv_admission is KVAdmission.QUANTILE:
        return QuantileChargeAdmission(kv_quantile, config)
    if kv_admission in PEAK_ADMISSIONS:
        kind = PeakAdmission if kv_admission is KVAdmission.PEAK else PastFutureAdmission
        return kind(kv_quantile, config, OutputLengthHistory() if history is None else history)
    if kv_admission in VLLM_ADMISSIONS:
        if block_rules is None:
            raise ValueError(f"kv admission {kv_admission.value} needs a vLLM version's block rules")
        return VLLMAdmission(block_rules, watermark_blocks)
    raise ValueError(f"kv admission {kv_admission.value} has no admission round (the simulator reserves per request)")


# The strategy of each rule the factory builds (max-new-tokens has none: the simulator reserves per request), whose
# ``knobs`` say what the rule reads
RULE_STRATEGIES = {
    KVAdmission.SGLANG: SGLangAdmission, KVAdmission.PREDICTED: PredictedChargeAdmission,
    KVAdmission.QUANTILE: QuantileChargeAdmission, KVAdmission.PEAK: PeakAdmission,
    KVAdmission.PAST_FUTURE: PastFutureAdmission, KVAdmission.VLLM: VLLMAdmission, KVAdmission.VLLM_0_13: VLLMAdmission,
}


def rule_knobs(kv_admission: KVAdmission) -> Tuple[Knob, ...]:
    """The knobs a rule reads: its strategy's."""
    strategy = RULE_STRATEGIES.get(kv_admission)
    return () if strategy is None else strategy.knobs


def kv_knob_values(kv_admission: KVAdmission, given: Mapping[str, Any], setting: Callable[[str], str],
                   rule_setting: str, chosen: str) -> Dict[str, float]:
    """Every knob's value by name: the ``given`` ones (by knob name; None: not given) checked, the others their default.

    The one check of the plugin's flags and the simulator's cluster file: a value out of range, or a knob given to
    a rule that does not read it (refused rather than ignored), raises ValueError with one line that names the
    setting (``setting(name)``: the plugin's variable and flag, the cluster file's field) and the fix.
    ``rule_setting`` names the rule's own setting (``--outlets-kv-admission``, ``kv_admission``); ``chosen`` says how
    ``kv_admission`` was chosen (named, or left to :data:`DEFAULT_KV_ADMISSION`).
    """
    values = {}
    for knob in KNOBS:
        raw = given.get(knob.name)
        if raw is None:
            values[knob.name] = knob.default
            continue
        try:
            values[knob.name] = knob.parse(raw)
        except ValueError as error:
            raise ValueError(f"{setting(knob.name)}={raw!r}: {error}") from None
        if knob not in rule_knobs(kv_admission):
            readers = " or ".join(rule.value for rule in KVAdmission if knob in rule_knobs(rule))
            raise ValueError(f"{setting(knob.name)} is read by {rule_setting} {readers}, not by {chosen}: leave it "
                             f"out or use {rule_setting} {readers}")
    return values
