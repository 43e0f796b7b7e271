"""Predictor-only mode (``--outlets-draft-path``, an `outlets export` directory) on a real SGLang 0.5.23
CPU server (serve environment). The export and the offline reference come from the training
environment (.venv, SpecForge) through tests/sglang_harness/offline_reference.py.
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("sglang", reason="SGLang tests run in the serve environment (make test)")

from tests.sglang_harness.offline_reference import PROMPTS, offline_r0  # noqa: E402
from tests.sglang_harness.server import start_server  # noqa: E402

PRIOR = 256.0
FAIL_PROMPT = [3, 3, 3, 3]  # the harness makes the draft raise for prompts starting with these ids


@pytest.fixture(scope="module")
def server(chat_target, outlets_export, tmp_path_factory):
    server = start_server(chat_target, str(tmp_path_factory.mktemp("predictor-log")),
                          ["--schedule-policy", "outlets", "--outlets-draft-path", outlets_export,
                           "--disable-radix-cache", "--dtype", "float32"], fail_prompt=FAIL_PROMPT)
    yield server
    server.stop()


def test_r0_equals_the_offline_prediction_of_the_export(server, chat_target, outlets_export, tmp_path):
    served = []
    for prompt in PROMPTS:
        response = server.generate(input_ids=prompt, max_new_tokens=2)
        served.append((prompt, response["output_ids"][0], response["meta_info"]["predicted_output_len"]))
    offline = offline_r0(outlets_export, chat_target, served, str(tmp_path))
    for (prompt, first, value), reference in zip(served, offline):
        # Same prompt, same first token; float32 on both sides. meta_info rounds to 3 decimals.
        assert value == pytest.approx(reference, rel=1e-4, abs=2e-3), (prompt, first, value, reference)
    assert len({round(v) for _, _, v in served}) == len(served)  # the draft does see the prompt
    assert re.search(r"OUTLETS predictor: mode=predictor-only \(OUTLETS draft .*hooks applied: (\d+)/\1",
                     server.log_text())


def test_predictor_failure_falls_back_to_the_prior_and_keeps_serving(server):
    body = {"input_ids": FAIL_PROMPT + PROMPTS[0], "rid": "fail-me-1",
            "sampling_params": {"max_new_tokens": 2, "temperature": 0, "ignore_eos": True}}
    response = server.post("/generate", body)
    assert response["meta_info"]["completion_tokens"] == 2
    assert response["meta_info"]["predicted_output_len"] == PRIOR
    assert re.search(r"OUTLETS prediction failed for request fail-me-1 .*injected failure.*failures so far: \d+",
                     server.log_text())
    # the next request is predicted again
    response = server.generate(input_ids=PROMPTS[1], max_new_tokens=2)
    assert response["meta_info"]["predicted_output_len"] != PRIOR


def test_external_prediction_takes_precedence_over_the_draft(server):
    response = server.generate(input_ids=PROMPTS[0], max_new_tokens=2, predicted_output_len=9)
    assert response["meta_info"]["predicted_output_len"] == 9.0
