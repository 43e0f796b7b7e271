"""`outlets bench-serving` and `outlets compare-runs` against a stub streaming /generate server.

The stub speaks SGLang's native streaming protocol (HTTP/1.1 chunked Server-Sent Events, cumulative
``text`` and ``meta_info.completion_tokens``, ``data: [DONE]``) and decides from the prompt:
``len=N`` -> N tokens (capped by max_new_tokens), ``drop`` -> the connection is cut after two
tokens, ``truncate`` -> the body ends cleanly after two tokens but without ``[DONE]``, ``reset`` ->
the connection is closed before any answer. ``ignore_eos`` -> exactly
max_new_tokens. Every answer carries ``predicted_output_len`` = tokens + 0.5.
"""

import json
import math
import os
import pickle
import re
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import numpy as np
import pytest

from specforge_outlets.cli import main
from specforge_outlets.serving.metrics import percentile, summarize_requests
from specforge_outlets.strict_json import json_safe


class StubGenerateServer:
    def __init__(self, token_delay: float = 0.0, healthy: bool = True) -> None:
        self.received = []  # (perf_counter at receipt, request body)
        self.token_delay = token_delay
        self.healthy = healthy
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # like uvicorn; small SSE writes are not held back

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:  # /v1/models: what sglang.bench_serving polls before it sends
                status = 200 if self.path in ("/health", "/v1/models") and server.healthy else 503
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.received.append((time.perf_counter(), body))
                server.stream(self, body)

        class Server(ThreadingHTTPServer):
            request_queue_size = 128  # a burst connects at once; the default backlog of 5 drops SYNs (1 s retries)
            daemon_threads = True

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def stream(self, handler, body) -> None:
        text = body.get("text") or ""
        params = body["sampling_params"]
        limit = params["max_new_tokens"]
        if "reset" in text:
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
            return
        match = re.search(r"len=(\d+)", text)
        tokens = limit if params.get("ignore_eos") or not match else min(int(match.group(1)), limit)
        prompt_tokens = len(body["input_ids"]) if "input_ids" in body else len(text.split())
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()

        def chunk(data: str) -> None:
            raw = data.encode()
            handler.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
            handler.wfile.flush()

        for k in range(1, tokens + 1):
            finish = None if k < tokens else {"type": "length" if tokens == limit else "stop"}
            meta = {"prompt_tokens": prompt_tokens, "completion_tokens": k, "finish_reason": finish,
                    "predicted_output_len": tokens + 0.5}
            chunk(f"data: {json.dumps({'text': 'w' * k, 'meta_info': meta})}\n\n")
            if "drop" in text and k == min(2, tokens):
                handler.close_connection = True
                handler.connection.shutdown(socket.SHUT_RDWR)
                return
            if "truncate" in text and k == min(2, tokens):
                break
            if self.token_delay:
                time.sleep(self.token_delay)
        if "truncate" not in text:
            chunk("data: [DONE]\n\n")
        handler.wfile.write(b"0\r\n\r\n")
        handler.wfile.flush()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def stub():
    with StubGenerateServer() as server:
        yield server


def write_jsonl(path, rows):
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return str(path)


def bench(tmp_path, urls, *extra, name="run"):
    argv = ["bench-serving", "--output", str(tmp_path / name)]
    for url in urls:
        argv += ["--base-url", url]
    code = main(argv + list(extra))
    out = tmp_path / name
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else None
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()] if summary else None
    return code, summary, records


# --- metrics with failures ------------------------------------------------------------------------
def test_percentiles_with_failures_are_inf_never_nan():
    values = np.array([1.0] * 197 + [np.inf] * 3)
    assert percentile(values, 50) == 1.0 and percentile(values, 99) == math.inf
    one_failure = np.array([1.0] * 199 + [np.inf])
    assert percentile(one_failure, 99) == 1.0  # 0.5% failed: P99 still finite
    assert percentile(np.array([np.inf, np.inf, 2.0]), 50) == math.inf  # np.percentile gives NaN here
    assert percentile(np.array([1.0, 3.0]), 50) == pytest.approx(np.percentile([1.0, 3.0], 50))
    assert math.isnan(percentile(np.array([]), 50))

    metrics = summarize_requests(np.zeros(4), np.array([1.0, 1.0, np.nan, 1.0]), np.array([2.0, 3.0, 0.5, 4.0]),
                                 np.array([10, 900, 0, 20]), class_lens=np.array([10, 900, 1000, 20]),
                                 success=np.array([True, True, False, True]), short_threshold=800)
    assert metrics["all"]["failed"] == 1 and metrics["long"]["failed"] == 1 and metrics["short"]["failed"] == 0
    assert metrics["long"]["requests"] == 2 and metrics["long"]["e2e_p99_s"] == math.inf
    assert metrics["short"]["e2e_p99_s"] == pytest.approx(np.percentile([2.0, 4.0], 99))
    assert metrics["all"]["throughput_tok_s"] == pytest.approx(930 / 4.0)
    assert "queue_p99_s" not in metrics["all"]
    assert json_safe({"a": math.inf, "b": math.nan, "c": [np.float64(1.5)]}) == {"a": "inf", "b": None, "c": [1.5]}


# --- bench-serving --------------------------------------------------------------------------------
def test_burst_run_writes_summary_records_and_predictions(tmp_path, stub, capsys):
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"id": f"p{i}", "prompt": f"question {i} len={i + 1}"} for i in range(6)])
    code, summary, records = bench(tmp_path, [stub.url], "--dataset", dataset, "--rate", "inf", "--raw-prompts",
                                   "--max-new-tokens", "4", "--short-threshold", "3")
    assert code == 0 and "failed" not in capsys.readouterr().out
    run = summary["runs"][0]
    assert run["label"] == "run" and run["offered_rps"] == "inf"
    assert summary["base_urls"] == [stub.url] and summary["num_requests"] == 6 and summary["short_threshold"] == 3
    metrics = run["metrics"]
    assert metrics["all"]["requests"] == 6 and metrics["all"]["failed"] == 0
    assert metrics["short"]["requests"] == 2 and metrics["long"]["requests"] == 4  # 1, 2 tokens vs 3, 4, 4, 4
    assert metrics["all"]["throughput_tok_s"] > 0 and 0 < metrics["all"]["ttft_p50_s"] <= metrics["all"]["e2e_p99_s"]
    assert not any(key.startswith("queue") for key in metrics["all"])  # not observable from the client
    by_id = {record["id"]: record for record in records}
    assert by_id["p0"]["output_len"] == 1 and by_id["p0"]["finish_reason"] == "stop"
    assert by_id["p5"]["output_len"] == 4 and by_id["p5"]["finish_reason"] == "length"
    assert [by_id[f"p{i}"]["predicted_output_len"] for i in range(6)] == [1.5, 2.5, 3.5, 4.5, 4.5, 4.5]
    assert all(record["success"] and record["url"] == stub.url and record["prompt_len"] == 3 for record in records)
    assert {body["sampling_params"]["max_new_tokens"] for _, body in stub.received} == {4}
    assert all(body["stream"] and "text" in body for _, body in stub.received)
    assert run["total_input_tokens"] == 18 and run["max_concurrent_requests"] == 6  # 6 prompts of 3 tokens at once
    assert run["total_throughput"] == pytest.approx((18 + run["total_output_tokens"]) / run["duration"])
    assert "| all | 6 | 0 |" in (tmp_path / "run" / "summary.md").read_text()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["requests.jsonl", "summary.json", "summary.md"]


def test_dropped_connections_are_counted_and_push_p99_to_inf(tmp_path, stub, capsys):
    rows = [{"id": f"ok{i}", "prompt": f"fine len=2"} for i in range(7)]
    rows += [{"id": "cut", "prompt": "please drop len=5", "output_length": 900},
             {"id": "gone", "prompt": "reset now len=5"}, {"id": "short", "prompt": "truncate len=5"}]
    dataset = write_jsonl(tmp_path / "d.jsonl", rows)
    code, summary, records = bench(tmp_path, [stub.url], "--dataset", dataset, "--rate", "inf", "--raw-prompts",
                                   "--max-new-tokens", "5")
    out = capsys.readouterr().out
    assert code == 0 and "WARNING: 3 of 10 requests failed" in out
    metrics = summary["runs"][0]["metrics"]
    assert metrics["all"]["requests"] == 10 and metrics["all"]["failed"] == 3
    assert metrics["all"]["e2e_p99_s"] == "inf" and metrics["all"]["e2e_mean_s"] == "inf"
    assert isinstance(metrics["all"]["e2e_p50_s"], float)  # the 7 successful requests still set the median
    # the cut request got its first tokens; the reset one never did
    assert metrics["long"]["requests"] == 1 and metrics["long"]["failed"] == 1  # classified by output_length 900
    assert metrics["short"]["failed"] == 2 and metrics["short"]["ttft_p99_s"] == "inf"
    assert metrics["all"]["throughput_tok_s"] > 0
    failed = {record["id"]: record for record in records if not record["success"]}
    assert set(failed) == {"cut", "gone", "short"} and all(record["error"] for record in failed.values())
    assert failed["cut"]["output_len"] == 2 and failed["cut"]["ttft_s"] is not None and failed["gone"]["ttft_s"] is None
    assert "without [DONE] after 2 token(s)" in failed["short"]["error"]
    markdown = (tmp_path / "run" / "summary.md").read_text()
    assert "| all | 10 | 3 |" in markdown and "inf" in markdown and "3 of 10 requests failed" in markdown


def test_every_request_failing_exits_nonzero_with_records(tmp_path, stub, capsys):
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "reset"}, {"prompt": "reset again"}])
    code, summary, records = bench(tmp_path, [stub.url], "--dataset", dataset, "--rate", "inf", "--raw-prompts")
    assert code == 1 and summary["runs"][0]["metrics"]["all"]["failed"] == 2 and len(records) == 2
    assert summary["runs"][0]["metrics"]["all"]["e2e_p50_s"] == "inf"


def test_timeout_counts_as_failure(tmp_path):
    with StubGenerateServer(token_delay=0.4) as slow:  # answers: 0.4 s and 2 s
        dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a len=1"}, {"prompt": "b len=5"}])
        code, summary, records = bench(tmp_path, [slow.url], "--dataset", dataset, "--rate", "inf", "--raw-prompts",
                                       "--timeout", "1.2")
    assert code == 0 and summary["runs"][0]["metrics"]["all"]["failed"] == 1
    assert [record["success"] for record in records] == [True, False] and "timeout" in records[1]["error"]


def test_inter_token_gaps_are_recorded_per_token_and_summarized(tmp_path):
    with StubGenerateServer(token_delay=0.1) as slow:  # a token every 0.1 s
        dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a len=4"}])
        code, summary, records = bench(tmp_path, [slow.url], "--dataset", dataset, "--rate", "inf", "--raw-prompts")
    assert code == 0 and len(records[0]["itl_s"]) == 3
    assert records[0]["itl_s"] == pytest.approx([0.1] * 3, abs=0.05)
    metrics = summary["runs"][0]["metrics"]["all"]
    assert metrics["itl_p50_s"] == pytest.approx(0.1, abs=0.05) and metrics["itl_mean_s"] == pytest.approx(0.1, abs=0.05)


def test_a_chunk_of_several_tokens_counts_one_gap_per_token():
    from specforge_outlets.loadgen.client import RequestRecord, _read_event

    record = RequestRecord(id="a", url="u", scheduled_s=0.0, sent_s=0.0)
    sent = time.perf_counter()
    _read_event({"text": "w", "meta_info": {"completion_tokens": 1}}, record, sent)
    time.sleep(0.3)
    _read_event({"text": "wwww", "meta_info": {"completion_tokens": 4}}, record, sent)  # 3 tokens in 0.3 s
    assert record.output_len == 4 and record.itl_s == pytest.approx([0.1] * 3, abs=0.03)
    _read_event({"text": "wwww", "meta_info": {"completion_tokens": 4, "finish_reason": "stop"}}, record, sent)
    assert len(record.itl_s) == 3  # an event without new tokens is no gap


def test_trace_replay_honours_arrival_times_rate_scale_and_lengths(tmp_path, stub):
    trace = write_jsonl(tmp_path / "t.jsonl", [{"id": "a", "timestamp": 10.0, "input_length": 7, "output_length": 3},
                                               {"id": "b", "timestamp": 10.6, "input_length": 5, "output_length": 2},
                                               {"id": "c", "timestamp": 11.2, "input_length": 9, "output_length": 4}])
    code, summary, records = bench(tmp_path, [stub.url], "--trace", trace, "--rate-scale", "2", "--short-threshold", "3")
    assert code == 0
    received = [t for t, _ in stub.received]
    gaps = np.diff(received)
    assert np.all(np.abs(gaps - 0.3) < 0.15), gaps  # 0.6 s apart in the trace, replayed twice as fast
    assert [record["scheduled_s"] for record in records] == pytest.approx([0.0, 0.3, 0.6])
    assert np.diff([record["sent_s"] for record in records]) == pytest.approx([0.3, 0.3], abs=0.15)
    assert summary["runs"][0]["offered_rps"] == pytest.approx(3 / 0.6)
    assert summary["source"]["kind"] == "trace" and summary["rate_scale"] == 2
    bodies = [body for _, body in stub.received]
    assert [len(body["input_ids"]) for body in bodies] == [7, 5, 9]
    assert all(1000 <= i < 5000 for body in bodies for i in body["input_ids"])
    assert [body["sampling_params"]["max_new_tokens"] for body in bodies] == [3, 2, 4]
    assert all(body["sampling_params"]["ignore_eos"] for body in bodies)
    assert [record["output_len"] for record in records] == [3, 2, 4]
    metrics = summary["runs"][0]["metrics"]
    assert (metrics["short"]["requests"], metrics["long"]["requests"]) == (1, 2)


def test_poisson_rate_spreads_dataset_arrivals(tmp_path, stub):
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"q{i} len=1"} for i in range(5)])
    code, summary, records = bench(tmp_path, [stub.url], "--dataset", dataset, "--rate", "20", "--raw-prompts")
    scheduled = [record["scheduled_s"] for record in records]
    assert code == 0 and scheduled[0] == 0 and all(b > a for a, b in zip(scheduled, scheduled[1:]))
    again = bench(tmp_path, [stub.url], "--dataset", dataset, "--rate", "20", "--raw-prompts", name="again")[2]
    assert [record["scheduled_s"] for record in again] == scheduled  # seeded: the same schedule
    assert summary["rate"] == 20 and summary["runs"][0]["offered_rps"] == 20


def test_poisson_arrivals_have_exponential_gaps_at_the_rate():
    from specforge_outlets.loadgen.workload import poisson_arrivals

    times = poisson_arrivals(20000, 8.0, seed=3)
    gaps = np.diff(times)
    assert times[0] == 0 and np.all(gaps > 0)
    assert gaps.mean() == pytest.approx(1 / 8.0, rel=0.03)  # mean gap 1 / rate
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential: std = mean
    assert np.mean(gaps > 2 / 8.0) == pytest.approx(np.exp(-2), abs=0.01)  # P(gap > 2/rate) = e^-2
    assert not np.array_equal(times, poisson_arrivals(20000, 8.0, seed=4))
    assert np.array_equal(poisson_arrivals(3, float("inf"), seed=3), np.zeros(3))  # a burst


def test_two_base_urls_alternate(tmp_path):
    with StubGenerateServer() as first, StubGenerateServer() as second:
        dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"q{i} len=1"} for i in range(5)])
        code, summary, records = bench(tmp_path, [first.url, second.url + "/"], "--dataset", dataset, "--rate", "inf",
                                       "--raw-prompts", "--max-concurrency", "2")
    assert code == 0 and (len(first.received), len(second.received)) == (3, 2)
    assert [record["url"] for record in records] == [first.url, second.url] * 2 + [first.url]
    assert summary["base_urls"] == [first.url, second.url]


def test_chat_template_prompts_are_sent_as_token_ids(tmp_path, stub):
    from specforge_outlets.model.tiny_chat_target import make_chat_tokenizer

    tokenizer = make_chat_tokenizer()
    tokenizer.save_pretrained(tmp_path / "tok")
    dataset = write_jsonl(tmp_path / "d.jsonl", [
        {"id": "m", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}]},
        {"id": "s", "conversations": [{"from": "human", "value": "the quick brown fox"}], "output_length": 7},
    ])
    code, _, records = bench(tmp_path, [stub.url], "--dataset", dataset, "--rate", "inf", "--tokenizer", str(tmp_path / "tok"))
    assert code == 0
    expected = [tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                              tokenize=False) for text in ("hello world", "the quick brown fox")]
    sent = sorted((body["input_ids"] for _, body in stub.received), key=len)
    assert [tokenizer.decode(ids) for ids in sent] == sorted(expected, key=len)
    assert {record["expected_output_len"] for record in records} == {256, 7}


# --- bad input ------------------------------------------------------------------------------------
def test_bad_dataset_rows_are_named_skipped_and_counted(tmp_path, stub, capsys):
    dataset = write_jsonl(tmp_path / "d.jsonl", [
        {"id": "good", "prompt": "fine len=1"}, "{not json", {"id": "empty", "prompt": ""},
        {"id": "nouser", "messages": [{"role": "assistant", "content": "hi"}]},
        {"id": "badlen", "prompt": "x", "output_length": -3}, {"id": "good", "prompt": "dup"},
        '{"id": "nanlen", "prompt": "x", "output_length": NaN}',
    ])
    code, summary, _ = bench(tmp_path, [stub.url], "--dataset", dataset, "--rate", "inf", "--raw-prompts")
    out = capsys.readouterr().out
    assert code == 0 and summary["num_requests"] == 1 and summary["skipped_rows"] == 6
    assert "skipping 6 bad row(s)" in out and f"{dataset}:2: malformed JSON" in out
    assert "(id empty): prompt must be a non-empty string" in out and "(id nouser): no user turn" in out
    assert "(id badlen): output_length must be a positive integer" in out and "(id good): duplicate id" in out
    assert "... and 1 more" in out  # the NaN length: skipped and counted, not a crash


@pytest.mark.parametrize("extra, message", [
    (["--rate", "0", "--raw-prompts"], "--rate must be a positive number"),
    (["--rate", "-2", "--raw-prompts"], "--rate must be a positive number"),
    (["--raw-prompts"], "--dataset needs --rate"),
    (["--rate", "5"], "--tokenizer DIR"),
    (["--rate", "5", "--tokenizer", "/nonexistent/tok"], "--tokenizer /nonexistent/tok: no such directory"),
    (["--rate", "5", "--raw-prompts", "--max-concurrency", "0"], "--max-concurrency must be at least 1"),
    (["--rate", "5", "--raw-prompts", "--num-requests", "0"], "--num-requests must be at least 1"),
    (["--rate", "5", "--raw-prompts", "--rate-scale", "2"], "--rate-scale is for --trace"),
])
def test_bad_arguments_are_refused_without_traceback(tmp_path, stub, capsys, extra, message):
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "x"}])
    code, summary, _ = bench(tmp_path, [stub.url], "--dataset", dataset, *extra)
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err and summary is None and not stub.received


def test_unusable_inputs_and_servers_are_named(tmp_path, stub, capsys):
    empty = write_jsonl(tmp_path / "e.jsonl", [{"id": "x", "text": "no prompt field"}])
    trace = write_jsonl(tmp_path / "t.jsonl", [{"timestamp": 0, "input_length": 3, "output_length": 2}])
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead_url = f"http://127.0.0.1:{closed.getsockname()[1]}"  # bound, never listening: connection refused
    with StubGenerateServer(healthy=False) as sick:
        cases = [
            ([stub.url], ["--dataset", empty, "--rate", "1", "--raw-prompts"], f"dataset {empty}: no usable prompt"),
            ([stub.url], ["--dataset", str(tmp_path / "missing.jsonl"), "--rate", "1", "--raw-prompts"], "no such file"),
            ([stub.url], ["--trace", trace, "--rate", "3"], "--rate is for --dataset"),
            ([stub.url], ["--trace", trace, "--oracle-prediction"], "--oracle-prediction and --predictions are for --dataset"),
            ([stub.url], ["--dataset", write_jsonl(tmp_path / "blank.jsonl", ["", "  "]), "--rate", "1", "--raw-prompts"],
             "no rows"),
            ([stub.url, dead_url], ["--trace", trace], f"--base-url {dead_url}: server not reachable"),
            ([sick.url], ["--trace", trace], f"--base-url {sick.url}: GET {sick.url}/health answered HTTP 503"),
        ]
        for urls, extra, message in cases:
            code, summary, _ = bench(tmp_path, urls, *extra)
            err = capsys.readouterr().err
            assert code == 2 and message in err and "Traceback" not in err and summary is None, (extra, err)
    closed.close()
    assert not stub.received


# --- compare-runs ---------------------------------------------------------------------------------
def test_compare_runs_puts_a_bench_run_next_to_a_simulation(tmp_path, stub, capsys):
    rows = [{"id": f"ok{i}", "prompt": f"fine len={1 + i % 3}"} for i in range(6)] + [{"id": "cut", "prompt": "drop len=4"}]
    dataset = write_jsonl(tmp_path / "d.jsonl", rows)
    code, _, _ = bench(tmp_path, [stub.url], "--dataset", dataset, "--rate", "inf", "--raw-prompts", "--label", "real-fcfs",
                       name="bench")
    assert code == 0
    trace = write_jsonl(tmp_path / "t.jsonl", [{"timestamp": i * 0.1, "input_length": 100 + 50 * (i % 4),
                                                "output_length": 20 + 300 * (i % 5)} for i in range(40)])
    assert main(["simulate", "--trace", trace, "--config", "recipes/cluster-h100-1p3d.yaml", "--output",
                 str(tmp_path / "sim"), "--routing", "round-robin", "--queue", "fcfs", "sjf", "--no-controlled-study"]) == 0
    sim_summary = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert sim_summary["runs"][0]["metrics"]["all"]["failed"] == 0

    assert main(["compare-runs", str(tmp_path / "bench"), str(tmp_path / "sim"), "--output", str(tmp_path / "cmp")]) == 0
    table = (tmp_path / "cmp" / "compare.md").read_text()
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    assert lines[0].startswith("| run | label | kind | study | routing | queue | predictor | rate_scale |")
    assert len(lines) == 1 + 1 + 2  # header, the bench run, two simulated policies
    bench_line = next(line for line in lines if "real-fcfs" in line)
    assert bench_line.rstrip(" |").endswith("| 1") and "| inf |" in bench_line  # 1 of 7 failed: all P99 inf
    assert "round-robin + sjf" in table and "| simulate | policies | round-robin | sjf |" in table
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 0

    assert main(["compare-runs", str(tmp_path / "sim"), "--output", str(tmp_path / "one" / "table.md")]) == 0
    assert (tmp_path / "one" / "table.png").stat().st_size > 0


def write_summary_dir(directory, kind, row):
    directory.mkdir()
    (directory / "summary.json").write_text(json.dumps({"kind": kind, "runs": [row]}))
    return str(directory)


def test_compare_runs_prints_the_sglang_keys_metrics_names_and_refuses_an_unknown_one(tmp_path, capsys):
    empty = {"requests": 0}
    simulated = write_summary_dir(tmp_path / "sim", "simulate", {"label": "sim", "offered_rps": 2.0, "metrics": {
        "all": {"e2e_p99_s": 1.5, "e2e_p50_s": 0.5, "throughput_tok_s": 90.0, "goodput_rps": 0.5, "slo_attainment": 0.25},
        "short": {"e2e_p99_s": 0.75, "goodput_rps": 0.5, "slo_attainment": 0.5}, "long": empty}})
    # a bench-serving row: SGLang's keys over the successful requests beside ours, where a failure is inf
    measured = write_summary_dir(tmp_path / "real", "bench-serving", {"label": "real", "offered_rps": 2.0, "p99_e2e_latency_ms": 1200.0,
                                                     "request_goodput": 0.4, "metrics": {
        "all": {"e2e_p99_s": "inf", "failed": 1}, "short": {"e2e_p99_s": "inf"}, "long": empty}})
    chosen = "p99_e2e_latency_ms,short_p99_e2e_latency_ms,request_goodput,short_slo_attainment,failed"
    assert main(["compare-runs", simulated, measured, "--metrics", chosen, "--output", str(tmp_path / "cmp")]) == 0
    lines = [line for line in (tmp_path / "cmp" / "compare.md").read_text().splitlines() if line.startswith("| ")]
    assert lines[0] == "| run | label | kind | " + chosen.replace(",", " | ") + " |"
    assert lines[1] == "| sim | sim | simulate | 1500.0 | 750.0 | 0.50 | 0.50 | 0 |"  # ms from the simulator's s
    assert lines[2] == "| real | real | bench-serving | 1200.0 | inf | 0.40 | – | 1 |"

    assert main(["compare-runs", simulated, "--output", str(tmp_path / "default")]) == 0
    header = (tmp_path / "default" / "compare.md").read_text().split("\n| ", 1)[1].split("\n")[0]
    assert "p99_ttft_ms" in header and "request_goodput" in header and "short_p99_e2e_latency_ms" in header
    assert " s |" not in header  # no more columns in seconds

    capsys.readouterr()
    code = main(["compare-runs", simulated, "--metrics", "p99_ttft_ms,p99_ttft", "--output", str(tmp_path / "bad")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "--metrics: unknown key 'p99_ttft'" in err
    assert "valid keys: offered_rps, completed" in err and "mean_tpot_ms" in err and not (tmp_path / "bad").exists()


def test_sglang_result_adds_input_tokens_total_throughput_and_peak_concurrency():
    from specforge_outlets.loadgen.client import RequestRecord
    from specforge_outlets.loadgen.sglang_result import sglang_result

    def record(sent, e2e, prompt_len, success=True):
        return RequestRecord(id=f"r{sent}", url="u", scheduled_s=sent, sent_s=sent, ttft_s=0.1, e2e_s=e2e,
                             prompt_len=prompt_len, output_len=4, success=success)

    # in flight: 0-1.2 s and 0.5-0.7 s (both in second 0), 3.0-3.5 s alone; the failed one is not counted
    records = [record(0.0, 1.2, 10), record(0.5, 0.2, 20), record(3.0, 0.5, 5), record(0.2, 0.1, 99, success=False)]
    result = sglang_result(records, duration_s=4.0)
    assert result["total_input_tokens"] == 35 and result["input_throughput"] == pytest.approx(35 / 4.0)
    assert result["total_output_tokens"] == 12 and result["total_throughput"] == pytest.approx(47 / 4.0)
    assert result["max_concurrent_requests"] == 2
    unknown = sglang_result([record(0.0, 1.0, None)], duration_s=1.0)  # a prompt the server did not count
    assert json_safe(unknown)["total_input_tokens"] is None and json_safe(unknown)["total_throughput"] is None


SERVE_PYTHON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".venv-serve", "bin", "python")


@pytest.mark.skipif(not os.path.exists(SERVE_PYTHON), reason="needs the serve environment (make serve-env)")
def test_compare_runs_reads_a_stock_sglang_bench_serving_result_beside_ours_with_sglangs_keys(tmp_path, capsys):
    """SGLang 0.5.23's own client (serve environment) and ours against one stub server: our summary row
    carries SGLang's result keys by its names, and compare-runs reads its --output-file beside ours."""
    from specforge_outlets.model.tiny_chat_target import make_chat_tokenizer

    tokenizer = str(tmp_path / "tokenizer")
    make_chat_tokenizer().save_pretrained(tokenizer)
    stock = tmp_path / "sglang.jsonl"
    with StubGenerateServer() as server:
        result = subprocess.run(
            [SERVE_PYTHON, "-m", "sglang.benchmark.serving", "--backend", "sglang", "--base-url", server.url,
             "--dataset-name", "random-ids", "--random-input-len", "8", "--random-output-len", "4",
             "--random-range-ratio", "1", "--num-prompts", "4", "--request-rate", "inf", "--tokenizer", tokenizer,
             "--model", tokenizer, "--goodput", "e2el:60000", "--output-file", str(stock), "--output-details"],
            capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        dataset = write_jsonl(tmp_path / "d.jsonl", [{"id": f"r{i}", "prompt": f"q len={2 + i}"} for i in range(4)])
        code, summary, _ = bench(tmp_path, [server.url], "--dataset", dataset, "--rate", "inf", "--raw-prompts",
                                 "--goodput", "e2e:60000", "tpot:1000", name="ours")
    assert code == 0
    theirs = json.loads(stock.read_text().splitlines()[0])
    row = summary["runs"][0]
    ours = {key for key in row if key not in ("label", "offered_rps", "metrics")}
    assert ours <= set(theirs), ours - set(theirs)  # every SGLang key we write is one SGLang writes
    assert {"p99_ttft_ms", "median_e2e_latency_ms", "output_throughput", "request_goodput", "total_input_tokens",
            "input_throughput", "total_throughput", "max_concurrent_requests"} <= ours
    assert row["goodput_slos_ms"] == {"e2el": 60000.0, "tpot": 1000.0} and row["completed"] == 4  # e2e read as e2el
    assert row["request_goodput"] == pytest.approx(4 / row["duration"])
    assert row["median_e2e_latency_ms"] == pytest.approx(1e3 * row["metrics"]["all"]["e2e_p50_s"])
    assert row["output_throughput"] == pytest.approx(row["total_output_tokens"] / row["duration"])

    assert main(["compare-runs", str(tmp_path / "ours"), str(stock), "--output", str(tmp_path / "cmp")]) == 0
    lines = [line for line in (tmp_path / "cmp" / "compare.md").read_text().splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    stock_line = next(line for line in lines if "sglang.benchmark.serving" in line)
    cells = dict(zip(header, (cell.strip() for cell in stock_line.strip("|").split("|"))))
    assert [cells[key] for key in ("run", "label", "kind")] == ["sglang.jsonl", "sglang random-ids rate inf",
                                                                 "sglang.benchmark.serving"]
    assert cells["output_throughput"] == f"{theirs['output_throughput']:.0f}"
    assert cells["short_p99_e2e_latency_ms"] == cells["long_p99_e2e_latency_ms"] == "–"  # no length classes
    assert cells["p99_e2e_latency_ms"] == f"{theirs['p99_e2e_latency_ms']:.1f}"
    assert cells["request_goodput"] == f"{theirs['request_goodput']:.2f}" and cells["failed"] == "0"  # no errors
    assert any("| ours |" in line for line in lines)


def test_report_to_wandb_logs_the_summary_row_with_sglangs_keys(tmp_path, stub, monkeypatch):
    from tests.wandb_offline import logged_tables, offline_run, run_records

    monkeypatch.setenv("WANDB_MODE", "offline")
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"id": f"r{i}", "prompt": f"q len={2 + i}"} for i in range(4)])
    code, summary, _ = bench(tmp_path, [stub.url], "--dataset", dataset, "--rate", "inf", "--raw-prompts",
                             "--report-to", "wandb", name="logged")
    assert code == 0
    run = offline_run(str(tmp_path / "logged"))
    table = logged_tables(run)["summary"]
    (row,) = [dict(zip(table["columns"], values)) for values in table["data"]]
    written = summary["runs"][0]
    assert row["label"] == "logged" and row["p99_ttft_ms"] == pytest.approx(written["p99_ttft_ms"])
    assert row["all/e2e_p99_s"] == pytest.approx(written["metrics"]["all"]["e2e_p99_s"])
    assert stub.url.encode() in run_records(run)  # the header (base_urls, ...) is the run's config


def test_compare_runs_refuses_a_file_that_is_not_a_sglang_result(tmp_path, capsys):
    (tmp_path / "other.jsonl").write_text('{"backend": "sglang", "completed": 3}\n')
    assert main(["compare-runs", str(tmp_path / "other.jsonl"), "--output", str(tmp_path / "cmp")]) == 2
    err = capsys.readouterr().err
    assert "other.jsonl:1: no duration, output_throughput" in err and "not a sglang.benchmark.serving result" in err


def test_compare_runs_names_a_missing_or_malformed_summary(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "summary.json").write_text('{"runs": [')
    (tmp_path / "norows").mkdir()
    (tmp_path / "norows" / "summary.json").write_text('{"runs": [{"label": "x", "metrics": {"all": {}}}]}')
    for name, message in (("empty", "no summary.json"), ("broken", "not valid JSON"), ("norows", "runs[0] has no metrics")):
        code = main(["compare-runs", str(tmp_path / name), "--output", str(tmp_path / "cmp")])
        err = capsys.readouterr().err
        assert code == 2 and str(tmp_path / name) in err and message in err and "Traceback" not in err


def test_fixed_output_len_sends_each_rows_length_with_ignore_eos(tmp_path, stub, capsys):
    rows = [{"id": "a", "prompt": "qa len=9", "output_length": 3}, {"id": "b", "prompt": "qb len=9", "output_length": 2},
            {"id": "c", "prompt": "qc len=9"}]
    dataset = write_jsonl(tmp_path / "d.jsonl", rows)
    code, summary, records = bench(tmp_path, [stub.url], "--dataset", dataset, "--rate", "inf", "--raw-prompts",
                                   "--fixed-output-len", "--max-new-tokens", "8")
    assert code == 0 and "(id c): no output_length" in capsys.readouterr().out
    sent = {body["text"]: body["sampling_params"] for _, body in stub.received}
    assert sent == {"qa len=9": {"max_new_tokens": 3, "temperature": 0.7, "ignore_eos": True},
                    "qb len=9": {"max_new_tokens": 2, "temperature": 0.7, "ignore_eos": True}}
    assert {record["id"]: record["output_len"] for record in records} == {"a": 3, "b": 2}
    assert summary["skipped_rows"] == 1 and summary["source"]["output_len"].startswith("dataset output_length")


def test_end_at_output_len_keeps_the_cap_and_asks_the_server_to_end_each_request(tmp_path, stub, capsys):
    from specforge_outlets.loadgen.end_at_length import EndAtOutputLength

    rows = [{"id": "a", "prompt": "qa len=9", "output_length": 3}, {"id": "b", "prompt": "qb len=9", "output_length": 9},
            {"id": "c", "prompt": "qc len=9"}]
    dataset = write_jsonl(tmp_path / "d.jsonl", rows)
    code, summary, _ = bench(tmp_path, [stub.url], "--dataset", dataset, "--rate", "inf", "--raw-prompts",
                             "--end-at-output-len", "2", "--max-new-tokens", "8", "--oracle-prediction")
    out = capsys.readouterr().out
    assert code == 0 and "(id b): output_length 9 is over --max-new-tokens 8" in out and "(id c): no output_length" in out
    [(_, body)] = stub.received
    assert body["sampling_params"] == {"max_new_tokens": 8, "temperature": 0.7, "custom_params": {
        "outlets_predicted_output_len": 3.0, "outlets_end_at_output_len": 3, "outlets_end_token_id": 2}}
    # SGLang's CustomLogitProcessor.from_str: unpickle the callable, then instantiate it
    processor = pickle.loads(bytes.fromhex(json.loads(body["custom_logit_processor"])["callable"]))()
    assert isinstance(processor, EndAtOutputLength)
    assert summary["end_at_output_len"] == 2 and summary["skipped_rows"] == 2
    code, _, _ = bench(tmp_path, [stub.url], "--dataset", dataset, "--rate", "inf", "--raw-prompts",
                       "--end-at-output-len", "2", "--fixed-output-len", name="both")
    assert code == 2 and "choose one" in capsys.readouterr().err


def test_through_router_sends_the_request_settings_in_custom_labels(tmp_path, stub, capsys):
    """sglang-router 0.3.2 drops custom_params on /generate and keeps custom_labels and custom_logit_processor."""
    rows = [{"id": "a", "prompt": "qa len=9", "output_length": 3}]
    dataset = write_jsonl(tmp_path / "d.jsonl", rows)
    code, summary, _ = bench(tmp_path, [stub.url], "--dataset", dataset, "--rate", "inf", "--raw-prompts",
                             "--end-at-output-len", "2", "--max-new-tokens", "8", "--oracle-prediction",
                             "--through-router")
    assert code == 0 and summary["through_router"] is True
    [(_, body)] = stub.received
    assert body["sampling_params"] == {"max_new_tokens": 8, "temperature": 0.7}
    assert body["custom_labels"] == {"outlets_predicted_output_len": "3.0", "outlets_end_at_output_len": "3",
                                     "outlets_end_token_id": "2"}
    assert "custom_logit_processor" in body
    code, _, _ = bench(tmp_path, [stub.url], "--dataset", dataset, "--rate", "inf", "--raw-prompts",
                       "--max-new-tokens", "8", "--through-router", name="plain")
    assert code == 0 and "custom_labels" not in stub.received[-1][1]


def test_end_at_output_len_processor_forbids_the_stop_token_before_the_length_and_forces_it_at_it():
    import torch

    from specforge_outlets.loadgen.end_at_length import EndAtOutputLength, end_at_params

    short, long = SimpleNamespace(), SimpleNamespace()  # two requests, 2 and 3 tokens long
    rows = [{**end_at_params(2, stop_token_id=2), "__req__": short}, None,
            {**end_at_params(3, stop_token_id=2), "__req__": long}, {"other": 1}]
    stop_only = [float("-inf")] * 2 + [0.0] + [float("-inf")] * 2
    no_stop = [0.0, 0.0, float("-inf"), 0.0, 0.0]
    first = EndAtOutputLength()(torch.zeros(4, 5), rows)  # each call samples one token of each request
    assert first[0].tolist() == first[2].tolist() == no_stop and first[1].tolist() == first[3].tolist() == [0.0] * 5
    second = EndAtOutputLength()(torch.zeros(4, 5), rows)  # a new instance per batch, as SGLang makes them
    assert second[0].tolist() == stop_only and second[2].tolist() == no_stop
    assert EndAtOutputLength()(torch.zeros(2, 5), rows[2:])[0].tolist() == stop_only
    # a PD decode instance: the prefill sampled the first token, so the first call here samples the second
    handed_over = SimpleNamespace(output_ids=[11])
    row = [{**end_at_params(3, stop_token_id=2), "__req__": handed_over}]
    assert EndAtOutputLength()(torch.zeros(1, 5), row)[0].tolist() == no_stop
    assert EndAtOutputLength()(torch.zeros(1, 5), row)[0].tolist() == stop_only
    # retracted with a token in flight (overlap scheduling): counted, then dropped; the count restarts from output_ids
    retracted = SimpleNamespace(output_ids=[], retraction_count=0)
    row = [{**end_at_params(3, stop_token_id=2), "__req__": retracted}]
    for _ in range(2):
        assert EndAtOutputLength()(torch.zeros(1, 5), row)[0].tolist() == no_stop
    retracted.output_ids, retracted.retraction_count = [11], 1  # the second token never landed
    assert EndAtOutputLength()(torch.zeros(1, 5), row)[0].tolist() == no_stop  # the second, again
    assert EndAtOutputLength()(torch.zeros(1, 5), row)[0].tolist() == stop_only


def test_oracle_prediction_sends_the_exact_length_to_the_plugin(tmp_path, stub, capsys):
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"id": "a", "prompt": "qa", "output_length": 3}])
    code, summary, _ = bench(tmp_path, [stub.url], "--dataset", dataset, "--rate", "inf", "--raw-prompts",
                             "--fixed-output-len", "--oracle-prediction")
    assert code == 0 and summary["oracle_prediction"] is True
    assert [body["sampling_params"]["custom_params"] for _, body in stub.received] == [
        {"outlets_predicted_output_len": 3.0}]
    code, summary, _ = bench(tmp_path, [stub.url], "--dataset", dataset, "--rate", "inf", "--raw-prompts",
                             "--oracle-prediction", name="refused")
    assert code == 2 and "--oracle-prediction needs --fixed-output-len or --end-at-output-len" in capsys.readouterr().err


def test_predictions_file_is_sent_with_the_requests_it_names(tmp_path, stub, capsys):
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"id": "a", "prompt": "qa"}, {"id": "b", "prompt": "qb"}])
    predictions = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "predictor": "outlets", "predicted_output_len": 42.5}])
    code, summary, _ = bench(tmp_path, [stub.url], "--dataset", dataset, "--rate", "inf", "--raw-prompts",
                             "--predictions", predictions)
    assert code == 0 and "names 1 of 2 requests" in capsys.readouterr().out and summary["predictions"] == predictions
    sent = {body["text"]: body["sampling_params"].get("custom_params") for _, body in stub.received}
    assert sent == {"qa": {"outlets_predicted_output_len": 42.5}, "qb": None}
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"id": "a", "predicted_output_len": "soon"}])
    code, _, _ = bench(tmp_path, [stub.url], "--dataset", dataset, "--rate", "inf", "--raw-prompts",
                       "--predictions", bad, name="bad")
    assert code == 2 and f"--predictions {bad} line 1: needs an id and a positive predicted_output_len" in capsys.readouterr().err


def test_predictions_file_quantiles_are_sent_with_the_point_where_a_row_has_them(tmp_path, stub, capsys):
    """The simulator's per-row fields (quantile_levels, quantiles), read by its reader: a 0 is sent as 1 token,
    since the plugin refuses quantiles that are not positive."""
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"id": key, "prompt": f"q{key}"} for key in "abc"])
    predictions = write_jsonl(tmp_path / "p.jsonl", [
        {"id": "a", "predicted_output_len": 5, "quantile_levels": [0.1, 0.5, 0.9], "quantiles": [0, 5, 9]},
        {"id": "b", "predicted_output_len": 7}])
    code, summary, _ = bench(tmp_path, [stub.url], "--dataset", dataset, "--rate", "inf", "--raw-prompts",
                             "--predictions", predictions)
    assert code == 0 and "quantiles at levels 0.1,0.5,0.9 with 1 of 3 requests" in capsys.readouterr().out
    sent = {body["text"]: body["sampling_params"].get("custom_params") for _, body in stub.received}
    assert sent == {"qa": {"outlets_predicted_output_len": 5.0, "outlets_predicted_quantiles": [1.0, 5.0, 9.0]},
                    "qb": {"outlets_predicted_output_len": 7.0}, "qc": None}
    assert summary["quantiles"] == {"levels": [0.1, 0.5, 0.9], "requests": 1}
    _, summary, _ = bench(tmp_path, [stub.url], "--dataset", dataset, "--rate", "inf", "--raw-prompts", name="none")
    assert summary["quantiles"] is None and "outlets_predicted_quantiles" not in json.dumps(stub.received[-1][1])


@pytest.mark.parametrize("row, message", [
    ({"quantile_levels": [0.1, 0.5, 0.9], "quantiles": [9, 5, 1]},
     "id 'b': quantiles must be 3 non-decreasing non-negative numbers (one per level), got (9, 5, 1); fix the row"),
    ({"quantile_levels": [0.1, 0.5, 0.9], "quantiles": [1, 2]}, "id 'b': quantiles must be 3 non-decreasing"),
    ({"quantile_levels": [0.1, 0.9], "quantiles": [1, 2]}, "id 'b': quantile_levels [0.1, 0.9] differ from an earlier row's"),
    ({"quantiles": [1, 2, 3]}, "id 'b': quantiles without quantile_levels; give the levels"),
    ({"quantile_levels": [0.5, 0.1, 0.9], "quantiles": [1, 2, 3]},
     "id 'b': quantile_levels must be numbers strictly increasing inside (0, 1), got (0.5, 0.1, 0.9)"),
    ({"quantile_levels": [0.1, 0.5, 0.9], "quantiles": [1, "x", 3]}, "id 'b': quantiles must be 3 non-decreasing"),
    ({"quantile_levels": [0.1, 0.5, 0.9], "quantiles": list(range(2000))},
     "id 'b': quantiles must be 3 non-decreasing non-negative numbers (one per level), got (0, 1, 2, 3"),
])
def test_a_malformed_quantile_row_is_refused_naming_the_file_and_the_row_cut_short(tmp_path, stub, capsys, row, message):
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"id": "a", "prompt": "qa"}, {"id": "b", "prompt": "qb"}])
    predictions = write_jsonl(tmp_path / "p.jsonl", [
        {"id": "a", "predicted_output_len": 5, "quantile_levels": [0.1, 0.5, 0.9], "quantiles": [1, 5, 9]},
        {"id": "b", "predicted_output_len": 7, **row}])
    code, _, _ = bench(tmp_path, [stub.url], "--dataset", dataset, "--rate", "inf", "--raw-prompts",
                       "--predictions", predictions)
    error = capsys.readouterr().err
    assert code == 2 and f"--predictions {predictions}: {message}" in error and not stub.received
    assert len(error) < 600  # a long row is quoted cut, never whole


def test_quantiles_through_the_router_travel_as_the_label_string_the_plugin_parses(tmp_path, stub):
    """sglang-router keeps only custom_labels (strings): the plugin moves the label back and reads the same values."""
    from sglang_patches.client_predictions import move_labels_to_custom_params
    from sglang_patches.settings import QUANTILES_PARAM_KEY, parse_quantiles

    dataset = write_jsonl(tmp_path / "d.jsonl", [{"id": "a", "prompt": "qa"}])
    predictions = write_jsonl(tmp_path / "p.jsonl", [
        {"id": "a", "predicted_output_len": 5, "quantile_levels": [0.1, 0.5, 0.9], "quantiles": [2, 5, 1e6 + 0.5]}])
    code, _, _ = bench(tmp_path, [stub.url], "--dataset", dataset, "--rate", "inf", "--raw-prompts",
                       "--predictions", predictions, "--through-router")
    [(_, body)] = stub.received
    assert code == 0 and "custom_params" not in body["sampling_params"]
    assert body["custom_labels"] == {"outlets_predicted_output_len": "5.0",
                                     QUANTILES_PARAM_KEY: "2.0,5.0,1000000.5"}
    request = SimpleNamespace(custom_labels=body["custom_labels"], sampling_params=body["sampling_params"])
    move_labels_to_custom_params(request)  # what the plugin does on the worker
    assert request.custom_labels is None
    assert parse_quantiles(request.sampling_params["custom_params"][QUANTILES_PARAM_KEY], (0.1, 0.5, 0.9)) == (
        2.0, 5.0, 1000000.5)


def test_the_predictions_file_has_one_writer_and_one_reader_for_simulate_and_bench_serving(tmp_path):
    from specforge_outlets.errors import OutletsError
    from specforge_outlets.evaluation.predictions_file import (
        PredictionRow, predictions_by_id, read_predictions, write_predictions,
    )
    from specforge_outlets.simulation.predicted_lengths import PredictorKind, predict_lengths
    from specforge_outlets.serving.trace import Trace

    path = str(tmp_path / "predictions" / "outlets.jsonl")
    rows = [PredictionRow("a", 12.5, 10.0), PredictionRow("b", 300.0, 280.0)]
    write_predictions(path, rows)
    assert read_predictions(path) == rows and predictions_by_id(path) == {"a": 12.5, "b": 300.0}
    trace = Trace("t", ["b", "a"], np.zeros(2), np.ones(2, np.int64), np.array([280, 10], np.int64))
    assert predict_lengths(PredictorKind.FILE, trace, 0, predictions_path=path) == [300.0, 12.5]
    with open(path, "a") as handle:
        handle.write('{"id": "c", "predicted_output_len": -3}\n')
    with pytest.raises(OutletsError, match=r"outlets\.jsonl line 3: needs an id and a positive predicted_output_len"):
        predictions_by_id(path)
    with pytest.raises(OutletsError, match=r"line 3"):
        predict_lengths(PredictorKind.FILE, trace, 0, predictions_path=path)


def test_tpot_is_time_per_token_after_the_first_and_leaves_one_token_outputs_out():
    from specforge_outlets.serving.metrics import summarize_requests

    metrics = summarize_requests(np.zeros(3), np.array([1.0, 1.0, 0.5]), np.array([11.0, 7.0, 0.5]),
                                 np.array([11, 4, 1]))["all"]
    # (11 - 1) / 10 = 1.0 and (7 - 1) / 3 = 2.0; the one-token output has no TPOT
    assert (metrics["tpot_p50_s"], metrics["tpot_mean_s"]) == pytest.approx((1.5, 1.5))
    failed = summarize_requests(np.zeros(2), np.array([1.0, 1.0]), np.array([11.0, 3.0]), np.array([11, 5]),
                                success=np.array([True, False]))["all"]
    assert failed["tpot_mean_s"] == math.inf  # a failed request never finished its tokens


def test_goodput_counts_requests_within_every_slo_target_per_length_class():
    from specforge_outlets.errors import OutletsError
    from specforge_outlets.serving.metrics import parse_goodput, summarize_requests

    slo = parse_goodput(["ttft:500", "tpot:100"])
    assert slo == {"ttft": 0.5, "tpot": 0.1}
    # TTFT 0.2 / 0.8 / 0.3 s; TPOT 0.05 / 0.05 / 0.3 s; the last one failed; makespan 10 s
    metrics = summarize_requests(np.zeros(4), np.array([0.2, 0.8, 0.3, 0.1]), np.array([5.2, 5.8, 3.3, 10.0]),
                                 np.array([101, 101, 11, 900]), success=np.array([True, True, True, False]), slo=slo)
    assert metrics["all"]["slo_attainment"] == 0.25 and metrics["all"]["goodput_rps"] == pytest.approx(0.1)
    assert metrics["long"]["slo_attainment"] == 0.0 and metrics["short"]["slo_attainment"] == pytest.approx(1 / 3)
    assert "goodput_rps" not in summarize_requests(np.zeros(1), np.ones(1), np.ones(1) * 2, np.array([3]))["all"]
    with pytest.raises(OutletsError, match=r"--goodput 'itl:5': expected METRIC:MILLISECONDS with METRIC one of "
                                           r"ttft, tpot, e2el"):
        parse_goodput(["itl:5"])
    # sglang.bench_serving's name for the end-to-end latency, and ours before it, bound the same latency
    assert parse_goodput(["e2el:5500"]) == parse_goodput(["e2e:5500"]) == {"e2el": 5.5}
    within = summarize_requests(np.zeros(4), np.array([0.2, 0.8, 0.3, 0.1]), np.array([5.2, 5.8, 3.3, 10.0]),
                                np.array([101, 101, 11, 900]), success=np.array([True, True, True, False]),
                                slo=parse_goodput(["e2el:5500"]))
    assert within["all"]["slo_attainment"] == 0.5  # 5.2 s and 3.3 s; 5.8 s over; the failed one never
