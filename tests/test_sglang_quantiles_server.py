"""Predicted length distributions on a real SGLang 0.5.23 CPU server (serve environment, `make test`; issue 27).

One predictor-only server whose `outlets export` has a quantile head at levels 0.1, 0.5, 0.9 (not the
default levels, so that the test sees the draft's levels in use), ordering by the Gittins rank
(``--outlets-order sjf --outlets-order-key gittins``, no aging) and admitting by the 0.9 quantile
(``--outlets-kv-admission quantile --outlets-kv-quantile 0.9``):

- (a) the draft's quantiles come back in ``meta_info.predicted_output_quantiles``: finite,
  non-decreasing, equal to the export's offline quantiles (training environment, SpecForge);
- (b) waiting requests whose client-sent quantiles share a median but differ in spread are admitted
  in the order of the core's key (one request runs at a time, so queue order = completion order);
  the point key would keep them in arrival order, the mean or risk key would put the widest last;
- a client's quantiles at other levels than the draft's are refused naming the request.
"""

from __future__ import annotations

import re
import urllib.error

import pytest

pytest.importorskip("sglang", reason="SGLang tests run in the serve environment (make test)")

from specforge_outlets.scheduling import SchedulingConfig, sjf_sort_key  # noqa: E402
from tests.sglang_harness.offline_reference import PROMPTS, in_training_env, offline_quantiles  # noqa: E402
from tests.sglang_harness.server import completion_order, start_server  # noqa: E402

LEVELS = (0.1, 0.5, 0.9)
PROMPT = "hello world the quick brown fox"
# The blocker runs (one request at a time) while the burst queues behind it; 400 tokens as in test_sglang_server.py.
BLOCKER = {"text": PROMPT + " blocker", "max_new_tokens": 400, "predicted_output_len": 5000}
# Total-length quantiles at LEVELS, every median 200 tokens, in arrival order (neither sorted by any key nor reversed).
BURST = {
    "narrow": (180.0, 200.0, 220.0),
    "hightail": (150.0, 200.0, 2000.0),
    "medium": (100.0, 200.0, 400.0),
    "wide": (10.0, 200.0, 4000.0),
    "mid": (60.0, 200.0, 700.0),
    "lowtail": (20.0, 200.0, 300.0),
}


@pytest.fixture(scope="module")
def quantile_export(chat_target, tmp_path_factory) -> str:
    """A seeded random `outlets export` with a quantile head at LEVELS, made in the training environment."""
    return in_training_env("export", chat_target, str(tmp_path_factory.mktemp("quantile-export") / "draft"),
                           ",".join(str(level) for level in LEVELS))


@pytest.fixture(scope="module")
def server(chat_target, quantile_export, tmp_path_factory):
    server = start_server(chat_target, str(tmp_path_factory.mktemp("quantiles-log")),
                          ["--schedule-policy", "outlets", "--outlets-draft-path", quantile_export,
                           "--disable-radix-cache", "--dtype", "float32", "--max-running-requests", "1",
                           "--outlets-order", "sjf", "--outlets-order-key", "gittins",
                           "--outlets-aging-tokens-per-s", "0", "--outlets-kv-admission", "quantile",
                           "--outlets-kv-quantile", "0.9"])
    yield server
    server.stop()


def key_order(order_key: str) -> list:
    """The burst's names in the order of the core's SJF key ``order_key`` (ties by arrival, as the queue breaks them)."""
    config = SchedulingConfig(order_key=order_key, aging_tokens_per_s=0.0, quantile_levels=LEVELS)
    keys = {name: sjf_sort_key(200.0, 0, float(arrival), config, quantiles)
            for arrival, (name, quantiles) in enumerate(BURST.items())}
    return sorted(keys, key=keys.get)


def test_the_drafts_quantiles_come_back_in_meta_info(server, chat_target, quantile_export, tmp_path):
    served = []
    for prompt in PROMPTS:
        # without ignore_eos: the request is admitted by its 0.9 quantile (the tiny target rarely ends a turn)
        response = server.generate(input_ids=prompt, max_new_tokens=2, ignore_eos=False)
        meta = response["meta_info"]
        served.append((prompt, response["output_ids"][0], meta["predicted_output_quantiles"],
                       meta["predicted_output_len"]))
    for _, _, quantiles, _ in served:
        assert len(quantiles) == len(LEVELS) and all(isinstance(value, float) for value in quantiles), quantiles
        assert all(value == value and 0 <= value < float("inf") for value in quantiles), quantiles
        assert quantiles == sorted(quantiles), quantiles
    offline = offline_quantiles(quantile_export, chat_target, served, str(tmp_path))
    for (prompt, first, quantiles, _), reference in zip(served, offline):
        # same prompt and first token, float32 on both sides; meta_info rounds to 3 decimals
        assert quantiles == pytest.approx(reference, rel=1e-4, abs=2e-3), (prompt, first, quantiles, reference)
    assert len({tuple(round(v) for v in quantiles) for _, _, quantiles, _ in served}) == len(served)  # prompt-dependent
    log = server.log_text()
    assert re.search(r"OUTLETS schedule-policy: mode=predictor-only .*order=sjf \(.*order_key=gittins, "
                     r"quantile_levels=0\.1,0\.5,0\.9\), kv_admission=quantile \(kv_quantile=0\.9\), "
                     r"prior_output_len=256, hooks applied: (\d+)/\1", log), log[-3000:]


def test_waiting_requests_are_admitted_in_the_order_of_the_gittins_key(server):
    expected = key_order("gittins")
    # the test can tell the keys apart: arrival order (the point key, every median equal), mean and risk differ
    assert expected != list(BURST) and expected != key_order("point") == list(BURST)
    assert expected != key_order("mean") and expected != key_order("risk")
    requests = [BLOCKER] + [{"text": f"{PROMPT} {name}", "max_new_tokens": 2,
                             "custom_params": {"outlets_predicted_quantiles": list(quantiles)}}
                            for name, quantiles in BURST.items()]
    results = server.burst(requests, gap_s=0.05)
    # the precondition: everything queued while the blocker was running
    assert results[0]["done"] > max(result["sent"] for result in results[1:]) + 0.05, "blocker finished too early"
    order = completion_order(results)
    assert order[0] == 0
    names = list(BURST)
    assert [names[index - 1] for index in order[1:]] == expected
    for (name, quantiles), result in zip(BURST.items(), results[1:]):
        meta = result["response"]["meta_info"]
        # the client's quantiles win over the draft's, and the point prediction is their median
        assert meta["predicted_output_quantiles"] == list(quantiles) and meta["predicted_output_len"] == 200.0, name


def test_quantiles_at_other_levels_than_the_drafts_are_refused_naming_the_request(server):
    body = {"text": PROMPT, "rid": "five-levels",
            "sampling_params": {"max_new_tokens": 2,
                                "custom_params": {"outlets_predicted_quantiles": [10, 20, 30, 40, 50]}}}
    with pytest.raises(urllib.error.HTTPError) as error:
        server.post("/generate", body)
    message = error.value.read().decode()
    assert error.value.code == 400, message
    assert "request five-levels: outlets_predicted_quantiles" in message and "0.1,0.5,0.9" in message, message
    # and the server goes on serving, the labels' form included
    response = server.post("/generate", {"text": PROMPT, "custom_labels": {"outlets_predicted_quantiles": "5,8,13"},
                                         "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    assert response["meta_info"]["predicted_output_quantiles"] == [5.0, 8.0, 13.0]
