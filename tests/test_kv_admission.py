"""The scheduling core's KV admission strategies (``specforge_outlets.scheduling.kv_admission``), one rule each.

That they decide as SGLang's ``PrefillAdder`` (with and without the plugin's hooks) and vLLM's
``Scheduler`` do is tested against those engines' code (tests/test_sglang_admission.py,
tests/test_vllm_admission_against_vllm.py); here, each rule's arithmetic on hand-computed cases.
"""

import random

import pytest

from specforge_outlets.scheduling import (
    CLIP_MAX_NEW_TOKENS,
    CacheState,
    KVAdmission,
    KVRequest,
    OutputLengthHistory,
    PastFutureAdmission,
    PeakAdmission,
    PredictedChargeAdmission,
    QuantileChargeAdmission,
    SchedulingConfig,
    SGLangAdmission,
    VLLMAdmission,
    create_admission,
    future_peak,
    kv_knob_values,
    rule_knobs,
)
from specforge_outlets.simulation.vllm_admission import VLLM_0_13, VLLM_0_34

CONFIG = SchedulingConfig()


def test_sglang_charges_running_requests_a_share_of_their_remaining_max_new_tokens():
    admission = SGLangAdmission()
    running = [KVRequest(0, 10, 110), KVRequest(0, 0, 9000)]  # 100 left x 0.5; the clip, 4096 x 0.5
    round_ = admission.open_round(CacheState(3000.0, running, ratio=0.5))
    assert round_.free - round_.charged == 3000 - 50 - CLIP_MAX_NEW_TOKENS * 0.5 == 902
    assert round_.admit(KVRequest(200, 0, 300))  # needs 200 + 300 + 1 = 501 < 902: charged 501
    assert not round_.admit(KVRequest(100, 0, 300))  # needs 401, 401 left: not strictly below
    assert round_.admit(KVRequest(99, 0, 300)) and not round_.exhausted  # needs 400 < 401, charged 400: 1 left
    assert round_.free - round_.charged == 1


def test_sglang_charges_a_retracted_request_its_whole_max_new_tokens_once_admitted():
    round_ = SGLangAdmission().open_round(CacheState(402.0))
    assert round_.admit(KVRequest(150, 50, 300))  # 100 prompt + 50 recomputed; needs 150 + 250 + 1 = 401
    assert round_.charged == 150 + 1 + 300 and round_.exhausted  # more than was free: the round ends
    prefilling = SGLangAdmission().open_round(CacheState(1000.0, prefilling=[KVRequest(0, 0, 300)]))
    assert prefilling.charged == 301  # a prompt still prefilling: its whole max_new_tokens, charged at admission


def test_the_plugins_margin_charges_the_predicted_remaining_where_sglang_charges_max_new_tokens():
    admission = PredictedChargeAdmission(0.2, CONFIG)
    assert admission.output_budget(KVRequest(0, 100, 1024, 300.0)) == 240  # 200 left x 1.2
    assert admission.output_budget(KVRequest(0, 100, 250, 300.0)) == 150  # at most what is left of max_new_tokens
    assert admission.output_budget(KVRequest(0, 100, 9000, 9000.0)) == CLIP_MAX_NEW_TOKENS  # and of SGLang's clip
    assert admission.output_budget(KVRequest(0, 100, 1024)) is None  # no prediction: SGLang's charge
    assert admission.output_budget(KVRequest(0, 100, 1024, 300.0, ignore_eos=True)) is None
    running = [KVRequest(0, 100, 1024, 300.0), KVRequest(0, 100, 1024)]
    assert admission.open_round(CacheState(5000.0, running, ratio=0.5)).charged == 240 + 924 * 0.5  # no ratio on 240
    assert admission.asked_max_new_tokens(KVRequest(50, 0, 1024, 100.0)) == 120
    round_ = admission.open_round(CacheState(5000.0))
    assert round_.admit(KVRequest(50, 0, 1024, 100.0)) and round_.charged == 50 + 1 + 120


def test_the_plugins_quantile_charges_a_quantile_of_the_remaining_length():
    config = SchedulingConfig(quantile_levels=(0.1, 0.5, 0.9))
    admission = QuantileChargeAdmission(0.9, config)
    wide = KVRequest(0, 0, 4000, 200.0, (50.0, 200.0, 1200.0))
    sure = KVRequest(0, 0, 4000, 200.0, (190.0, 200.0, 210.0))
    assert admission.output_budget(wide) > 1000 > 300 > admission.output_budget(sure) >= 200
    assert admission.output_budget(KVRequest(0, 150, 4000, 200.0)) == 50  # a point: the predicted remaining


def test_vllm_admits_while_the_blocks_of_the_whole_sequence_or_v013s_first_chunk_are_free():
    state = CacheState(10, step_tokens=200, any_running=True)  # 10 free blocks
    whole = VLLMAdmission(VLLM_0_34, watermark_blocks=0).open_round(state)
    assert whole.admit(KVRequest(640, 0, 100)) and whole.free_blocks == 10 - 4  # 200 tokens of its chunk: 4 blocks
    assert whole.step_tokens == 0 and whole.exhausted
    assert not VLLMAdmission(VLLM_0_34, 0).open_round(state).admit(KVRequest(641, 0, 100))  # 11 blocks
    first_chunk = CacheState(10, step_tokens=160, any_running=True)
    assert VLLMAdmission(VLLM_0_13, 0).open_round(first_chunk).admit(KVRequest(5000, 0, 100))  # 10 blocks of 16
    assert not VLLMAdmission(VLLM_0_34, 0).open_round(first_chunk).admit(KVRequest(5000, 0, 100))
    assert not VLLMAdmission(VLLM_0_34, 1).open_round(state).admit(KVRequest(640, 0, 100))  # a watermark block


def test_the_factory_gives_each_rule_its_strategy():
    assert type(create_admission(KVAdmission.SGLANG, CONFIG)) is SGLangAdmission
    assert create_admission(KVAdmission.PREDICTED, CONFIG, kv_margin=0.3).kv_margin == 0.3
    assert create_admission(KVAdmission.QUANTILE, CONFIG, kv_quantile=0.8).kv_quantile == 0.8
    assert create_admission(KVAdmission.VLLM_0_13, CONFIG, block_rules=VLLM_0_13).rules is VLLM_0_13
    with pytest.raises(ValueError, match="block rules"):
        create_admission(KVAdmission.VLLM, CONFIG)
    with pytest.raises(ValueError, match="reserves per request"):
        create_admission(KVAdmission.MAX_NEW_TOKENS, CONFIG)


def test_each_rule_declares_the_knobs_its_strategy_reads():
    knobs = {rule.value: [knob.name for knob in rule_knobs(rule)] for rule in KVAdmission}
    assert knobs == {"max-new-tokens": [], "predicted": ["kv_margin"], "sglang": [], "vllm": [], "vllm-0.13": [],
                     "quantile": ["kv_quantile"], "peak": ["kv_quantile"], "past-future": []}
    # what the factory builds reads them: past-future's peak has no quantiles to read a level of
    quantiles = (10.0, 20.0, 30.0, 40.0, 50.0)
    request = KVRequest(0, 0, 1000, 30.0, quantiles)
    past_future = [create_admission(KVAdmission.PAST_FUTURE, CONFIG, kv_quantile=level) for level in (0.1, 0.9)]
    assert past_future[0].predicted_output_len(request) == past_future[1].predicted_output_len(request)
    assert (create_admission(KVAdmission.PEAK, CONFIG, kv_quantile=0.1).predicted_output_len(request)
            < create_admission(KVAdmission.PEAK, CONFIG, kv_quantile=0.9).predicted_output_len(request))


def knob_values(rule, **given):
    return kv_knob_values(rule, given, lambda name: f"field {name}", "rule", f"rule {rule.value}")


def test_one_check_of_the_knobs_gives_defaults_and_refuses_what_the_rule_does_not_read():
    assert knob_values(KVAdmission.PEAK) == {"kv_margin": 0.2, "kv_quantile": 0.9}
    assert knob_values(KVAdmission.PREDICTED, kv_margin="0.5") == {"kv_margin": 0.5, "kv_quantile": 0.9}
    assert knob_values(KVAdmission.QUANTILE, kv_margin=None, kv_quantile=0.5) == {"kv_margin": 0.2, "kv_quantile": 0.5}
    for rule, given, message in (
        (KVAdmission.PREDICTED, {"kv_margin": -1}, "field kv_margin=-1: give a number >= 0"),
        (KVAdmission.PREDICTED, {"kv_margin": "inf"}, "field kv_margin='inf': give a number >= 0"),
        (KVAdmission.PEAK, {"kv_quantile": True}, "field kv_quantile=True: give a level strictly between 0 and 1, "
                                                  "e.g. 0.9"),
        (KVAdmission.PEAK, {"kv_margin": 0.1}, "field kv_margin is read by rule predicted, not by rule peak: leave it "
                                               "out or use rule predicted"),
        (KVAdmission.PAST_FUTURE, {"kv_quantile": 0.5}, "field kv_quantile is read by rule quantile or peak, not by "
                                                        "rule past-future: leave it out or use rule quantile or peak"),
    ):
        with pytest.raises(ValueError) as refusal:
            knob_values(rule, **given)
        assert str(refusal.value) == message


# --- the future peak ------------------------------------------------------------------------------


def brute_force_peak(occupants) -> float:
    """The most held at once, step by step: each holds h + t at step t <= r."""
    steps = int(max((r for _, r in occupants), default=0))
    return max((sum(h + t for h, r in occupants if t <= r) for t in range(steps + 1)), default=0.0)


def test_the_future_peak_is_the_most_held_at_once_step_by_step():
    assert future_peak([(100, 10), (50, 3)]) == 150 + 2 * 3 == brute_force_peak([(100, 10), (50, 3)])
    assert future_peak([(1000, 0), (10, 50)]) == 1010  # what they hold now: a prompt about to finish
    assert future_peak([]) == 0
    rng = random.Random(0)
    for _ in range(200):
        occupants = [(rng.randint(0, 300), rng.randint(0, 60)) for _ in range(rng.randint(1, 8))]
        assert future_peak(occupants) == brute_force_peak(occupants), occupants


def test_the_history_reads_the_expected_remaining_length_given_survival():
    history = OutputLengthHistory(window=3)
    assert history.mean_remaining(10, 500) == 490  # nothing seen: what is left of max_new_tokens
    for length in (10, 20, 30, 40):  # the window keeps the last three
        history.record(length)
    assert len(history) == 3
    assert history.mean_remaining(0, 100) == (20 + 30 + 40 + 100) / 4
    assert history.mean_remaining(25, 100) == (30 + 40 + 100) / 3 - 25  # longer than 25 only, and the cap
    assert history.mean_remaining(50, 100) == 50  # outlived all of them: what is left of max_new_tokens


def test_the_peak_reads_each_requests_end_from_its_prediction_then_from_the_history():
    history = OutputLengthHistory()
    for length in (100, 300):
        history.record(length)
    config = SchedulingConfig(quantile_levels=(0.1, 0.5, 0.9))
    peak = PeakAdmission(0.9, config, history)
    assert peak.predicted_output_len(KVRequest(0, 50, 1000, 200.0)) == 200  # the prediction (the oracle: the truth)
    outlived = KVRequest(0, 250, 1000, 200.0)  # past its prediction: predicted again, not charged nothing
    assert peak.predicted_output_len(outlived) == 250 + history.mean_remaining(250, 1000) == 650
    assert peak.predicted_output_len(KVRequest(0, 0, 150, 200.0)) == 150  # never past max_new_tokens
    assert peak.predicted_output_len(KVRequest(0, 0, 1000, 20.0, ignore_eos=True)) == 1000
    wide = KVRequest(0, 0, 5000, 200.0, (50.0, 200.0, 1200.0))
    assert peak.predicted_output_len(wide) > PeakAdmission(0.5, config, history).predicted_output_len(wide) > 150  # the risk
    assert peak.predicted_output_len(wide._replace(generated=3000)) == 3000 + history.mean_remaining(3000, 5000)
    past_future = PastFutureAdmission(0.9, config, history)
    assert past_future.predicted_output_len(KVRequest(0, 50, 1000, 200.0)) == 50 + history.mean_remaining(50, 1000)


def test_the_peak_admits_while_the_future_peak_with_the_request_fits_the_cache():
    peak = PeakAdmission(0.9, CONFIG, OutputLengthHistory())
    running = [KVRequest(0, 10, 1000, 110.0, held=400)]  # holds 400, 100 steps left: 500 at its end
    free = 600.0  # a cache of 1,000
    # a 300-token prompt that ends after 50 tokens: 49 steps after its prefill; peak 400 + 49 + 300 + 49 = 798
    first = KVRequest(300, 0, 1000, 50.0)
    round_ = peak.open_round(CacheState(free, running))
    assert round_.capacity == 1000 and round_.charged == 0  # nothing charged ahead
    assert round_.admit(first) and round_.occupants[-1] == (300, 49)
    # a prompt of 160 that ends after 100 tokens (99 steps): when the first ends (step 49) the three hold
    # 400 + 49, 160 + 49 and 300 + 49: 1,007; with a prompt of 150, 997
    assert not round_.admit(KVRequest(160, 0, 1000, 100.0))
    assert round_.admit(KVRequest(150, 0, 1000, 100.0)) and not round_.exhausted
    assert round_.charged == 301 + 151  # SGLang's arithmetic: each prompt and its page, no output
    long_prompt = peak.open_round(CacheState(600.0, running))  # a prompt that fits the peak but not the cache now
    assert not long_prompt.admit(KVRequest(600, 0, 1000, 1.0))  # 600 + 1 page is not below 600 free


def test_past_future_and_peak_come_from_the_factory_with_the_instances_history():
    history = OutputLengthHistory()
    peak = create_admission(KVAdmission.PEAK, CONFIG, kv_quantile=0.8, history=history)
    assert type(peak) is PeakAdmission and peak.kv_quantile == 0.8 and peak.history is history
    assert type(create_admission(KVAdmission.PAST_FUTURE, CONFIG)) is PastFutureAdmission


def test_a_prompt_still_being_prefilled_in_chunks_counts_in_the_peak():
    """SGLang's chunked request (``CacheState.prefilling``): it holds the KV of its chunks so far, grows to its
    whole prompt, then a token a step to its predicted end; without a prediction, the history's (before any
    request finished, its max_new_tokens)."""
    history = OutputLengthHistory()
    peak = PeakAdmission(0.9, CONFIG, history)
    running = [KVRequest(0, 10, 1000, 110.0, held=400)]  # holds 400, 100 steps left
    # a 300-token prompt, 120 prefilled, 180 to go, no prediction: to max_new_tokens 100, 99 steps after its prefill
    chunked = KVRequest(180, 0, 100, held=120)
    free = 1000.0 - 400 - 120  # a cache of 1,000
    with_chunked = peak.open_round(CacheState(free, running, [chunked]))
    assert with_chunked.capacity == 1000 and with_chunked.occupants == [(400, 100), (300, 99)]
    assert future_peak(with_chunked.occupants) == 400 + 300 + 2 * 99 == 898  # when it ends, at step 99
    without = peak.open_round(CacheState(free, running))  # before: its prefilled KV neither free nor counted
    assert without.capacity == 880 and future_peak(without.occupants) == 500
    # a waiting prompt of h tokens ending after 50 (49 steps): with the chunked request the peak is at its end,
    # 400 + 300 + h + 3 x 49, within 1,000 up to h = 153; without it, 400 + h + 2 x 49 within 880 up to h = 382
    assert with_chunked.fits(KVRequest(153, 0, 1000, 50.0)) and without.fits(KVRequest(382, 0, 1000, 50.0))
    assert not peak.open_round(CacheState(free, running, [chunked])).admit(KVRequest(154, 0, 1000, 50.0))
    assert peak.open_round(CacheState(free, running)).admit(KVRequest(154, 0, 1000, 50.0))  # fitted without it
    assert with_chunked.admit(KVRequest(153, 0, 1000, 50.0)) and with_chunked.charged == 1 + 154  # SGLang's pages
    # its end from the history once requests finished (20 and 60: 60 expected of 100), or from its prediction
    for length in (20, 60):
        history.record(length)
    assert peak.open_round(CacheState(free, running, [chunked])).occupants[-1] == (300, 59)
    assert peak.open_round(CacheState(free, running, [chunked._replace(predicted_output_len=30.0)])).occupants[-1] == (300, 29)
