"""``--dp-size 2 --load-balance-method outlets`` on a real SGLang 0.5.23 CPU server (serve environment)."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("sglang", reason="SGLang tests run in the serve environment (make test)")

from specforge_outlets.model.tiny_chat_target import make_chat_target  # noqa: E402
from tests.sglang_harness.server import omp_bind_groups, start_server  # noqa: E402

PROMPT = "hello world the quick brown fox"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    target = make_chat_target(str(tmp_path_factory.mktemp("chat-target")))
    server = start_server(target, str(tmp_path_factory.mktemp("dp-log")),
                          ["--dp-size", "2", "--load-balance-method", "outlets", "--schedule-policy", "outlets"],
                          env={"SGLANG_CPU_OMP_THREADS_BIND": omp_bind_groups(2)})
    yield server
    server.stop()


def test_routes_to_fewest_requests_then_least_predicted_work(server):
    long_result = {}

    def long_request():
        long_result["response"] = server.generate(PROMPT + " long", max_new_tokens=300, predicted_output_len=2000)
        long_result["done"] = time.monotonic()

    thread = threading.Thread(target=long_request, daemon=True)
    thread.start()
    time.sleep(1.0)  # the long request is running and its rank's load snapshot says so
    # Two requests predicted short but running a while, then a probe. The first goes to the rank without
    # the long request (0 < 1 requests), the second too (1 request each: 10 << 2000 predicted left); the
    # probe goes to the long request's rank (1 < 2 requests), where least predicted work would send it to
    # the other (20 << 2000 - tokens generated so far).
    burst = server.burst([{"text": f"{PROMPT} medium {i}", "max_new_tokens": 150, "predicted_output_len": 10}
                          for i in range(2)] + [{"text": f"{PROMPT} probe", "max_new_tokens": 2,
                                                 "predicted_output_len": 10}], gap_s=0.05)
    thread.join(180)
    *mediums, probe = burst
    assert long_result["done"] > probe["sent"], "the long request finished too early"
    assert min(result["done"] for result in mediums) > probe["sent"], "a medium request finished too early"
    long_rank = long_result["response"]["meta_info"]["dp_rank"]
    medium_ranks = [result["response"]["meta_info"]["dp_rank"] for result in mediums]
    assert long_rank in (0, 1)
    assert medium_ranks == [1 - long_rank] * 2, (long_rank, medium_ranks)
    assert probe["response"]["meta_info"]["dp_rank"] == long_rank, (long_rank, medium_ranks)
    assert "OUTLETS load-balance-method" in server.log_text()


def test_requests_without_predictions_count_the_prior(server):
    # While the first unknown request (counted with the prior, 256) runs on one rank, the second
    # goes to the other, although fresh load snapshots arrive in between (gap > the controller's
    # 20 ms refresh). Both run long enough to overlap.
    time.sleep(1.0)  # the previous test's requests have finished and been reported
    responses = server.burst([{"text": f"{PROMPT} u{i}", "max_new_tokens": 100} for i in range(2)], gap_s=0.05)
    assert responses[0]["done"] > responses[1]["sent"], "the first request finished before the second was sent"
    assert sorted(r["response"]["meta_info"]["dp_rank"] for r in responses) == [0, 1]
