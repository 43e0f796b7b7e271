"""EAGLE-3 mode on a real SGLang 0.5.23 CPU server (serve environment): speculative decoding runs an
``outlets export`` as its draft, and the plugin reads the length head on the draft states the EAGLE
worker computes (sglang_patches/speculative.py).

SGLang's EAGLE-3 worker needs two pieces on CPU with ``torch_native`` that only the test harness
supplies (tests/sglang_harness/README.md): torch references for the ``sgl_kernel`` CPU functions of
the speculative path (checked against SGLang's Triton kernels in test_sglang_kernel_reference.py)
and a harness plugin for the draft backend and the verify pass (``SGLangServer(eagle3_cpu=True)``).
The speculative flags are explicit: one draft step, a chain of one draft token (topk 1).

The export is a seeded random one (tests/sglang_harness/offline_reference.py), so drafts are rarely
accepted; acceptance with a trained draft is measured in benchmarks/eagle3_cpu.py. The offline
reference for every estimate is the training environment's forward of the same export over the
same tokens.
"""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("sglang", reason="SGLang tests run in the serve environment (make test)")

from tests.sglang_harness.offline_reference import PROMPTS, in_training_env  # noqa: E402
from tests.sglang_harness.server import start_server  # noqa: E402

NEW_TOKENS = 12
SPECULATIVE = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "1", "--speculative-eagle-topk", "1",
               "--speculative-num-draft-tokens", "2"]
COMMON = ["--disable-radix-cache", "--dtype", "float32"]


@pytest.fixture(scope="module")
def plain_outputs(chat_target, tmp_path_factory):
    """Greedy outputs of the same prompts without speculation (the server is stopped before EAGLE's starts)."""
    server = start_server(chat_target, str(tmp_path_factory.mktemp("plain-log")), COMMON)
    try:
        return [server.generate(input_ids=prompt, max_new_tokens=NEW_TOKENS)["output_ids"] for prompt in PROMPTS]
    finally:
        server.stop()


@pytest.fixture(scope="module")
def server(chat_target, outlets_export, plain_outputs, tmp_path_factory):
    server = start_server(chat_target, str(tmp_path_factory.mktemp("eagle3-log")),
                          ["--schedule-policy", "outlets", *COMMON, *SPECULATIVE,
                           "--speculative-draft-model-path", outlets_export], eagle3_cpu=True)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def served(server):
    """The prompts served at once (one batch), greedy."""
    results = server.burst([{"input_ids": prompt, "max_new_tokens": NEW_TOKENS} for prompt in PROMPTS], gap_s=0.0)
    return [result["response"] for result in results]


def test_speculative_greedy_output_equals_the_non_speculative_output(served, plain_outputs):
    assert [response["output_ids"] for response in served] == plain_outputs
    for response in served:
        meta = response["meta_info"]
        assert meta["spec_verify_ct"] >= NEW_TOKENS // 2  # the tokens came from verify steps
        assert meta["completion_tokens"] == NEW_TOKENS


def test_r0_and_the_latest_remaining_estimate_equal_the_offline_draft(served, chat_target, outlets_export, tmp_path):
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([{"prompt_ids": prompt, "output_ids": response["output_ids"]}
                                 for prompt, response in zip(PROMPTS, served)]))
    offline = json.loads(in_training_env("trajectory", outlets_export, chat_target, str(cases)))
    for response, trajectory in zip(served, offline):
        meta = response["meta_info"]
        # r̂_0: the state at the last prompt position, which reads the first token
        assert meta["predicted_output_len"] == pytest.approx(trajectory[0], rel=1e-4, abs=2e-3)
        # r̂_t: after the last verify step, read at the n-th output token; it counts that token
        n = meta["predicted_remaining_after"]
        assert 1 < n <= NEW_TOKENS
        expected = max(trajectory[n - 1] - 1, 0.0)
        assert meta["predicted_remaining_len"] == pytest.approx(expected, rel=1e-4, abs=2e-3), (n, trajectory)
    assert len({round(response["meta_info"]["predicted_output_len"]) for response in served}) == len(served)


def test_the_estimate_is_updated_while_the_request_decodes(server):
    chunks = server.stream({"input_ids": PROMPTS[0],
                            "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}})
    steps = [chunk["meta_info"].get("predicted_remaining_after") for chunk in chunks]
    seen = [step for step in steps if step is not None]
    assert len(set(seen)) >= 3 and seen == sorted(seen), steps  # a new estimate after each verify step
    assert len({chunk["meta_info"]["predicted_output_len"] for chunk in chunks}) == 1  # r̂_0 stays as it was


def test_start_up_log_names_eagle3_mode_and_every_hook_applied(server):
    log = server.log_text()
    assert re.search(r"OUTLETS eagle3: mode=EAGLE-3 .*hooks applied: (\d+)/\1", log)
    assert "OUTLETS prediction failed" not in log
