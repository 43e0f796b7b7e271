"""The OUTLETS plugin on real SGLang 0.5.23 servers on the CPU (serve environment, `make test`):
``--schedule-policy outlets`` against stock FCFS.

One server per test class (class-scoped fixtures, ~40-60 s to start), so at most one runs at a
time. The plugin is found through its ``sglang.srt.plugins`` entry point (setup.py); no launcher of
ours is involved. See also test_sglang_dp.py and test_sglang_predictor.py.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error

import pytest

pytest.importorskip("sglang", reason="SGLang tests run in the serve environment (make test)")

from tests.sglang_harness.server import HARNESS_CONTEXT_LEN, completion_order, start_server  # noqa: E402

PRIOR = 256.0
PROMPT = "hello world the quick brown fox"
GREEDY_TOKENS = {}  # output ids per server kind, compared at the end


# Predicted lengths on both sides of the long-class threshold; actual lengths are tiny so the test
# is quick. The first request blocks the server
# (one request runs at a time) while the others queue up behind it; 400 tokens, because 120 were
# done in 0.3 s once, before the burst had been sent.
BLOCKER = {"text": PROMPT + " blocker", "max_new_tokens": 400, "predicted_output_len": 5000}
BURST_PREDICTIONS = [900, 100, 700, 300, 500, 200]


def burst(server):
    requests = [BLOCKER] + [
        {"text": f"{PROMPT} {index}", "max_new_tokens": 2, "predicted_output_len": predicted}
        for index, predicted in enumerate(BURST_PREDICTIONS)
    ]
    results = server.burst(requests, gap_s=0.05)
    # the precondition of the comparison: everything queued while the blocker was running
    assert results[0]["done"] > max(result["sent"] for result in results[1:]) + 0.05, "blocker finished too early"
    order = completion_order(results)
    assert order[0] == 0  # the blocker was already running
    return [BURST_PREDICTIONS[index - 1] for index in order[1:]]


class TestOutletsPolicy:
    """The default order (tail-safe) with strict priority of the short class (hold-back 1), so that
    the expected order does not depend on how long the burst waited; the default KV admission (no
    ``--outlets-kv-admission``: SGLang's own, which the start-up log names)."""

    @pytest.fixture(scope="class")
    def server(self, chat_target, tmp_path_factory):
        server = start_server(chat_target, str(tmp_path_factory.mktemp("outlets-log")),
                              ["--schedule-policy", "outlets", "--max-running-requests", "1", "--enable-metrics",
                               "--outlets-long-output-len", "600", "--outlets-long-holdback", "1"])
        yield server
        server.stop()

    def test_burst_completes_short_class_first_each_class_in_arrival_order(self, server):
        short = [p for p in BURST_PREDICTIONS if p < 600]
        long = [p for p in BURST_PREDICTIONS if p >= 600]
        assert burst(server) == short + long

    def test_prediction_is_reported_in_meta_info(self, server):
        response = server.generate(PROMPT, max_new_tokens=3, predicted_output_len=42)
        assert response["meta_info"]["predicted_output_len"] == 42.0
        assert response["meta_info"]["completion_tokens"] == 3
        # without a prediction and without a predictor the key uses the prior, and the response
        # reports none (as stock)
        response = server.generate(PROMPT, max_new_tokens=2)
        assert "predicted_output_len" not in response["meta_info"]

    def test_a_bad_prediction_is_refused_naming_the_request_and_serving_goes_on(self, server):
        for index, bad in enumerate(("not-a-number", "nan", -5, 0)):
            body = {"text": PROMPT, "rid": f"bad-{index}",
                    "sampling_params": {"max_new_tokens": 2, "custom_params": {"outlets_predicted_output_len": bad}}}
            with pytest.raises(urllib.error.HTTPError) as error:
                server.post("/generate", body)
            message = error.value.read().decode()
            assert error.value.code == 400 and f"request bad-{index}: outlets_predicted_output_len" in message, message
            assert "is not a positive number of tokens" in message
        for index, huge in enumerate((1e12, HARNESS_CONTEXT_LEN + 1)):  # accepted, and poisoning the metrics, once
            body = {"text": PROMPT, "rid": f"huge-{index}",
                    "sampling_params": {"max_new_tokens": 2, "custom_params": {"outlets_predicted_output_len": huge}}}
            with pytest.raises(urllib.error.HTTPError) as error:
                server.post("/generate", body)
            message = error.value.read().decode()
            assert error.value.code == 400 and (
                f"request huge-{index}: outlets_predicted_output_len = {huge!r} is above the model's context length "
                f"({HARNESS_CONTEXT_LEN} tokens)") in message, message
        with pytest.raises(urllib.error.HTTPError) as error:  # a misspelt key, ignored once: the request ran on the prior
            server.post("/generate", {"text": PROMPT, "rid": "typo", "sampling_params": {
                "max_new_tokens": 2, "custom_params": {"outlets_predicted_len": 7}}})
        message = error.value.read().decode()
        assert error.value.code == 400 and ("request typo: unknown OUTLETS parameter "
                                            "custom_params['outlets_predicted_len']; the plugin reads "
                                            "outlets_predicted_output_len") in message, message
        stream = server.stream({"text": PROMPT, "rid": "bad-stream", "custom_labels": {"outlets_predicted_output_len": "-1"},
                                "sampling_params": {"max_new_tokens": 2}})
        assert "request bad-stream: " in stream[-1]["error"]["message"], stream
        # and ordinary requests are still served afterwards
        assert server.generate(PROMPT, max_new_tokens=2, predicted_output_len=7)["meta_info"]["predicted_output_len"] == 7.0

    def test_start_up_log_names_the_mode_and_every_hook_applied(self, server):
        log = server.log_text()
        match = re.search(r"OUTLETS schedule-policy: mode=(.*?), order=tail-safe \(long_output_len=600, "
                          r"long_holdback=1, .*kv_admission=sglang, prior_output_len=256, "
                          r"hooks applied: (\d+)/(\d+)", log)
        assert match, log[-3000:]
        assert match.group(1).startswith("external predictions")
        assert match.group(2) == match.group(3)
        assert "OUTLETS hooks NOT applied" not in log
        assert "Failed to apply hooks" not in log and "Failed to execute general plugin" not in log

    def test_prometheus_metrics(self, server):
        server.generate(PROMPT, max_new_tokens=3, predicted_output_len=10)  # abs error 7, signed error 3 - 10 = -7
        server.generate(PROMPT, max_new_tokens=2)  # no prediction, no predictor: scheduled on the prior
        burst(server)  # reorders the waiting queue
        text = server.get("/metrics")
        outlets_lines = [line for line in text.splitlines() if "outlets" in line]
        for metric in (r"outlets_prediction_abs_error_tokens_count\S*", r"outlets_queue_order_changes_total\S*",
                       r'outlets_prediction_error_tokens_bucket\{[^}]*le="-5\.0"[^}]*\}',  # the -7
                       r"outlets_predicted_output_len_tokens_count\S*", r"outlets_requests_on_prior_total\S*"):
            assert re.search(f"^{metric} [1-9]", text, re.M), (metric, outlets_lines)
        # signed: this class's requests end long before their predictions (the burst's 100-900 after 2 tokens)
        assert float(re.search(r"^outlets_prediction_error_tokens_sum\S* (\S+)$", text, re.M).group(1)) < 0, (
            outlets_lines)

    def test_greedy_tokens_and_the_prediction_come_back(self, server):
        response = server.generate(PROMPT, max_new_tokens=6, predicted_output_len=3)
        assert len(response["output_ids"]) == 6 and response["meta_info"]["predicted_output_len"] == 3.0
        GREEDY_TOKENS["outlets"] = response["output_ids"]  # compared with the stock server's below


    def test_get_load_reports_the_predicted_remaining_work(self, server):
        """What sglang-router's power_of_two reads: while a request predicted 5000 runs, its predicted
        remaining (5000 minus the <= 400 tokens generated), not SGLang's token load (a few hundred)."""
        # the previous test's last request may still be leaving the scheduler when its client is done
        deadline = time.monotonic() + 30
        while json.loads(server.get("/get_load"))[0]["num_reqs"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert json.loads(server.get("/get_load")) == [
            {"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0, "load": "predicted_remaining"}]
        done = threading.Event()

        def run():
            try:
                server.generate(PROMPT + " load", max_new_tokens=400, predicted_output_len=5000)
            finally:
                done.set()

        threading.Thread(target=run, daemon=True).start()
        polls = []
        while not done.is_set():
            polls.append(json.loads(server.get("/get_load"))[0])
            time.sleep(0.02)
        busy = [poll["num_tokens"] for poll in polls if poll["num_reqs"] > 0]
        assert busy and all(4600 <= tokens <= 5000 for tokens in busy), (len(polls), busy)
        assert all(isinstance(poll["num_tokens"], int) and poll["load"] == "predicted_remaining" for poll in polls)
        deadline = time.monotonic() + 10  # the scheduler publishes its idle snapshot once the request is done
        while json.loads(server.get("/get_load"))[0]["num_tokens"] != 0:
            assert time.monotonic() < deadline, server.get("/get_load")
            time.sleep(0.1)

    def test_a_prediction_in_custom_labels_is_used(self, server):
        """sglang-router keeps custom_labels on /generate (it drops custom_params): the plugin reads it there."""
        response = server.post("/generate", {"text": PROMPT, "custom_labels": {"outlets_predicted_output_len": "42"},
                                             "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
        assert response["meta_info"]["predicted_output_len"] == 42.0


class TestStock:
    """The same server without the plugin's flags: the plugin is loaded but inert."""

    @pytest.fixture(scope="class")
    def server(self, chat_target, tmp_path_factory):
        server = start_server(chat_target, str(tmp_path_factory.mktemp("stock-log")),
                              ["--max-running-requests", "1", "--enable-custom-logit-processor"])
        yield server
        server.stop()

    def test_burst_completes_in_arrival_order_under_fcfs(self, server):
        assert burst(server) == BURST_PREDICTIONS

    def test_no_prediction_no_log_line(self, server):
        response = server.generate(PROMPT, max_new_tokens=3, predicted_output_len=42)
        assert "predicted_output_len" not in response["meta_info"]
        # The hooks are applied in every SGLang process (test_sglang_plugin.py proves it) but pass
        # through: no start-up line, no prediction.
        assert "OUTLETS" not in server.log_text()

    def test_no_get_load_route(self, server):
        """SGLang 0.5.23 serves no /get_load (sglang-router then reads -1 for every worker)."""
        with pytest.raises(urllib.error.HTTPError) as error:
            server.get("/get_load")
        assert error.value.code == 404

    def test_end_at_output_len_ends_each_request_at_its_length_under_the_cap(self, server, chat_target):
        """`outlets bench-serving --end-at-output-len`: exactly the recorded length, with max_new_tokens a cap."""
        import json

        from specforge_outlets.loadgen.client import SamplingSettings, generate_payload
        from specforge_outlets.loadgen.workload import BenchRequest

        with open(f"{chat_target}/generation_config.json") as handle:
            stop = json.load(handle)["eos_token_id"]
        stop = stop[0] if isinstance(stop, list) else stop
        for length, temperature in ((1, 0.0), (5, 0.0), (23, 1.0)):
            request = BenchRequest(f"len-{length}", 0.0, 64, length, text=f"{PROMPT} {length}", end_token_id=stop)
            body = dict(generate_payload(request, SamplingSettings(temperature=temperature)), stream=False)
            response = server.post("/generate", body)
            assert len(response["output_ids"]) == length, (length, response["meta_info"])
            assert response["meta_info"]["finish_reason"]["type"] == "stop"

    def test_same_tokens_as_the_outlets_server(self, server):
        tokens = server.generate(PROMPT, max_new_tokens=6)["output_ids"]
        if "outlets" not in GREEDY_TOKENS:
            pytest.skip("run with TestOutletsPolicy")
        assert tokens == GREEDY_TOKENS["outlets"]


class TestKVAdmissionOfNewRequests:
    """KV admission by prediction for requests being admitted (``--outlets-kv-admission``: the charge, a
    quantile, the peak), against stock.

    A 700-token KV cache and four requests that may generate up to 400 tokens each, predicted to
    need 5, sent in one batch; each stops at its second token (``stop_token_ids``: the tiny target
    never ends a turn by itself). Stock SGLang charges a request it admits its whole max_new_tokens,
    so at most two are in the cache at once; charged their prediction, all four are admitted
    together (and, the prediction being right, nothing is retracted)."""

    ARGS = ["--max-total-tokens", "700", "--max-running-requests", "8", "--disable-radix-cache"]

    # total-length quantiles at the default levels (0.1, 0.25, 0.5, 0.75, 0.9): a median of 5 tokens,
    # an upper tail close to max_new_tokens
    QUANTILES = [2.0, 3.0, 5.0, 300.0, 390.0]

    def largest_prefill_batch(self, target, log_dir, args, custom=None):
        server = start_server(target, log_dir, self.ARGS + args)
        try:
            texts = [f"{PROMPT} {index}" for index in range(4)]
            stops = [server.generate(text, max_new_tokens=2)["output_ids"][1] for text in texts]
            before = len(server.log_text())
            params = [{"max_new_tokens": 400, "temperature": 0, "stop_token_ids": [stop],
                       "custom_params": custom or {"outlets_predicted_output_len": 5}} for stop in stops]
            responses = server.post("/generate", {"text": texts, "sampling_params": params})  # one batch: together
            log = server.log_text()[before:]
        finally:
            server.stop()
        assert all(r["meta_info"]["completion_tokens"] <= 2 for r in responses)
        assert all(r["meta_info"]["num_retractions"] == 0 for r in responses)
        return max(int(n) + int(running) for n, running in
                   re.findall(r"Prefill batch, #new-seq: (\d+),.*?#running-req: (\d+)", log))

    def test_a_request_being_admitted_is_charged_its_prediction(self, chat_target, tmp_path_factory):
        stock = self.largest_prefill_batch(chat_target, str(tmp_path_factory.mktemp("kv-stock")),
                                           ["--schedule-policy", "fcfs"])
        predicted = self.largest_prefill_batch(chat_target, str(tmp_path_factory.mktemp("kv-outlets")),
                                               ["--schedule-policy", "outlets", "--outlets-kv-admission", "predicted",
                                                "--outlets-kv-margin", "0.2"])
        assert stock <= 2 < predicted == 4, (stock, predicted)

    def test_a_request_being_admitted_is_charged_the_chosen_quantile(self, chat_target, tmp_path_factory):
        """``--outlets-kv-admission quantile``: the same requests, charged their median (5) or their q0.9 (390)."""
        custom = {"outlets_predicted_quantiles": self.QUANTILES}
        outlets = ["--schedule-policy", "outlets", "--outlets-kv-admission", "quantile", "--outlets-kv-quantile"]
        median = self.largest_prefill_batch(chat_target, str(tmp_path_factory.mktemp("kv-q50")), outlets + ["0.5"],
                                            custom)
        upper = self.largest_prefill_batch(chat_target, str(tmp_path_factory.mktemp("kv-q90")), outlets + ["0.9"],
                                           custom)
        assert upper <= 2 < median == 4, (upper, median)

    def test_a_request_being_admitted_is_gated_by_the_predicted_peak(self, chat_target, tmp_path_factory):
        """``--outlets-kv-admission peak``: nothing charged ahead, the predicted future peak is the gate. Predicted to
        end at 5 tokens, the four fit together; predicted to run to 390 of their 400, two would peak above the
        700-token cache, so they are admitted one at a time (charged nothing ahead without the gate: all four)."""
        outlets = ["--schedule-policy", "outlets", "--outlets-kv-admission", "peak"]
        short = self.largest_prefill_batch(chat_target, str(tmp_path_factory.mktemp("kv-peak-short")), outlets)
        long = self.largest_prefill_batch(chat_target, str(tmp_path_factory.mktemp("kv-peak-long")), outlets,
                                          {"outlets_predicted_output_len": 390})
        assert long == 1 < short == 4, (long, short)
