"""The plugin behind SGLang's own router (sglang-router 0.3.2, serve environment, `make test`).

One real CPU server with ``--schedule-policy outlets`` and one recording stand-in worker that reports a
fixed load, behind ``launch_router --policy power_of_two --worker-startup-check-interval 1``. With two
workers power_of_two compares both, so which one a request reaches says which load the router read:
the real server's ``GET /get_load`` (its predicted remaining work) against the stand-in's constant.
A real server whose ``/get_load`` failed would read -1 and win every comparison, busy or not.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("sglang", reason="SGLang tests run in the serve environment (make test)")
pytest.importorskip("sglang_router", reason="sglang-router is installed in the serve environment (make test)")

from specforge_outlets.loadgen.sglang_router import LOAD_POLL_INTERVAL_S, SGLangRouter  # noqa: E402
from specforge_outlets.loadgen.sglang_server import free_port  # noqa: E402
from tests.sglang_harness.server import start_server  # noqa: E402

PROMPT = "hello world the quick brown fox"
STAND_IN_LOAD = 1000  # num_tokens the stand-in reports: above an idle server's 0, below a busy one's
POLL_S = LOAD_POLL_INTERVAL_S
# the busy server: requests queued behind one running request (--max-running-requests 1), each
# predicted at 5,000 tokens and running BLOCKER_TOKENS (the tiny target's context is 512)
BLOCKERS, BLOCKER_TOKENS = 24, 400


class StandIn:
    """A worker the router accepts: healthy, a fixed ``/get_load``, and a record of every POST it receives."""

    def __init__(self) -> None:
        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _json(self, payload) -> None:
                body = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path.startswith("/get_load"):
                    return self._json([{"dp_rank": 0, "num_tokens": STAND_IN_LOAD}])
                return self._json({"model_path": "stand-in", "tokenizer_path": "stand-in", "is_generation": True})

            def do_POST(self):
                received.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0)))))
                return self._json({"text": "stand-in", "output_ids": [],
                                   "meta_info": {"completion_tokens": 0, "finish_reason": {"type": "stop"}}})

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()


def post(url: str, body: dict, timeout: float = 120) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def cluster(chat_target, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("router")
    server = start_server(chat_target, str(log_dir), ["--schedule-policy", "outlets", "--enable-custom-logit-processor",
                                                         "--max-running-requests", "1"])
    stand_in = StandIn()
    router = SGLangRouter(["--worker-urls", server.url, stand_in.url, "--policy", "power_of_two",
                           "--worker-startup-check-interval", str(POLL_S)], log_path=str(log_dir / "router.log"))
    try:
        router.start()
        time.sleep(3 * POLL_S)  # the first polls of both workers' loads
        yield server, stand_in, router.url
    finally:
        router.stop()
        stand_in.stop()
        server.stop()


def test_an_idle_outlets_server_wins_and_the_request_settings_survive_the_router(cluster, chat_target):
    """Prediction and end-at-length settings in custom_labels (`bench-serving --through-router`) reach the worker."""
    from specforge_outlets.loadgen.client import SamplingSettings, generate_payload
    from specforge_outlets.loadgen.workload import BenchRequest
    from specforge_outlets.model.tiny_chat_target import END_ID

    server, stand_in, url = cluster
    request = BenchRequest("r1", 0.0, 16, 5, text=PROMPT, predicted_output_len=42.0, end_token_id=END_ID)
    payload = dict(generate_payload(request, SamplingSettings(temperature=0.0), through_router=True), stream=False)
    assert "custom_params" not in payload["sampling_params"]
    for _ in range(4):  # four draws: a router that ignored the loads would send one to the stand-in (15 in 16)
        response = post(f"{url}/generate", payload)
        assert response["meta_info"]["predicted_output_len"] == 42.0
        assert len(response["output_ids"]) == 5 and response["meta_info"]["finish_reason"]["type"] == "stop"
    assert not stand_in.received, stand_in.received  # load 0 against 1000


def test_power_of_two_reads_the_predicted_work_from_get_load(cluster):
    """While the real server holds requests predicted at 5,000 tokens each (one runs, the rest wait) it reports
    far more than 1,000: the router sends new requests to the stand-in; once it is idle again, back to it."""
    server, stand_in, url = cluster
    blockers = [{"text": f"{PROMPT} blocker {index}",
                 "sampling_params": {"max_new_tokens": BLOCKER_TOKENS, "temperature": 0, "ignore_eos": True,
                                     "custom_params": {"outlets_predicted_output_len": 5000}}}
                for index in range(BLOCKERS)]
    threads = [threading.Thread(target=post, args=(f"{server.url}/generate", blocker), daemon=True)
               for blocker in blockers]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while json.loads(server.get("/get_load"))[0]["num_tokens"] <= 2 * STAND_IN_LOAD:
        assert time.monotonic() < deadline, server.get("/get_load")
        time.sleep(0.05)
    time.sleep(2 * POLL_S)  # the router has polled the busy load
    try:
        before = len(stand_in.received)
        for index in range(4):
            post(f"{url}/generate", {"text": f"{PROMPT} {index}", "sampling_params": {"max_new_tokens": 2}})
        busy = json.loads(server.get("/get_load"))[0]
        assert busy["num_tokens"] > STAND_IN_LOAD, "the blockers finished before the check; raise BLOCKERS"
        assert len(stand_in.received) - before == 4, "the router did not read the busy server's predicted work"
    finally:
        abort = urllib.request.Request(f"{server.url}/abort_request", data=json.dumps({"abort_all": True}).encode(),
                                       headers={"Content-Type": "application/json"})
        urllib.request.urlopen(abort, timeout=30).read()
        for thread in threads:
            thread.join(timeout=120)
    deadline = time.monotonic() + 30
    while json.loads(server.get("/get_load"))[0]["num_tokens"] != 0:
        assert time.monotonic() < deadline, server.get("/get_load")
        time.sleep(0.1)
    time.sleep(2 * POLL_S)
    before = len(stand_in.received)
    for _ in range(4):
        response = post(f"{url}/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
        assert len(response["output_ids"]) == 2
    assert len(stand_in.received) == before
