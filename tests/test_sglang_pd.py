"""Prefill/decode disaggregation with the plugin (serve environment, `make test`).

In-process: the prediction rides SGLang 0.5.23's own ``MetadataBuffers`` row from the prefill's
``set_buf`` to the decode's read (sglang_patches/pd_transfer.py). On real CPU processes: one prefill
instance in predictor-only mode (``--outlets-draft-path``) and two decode instances with
``--schedule-policy outlets`` behind sglang-router 0.3.2 in PD mode, KV over ``mooncake_tcp``
(specforge_outlets/studies/sglang_plugins/pd_cpu/ and ../shared/notes/pd-and-router.md for the CPU work-arounds).
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from types import SimpleNamespace

import pytest

pytest.importorskip("sglang", reason="SGLang tests run in the serve environment (make test)")
pytest.importorskip("sglang_router", reason="sglang-router is installed in the serve environment (make test)")
pytest.importorskip("mooncake", reason="mooncake-transfer-engine-non-cuda is installed in the serve environment")

from sglang_patches import pd_transfer, predictions as P, state  # noqa: E402
from specforge_outlets.scheduling import SchedulingConfig  # noqa: E402
from specforge_outlets.loadgen.sglang_router import LOAD_POLL_INTERVAL_S, SGLangRouter, pd_router_args  # noqa: E402
from specforge_outlets.loadgen.sglang_server import free_port  # noqa: E402
from tests.sglang_harness.offline_reference import PROMPTS, offline_r0  # noqa: E402
from tests.sglang_harness.server import SGLangServer  # noqa: E402
from tests.sglang_harness.stand_in import StandInReq  # noqa: E402

PRIOR = 256.0
FAIL_PROMPT = [3, 3, 3, 3]  # the harness makes the prefill's draft raise for prompts starting with these ids
POLL_S = LOAD_POLL_INTERVAL_S
BURST, BURST_TOKENS = 6, 5  # the requests sent while one decode instance is busy
# the busy instance's request: long enough to outlast a router poll on an idle machine (480 tokens did not), within
# the harness's 8192-token context and its 4096-token KV pool beside the burst
BLOCKER_TOKENS = 1500
# Mooncake's sessions and the bootstrap on loopback (SGLang takes the host's first NIC address otherwise)
PD_ENV = {"SGLANG_HOST_IP": "127.0.0.1"}
# SGLang's CPU work-arounds for PD (../shared/notes/pd-and-router.md); --dtype float32 as the offline reference
PD_ARGS = ["--disaggregation-transfer-backend", "mooncake_tcp", "--disable-overlap-schedule", "--dtype", "float32"]
DECODE_ARGS = ["--disaggregation-mode", "decode", "--disaggregation-decode-retraction-backup", "cpu_tensor",
               "--schedule-policy", "outlets", "--enable-metrics"]


# --- in-process: SGLang's metadata row ---------------------------------------------------------
@pytest.fixture()
def metadata_row(monkeypatch):
    import torch
    from sglang.srt.disaggregation.utils import MetadataBuffers

    monkeypatch.setattr(state, "plugin_active", lambda: True)
    return MetadataBuffers(4, hidden_size=8, hidden_states_dtype=torch.float32, max_sampling_mask_tokens=1)


def prefill_req(index: int, predicted_output_len=None, source="draft"):
    req = StandInReq(rid=f"r{index}", metadata_buffer_index=index)
    if predicted_output_len is not None:
        P.set_predicted_output_len(req, predicted_output_len, source)
    return req


def test_the_prefills_prediction_rides_the_metadata_row_and_a_missing_one_is_written_as_zero(metadata_row,
                                                                                               monkeypatch):
    for req in (prefill_req(0, 123.5), prefill_req(1, PRIOR, "prior"), prefill_req(2), prefill_req(3, 0.0)):
        pd_transfer.set_buf_after(None, metadata_row, req)
    sent = metadata_row.output_token_logprobs_val[:, pd_transfer.PREDICTION_SLOT].tolist()
    assert sent[:3] == [123.5, 0.0, 0.0] and sent[3] == pytest.approx(pd_transfer.SMALLEST_SENT)  # a predicted 0 is not "none"
    pd_transfer.set_buf_after(None, metadata_row, prefill_req(3))  # a reused row is overwritten, predicted or not
    assert metadata_row.output_token_logprobs_val[3, pd_transfer.PREDICTION_SLOT].item() == 0.0
    # the decode reads the row SGLang transferred, at commit, under an outlets policy
    monkeypatch.setattr(state, "schedule_policy_is_outlets", lambda: True)
    monkeypatch.setattr(state, "settings", lambda: SimpleNamespace(scheduling=SchedulingConfig(prior_output_len=PRIOR)))
    queue = SimpleNamespace(metadata_buffers=metadata_row)
    arrived = StandInReq(rid="d0", finished_reason=None, sampling_params=None, output_ids=[], bootstrap_host="h")
    pd_transfer.commit_transfer_after(None, queue, SimpleNamespace(req=arrived, metadata_buffer_index=0))
    assert (P.predicted_output_len(arrived), P.prediction(arrived).source) == (123.5, "prefill")
    aborted = StandInReq(rid="d1", finished_reason="abort", sampling_params=None, output_ids=[], bootstrap_host="h")
    pd_transfer.commit_transfer_after(None, queue, SimpleNamespace(req=aborted, metadata_buffer_index=0))
    assert P.predicted_output_len(aborted) is None
    from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST

    health_check = StandInReq(rid="HEALTH_CHECK_1", finished_reason=None, sampling_params=None, output_ids=[],
                                   bootstrap_host=FAKE_BOOTSTRAP_HOST)  # no prefill behind it: nothing to read
    pd_transfer.commit_transfer_after(None, queue, SimpleNamespace(req=health_check, metadata_buffer_index=0))
    assert P.predicted_output_len(health_check) is None


def test_the_decode_takes_the_requests_own_prediction_then_the_prefills_then_the_prior(monkeypatch):
    config = SchedulingConfig(prior_output_len=PRIOR)
    counted = []
    monkeypatch.setattr(state.metrics(), "transfer_without_prediction", lambda: counted.append(1))

    def decode_req(custom=None):
        return StandInReq(rid="d", sampling_params=SimpleNamespace(custom_params=custom), output_ids=[])

    req = decode_req()
    pd_transfer.receive_prediction(req, 123.5, config)
    assert (P.predicted_output_len(req), P.prediction(req).source) == (123.5, "prefill") and not counted
    own = decode_req({"outlets_predicted_output_len": 9})
    pd_transfer.receive_prediction(own, 123.5, config)
    assert (P.predicted_output_len(own), P.prediction(own).source) == (9.0, "external")
    for missing in (0.0, float("nan"), -4.0):
        req = decode_req()
        pd_transfer.receive_prediction(req, missing, config)
        assert P.predicted_output_len(req) is None and P.predicted_remaining(req, config) == PRIOR  # scheduled on the prior
    assert len(counted) == 3
    rebootstrapped = decode_req()  # a PD re-bootstrap commits again: the first prediction stays
    pd_transfer.receive_prediction(rebootstrapped, 50.0, config)
    pd_transfer.receive_prediction(rebootstrapped, 80.0, config)
    assert P.predicted_output_len(rebootstrapped) == 50.0


# --- real processes: 1 prefill + 2 decode behind the router -------------------------------------
def post(url: str, body: dict, timeout: float = 300) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def decoded_tokens(server) -> float:
    """Tokens the instance's decode steps generated (SGLang's ``sglang:realtime_tokens_total``, mode decode):
    a request of N tokens adds N - 1 on the decode instance that served it (the first comes from the prefill)."""
    text = server.get("/metrics")
    return sum(float(value) for value in re.findall(r'^sglang:realtime_tokens_total\{[^}]*mode="decode"[^}]*\} (\S+)$',
                                                    text, re.M))


@pytest.fixture(scope="module")
def pd_cluster(chat_target, outlets_export, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("pd")
    bootstrap = free_port()
    prefill = SGLangServer(chat_target, ["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port",
                                         str(bootstrap), "--outlets-draft-path", outlets_export,
                                         "--disable-radix-cache", *PD_ARGS],
                           env=PD_ENV, log_path=str(log_dir / "prefill.log"), fail_prompt=FAIL_PROMPT, pd_cpu=True)
    decodes = [SGLangServer(chat_target, [*DECODE_ARGS, *PD_ARGS], env=PD_ENV,
                            log_path=str(log_dir / f"decode{index}.log"), pd_cpu=True) for index in range(2)]
    servers = [prefill, *decodes]
    router = SGLangRouter(pd_router_args(prefill.url, bootstrap, [decode.url for decode in decodes], "power_of_two",
                                         POLL_S), log_path=str(log_dir / "router.log"))
    try:
        for server in servers:
            server.start()
        router.start()
        time.sleep(3 * POLL_S)
        yield SimpleNamespace(prefill=prefill, decodes=decodes, url=router.url)
    finally:
        router.stop()
        for server in servers:
            server.stop()


def test_the_decode_instance_holds_the_prefills_prediction(pd_cluster, chat_target, outlets_export, tmp_path):
    served = []
    for prompt in PROMPTS:
        response = post(f"{pd_cluster.url}/generate", {"input_ids": prompt, "sampling_params": {
            "max_new_tokens": 3, "temperature": 0, "ignore_eos": True}})
        assert len(response["output_ids"]) == 3
        served.append((prompt, response["output_ids"][0], response["meta_info"]["predicted_output_len"]))
    offline = offline_r0(outlets_export, chat_target, served, str(tmp_path))
    for (prompt, first, value), reference in zip(served, offline):
        # made on the prefill, sent as float32, reported by the decode (meta_info rounds to 3 decimals)
        assert value == pytest.approx(reference, rel=1e-4, abs=2e-3), (prompt, first, value, reference)
    assert len({round(value) for _, _, value in served}) == len(served)
    assert all("without a prediction" not in decode.log_text() for decode in pd_cluster.decodes)


def test_pd_greedy_output_equals_the_models_own(pd_cluster, chat_target):
    """Token for token what the target generates greedily on its own (transformers, float32)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(chat_target, torch_dtype=torch.float32).eval()
    for prompt in PROMPTS:
        with torch.no_grad():
            reference = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0, len(prompt):]
        response = post(f"{pd_cluster.url}/generate", {"input_ids": prompt, "sampling_params": {
            "max_new_tokens": 8, "temperature": 0, "ignore_eos": True}})
        assert response["output_ids"] == reference.tolist(), prompt


def test_a_request_the_prefill_could_not_predict_gets_the_prior_on_the_decode_and_is_counted(pd_cluster):
    counters = ("outlets_transfers_without_prediction_total", "outlets_requests_on_prior_total")
    before = {name: sum(counted(decode, name) for decode in pd_cluster.decodes) for name in counters}
    response = post(f"{pd_cluster.url}/generate", {"input_ids": FAIL_PROMPT + PROMPTS[0], "rid": "unpredicted",
                                                   "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    assert response["meta_info"]["completion_tokens"] == 2
    assert "predicted_output_len" not in response["meta_info"]  # as an unpredicted request on one server
    assert re.search(r"OUTLETS prediction failed for request unpredicted .*injected failure",
                     pd_cluster.prefill.log_text())
    logs = "".join(decode.log_text() for decode in pd_cluster.decodes)
    assert "request unpredicted arrived from the prefill instance without a prediction" in logs, logs[-3000:]
    for name in counters:
        assert sum(counted(decode, name) for decode in pd_cluster.decodes) == before[name] + 1, name


def counted(server, counter: str) -> float:
    text = server.get("/metrics")
    return sum(float(value) for value in re.findall(rf"^{counter}\S* (\S+)$", text, re.M))


def test_the_router_sends_new_requests_to_the_decode_instance_with_less_predicted_work(pd_cluster):
    """A long-predicted request runs on one decode instance; once the router has polled both `/get_load`s,
    power_of_two (two instances: both compared) sends every new request to the other one."""
    blocker = {"input_ids": PROMPTS[0], "rid": "blocker", "sampling_params": {
        "max_new_tokens": BLOCKER_TOKENS, "temperature": 0, "ignore_eos": True}, "custom_labels": {
        "outlets_predicted_output_len": "5000"}}
    thread = threading.Thread(target=post, args=(f"{pd_cluster.url}/generate", blocker), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while True:
        loads = [json.loads(decode.get("/get_load"))[0]["num_tokens"] for decode in pd_cluster.decodes]
        if max(loads) > 1000:
            break
        assert time.monotonic() < deadline and thread.is_alive(), loads
        time.sleep(0.05)
    busy = loads.index(max(loads))
    idle = pd_cluster.decodes[1 - busy]
    # one poll interval and a margin: the router has polled both loads since the blocker arrived
    time.sleep(1.25 * POLL_S)
    # still busy now, so busy at the router's last poll too: the burst is dispatched on that view
    assert json.loads(pd_cluster.decodes[busy].get("/get_load"))[0]["num_tokens"] > 1000, "lengthen the blocker"
    before = decoded_tokens(idle)
    # each predicted at a few tokens: a router poll in the middle of the burst then still finds the idle instance
    # far below the busy one (the draft's own r0 for these prompts could add up past it)
    burst = [threading.Thread(target=post, args=(f"{pd_cluster.url}/generate", {
        "input_ids": PROMPTS[1 + index % 2], "custom_labels": {"outlets_predicted_output_len": str(BURST_TOKENS)},
        "sampling_params": {"max_new_tokens": BURST_TOKENS, "temperature": 0, "ignore_eos": True}}))
        for index in range(BURST)]
    for request in burst:
        request.start()
    for request in burst:
        request.join(timeout=120)
    expected = BURST * (BURST_TOKENS - 1)  # every request of the burst decoded on the idle instance
    deadline = time.monotonic() + 10
    while decoded_tokens(idle) - before < expected and time.monotonic() < deadline:
        time.sleep(0.2)
    assert decoded_tokens(idle) - before == expected
    thread.join(timeout=300)
