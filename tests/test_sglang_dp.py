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


def test_routes_by_predicted_work(server):
    long_result = {}

    def long_request():
        long_result["response"] = server.generate(PROMPT + " long", max_new_tokens=300, predicted_output_len=2000)
        long_result["done"] = time.monotonic()

    thread = threading.Thread(target=long_request, daemon=True)
    thread.start()
    time.sleep(1.0)  # the long request is running and its rank's load snapshot says so
    # Four short requests: round robin would alternate ranks; least predicted work sends all of
    # them to the rank without the long request (4 x 10 << 2000 - tokens generated so far).
    shorts = server.burst([{"text": f"{PROMPT} short {i}", "max_new_tokens": 2, "predicted_output_len": 10}
                           for i in range(4)], gap_s=0.05)
    thread.join(180)
    assert long_result["done"] > max(result["sent"] for result in shorts), "the long request finished too early"
    long_rank = long_result["response"]["meta_info"]["dp_rank"]
    short_ranks = [result["response"]["meta_info"]["dp_rank"] for result in shorts]
    assert long_rank in (0, 1)
    assert short_ranks == [1 - long_rank] * 4, (long_rank, short_ranks)
    assert "OUTLETS load-balance-method" in server.log_text()


def test_requests_without_predictions_count_the_prior(server):
    # While the first unknown request (counted with the prior, 256) runs on one rank, the second
    # goes to the other, although fresh load snapshots arrive in between (gap > the controller's
    # 20 ms refresh). Both run long enough to overlap.
    time.sleep(1.0)  # the previous test's requests have finished and been reported
    responses = server.burst([{"text": f"{PROMPT} u{i}", "max_new_tokens": 100} for i in range(2)], gap_s=0.05)
    assert responses[0]["done"] > responses[1]["sent"], "the first request finished before the second was sent"
    assert sorted(r["response"]["meta_info"]["dp_rank"] for r in responses) == [0, 1]
