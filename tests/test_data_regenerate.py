"""`outlets regenerate`: the openai backend against a local stub server, and the real hf backend."""

import json

import pytest

from specforge_outlets.data import regenerate_command
from specforge_outlets.data.generation import (
    LENGTH, STOP, SamplingSettings, TurnError, TurnResult, censoring_flags, filter_reason, regenerate_rows,
)
from specforge_outlets.data.hf_backend import HFBackend
from specforge_outlets.errors import OutletsError
from specforge_outlets.model.tiny_chat_target import END_ID, make_chat_target
from tests.data_fixtures import StubChatServer, read_jsonl, run_command, write_jsonl

OPENAI = ["--backend", "openai", "--target", "stub", "--timeout", "1.5", "--max-retries", "2", "--backoff", "0.01",
          "--concurrency", "4", "--max-new-tokens", "50"]


def rows_in(tmp_path):
    return write_jsonl(tmp_path / "in.jsonl", [
        {"id": "plain", "conversations": [{"role": "user", "content": "one two three"}]},
        {"id": "flaky", "prompt": "flaky question here"},
        {"id": "slow", "prompt": "slow question"},
        {"id": "broken", "prompt": "broken server"},
        {"id": "huge", "prompt": "huge prompt"},
        {"id": "multi", "conversations": [
            {"role": "system", "content": "sys"}, {"role": "user", "content": "first turn"},
            {"role": "assistant", "content": "old answer"}, {"role": "user", "content": "second turn now"}]},
        {"id": "cut", "conversations": [
            {"role": "user", "content": "ramble please"}, {"role": "assistant", "content": "x"},
            {"role": "user", "content": "never asked"}]},
        "{broken json",
    ])


def test_openai_backend_retries_censors_and_reports(tmp_path, capsys):
    source, output = rows_in(tmp_path), tmp_path / "out.jsonl"
    with StubChatServer(slow_seconds=4.0) as server:
        assert run_command(regenerate_command, ["regenerate", *OPENAI, "--base-url", server.url,
                                                "--input", source, "--output", output]) == 0
    printed = capsys.readouterr().out
    assert "row broken: turn 1: gave up after 3 attempts; last error: HTTP 500" in printed
    assert "row huge: turn 1: HTTP 400 (not retried)" in printed and "in.jsonl:8: malformed JSON" in printed
    rows = {row["id"]: row for row in read_jsonl(output)}
    assert set(rows) == {"plain", "flaky", "slow", "multi", "cut"}
    assert rows["plain"]["conversations"] == [
        {"role": "user", "content": "one two three"},
        {"role": "assistant", "content": "word word word", "num_tokens": 4, "finish_reason": STOP}]
    multi = rows["multi"]["conversations"]  # turn 2 sees the regenerated turn 1, not the old answer
    assert [t["role"] for t in multi] == ["system", "user", "assistant", "user", "assistant"]
    assert multi[2]["content"] == "word word" and multi[4]["num_tokens"] == 4
    cut = rows["cut"]["conversations"]  # censored: recorded, and the later turn is dropped
    assert len(cut) == 2 and cut[1]["finish_reason"] == LENGTH and cut[1]["num_tokens"] == 50
    assert censoring_flags(rows["cut"]) == [True] and censoring_flags(rows["multi"]) == [False, False]
    assert server.requests["flaky question here"] == 2 and server.requests["slow question"] == 2
    assert server.requests["broken server"] == 3 and server.requests["huge prompt"] == 1
    summary = json.loads((tmp_path / "out.summary.json").read_text())
    assert (summary["kept"], summary["errors"], summary["bad_lines"]) == (5, 2, 1)
    assert summary["turns"] == 6 and summary["censored_turns"] == 1
    assert set(summary["errors_by_row"]) == {"broken", "huge", "line 8"}


def test_resume_after_a_crash_loses_and_duplicates_nothing(tmp_path):
    source, output = rows_in(tmp_path), tmp_path / "out.jsonl"
    with StubChatServer(slow_seconds=4.0) as server:
        args = ["regenerate", *OPENAI, "--base-url", server.url, "--input", source, "--output", output]
        run_command(regenerate_command, args)
        lines = output.read_text().splitlines(keepends=True)
        # Simulate a crash: the last row was half written and the one before never happened.
        output.write_text("".join(lines[:3]) + lines[3][:17])
        with pytest.raises(OutletsError, match="pass --resume"):
            run_command(regenerate_command, args)
        before = dict(server.requests)
        run_command(regenerate_command, [*args, "--resume"])
    ids = [row["id"] for row in read_jsonl(output)]
    assert sorted(ids) == sorted(["plain", "flaky", "slow", "multi", "cut"])  # each exactly once
    retried = {prompt for prompt, n in server.requests.items() if n > before.get(prompt, 0)}
    finished_first = {json.loads(line)["id"] for line in lines[:3]}
    assert "broken server" in retried  # failed rows are retried by --resume
    prompts = {"plain": "one two three", "flaky": "flaky question here", "slow": "slow question",
               "multi": "first turn", "cut": "ramble please"}
    assert not retried & {prompts[i] for i in finished_first}  # finished rows are not asked again


def test_filter_drops_responses_longer_than_the_limit(tmp_path):
    finished = {"conversations": [{"role": "assistant", "num_tokens": 2049, "finish_reason": STOP}]}
    cut_at_limit = {"conversations": [{"role": "assistant", "num_tokens": 2048, "finish_reason": LENGTH}]}
    cut_below = {"conversations": [{"role": "assistant", "num_tokens": 512, "finish_reason": LENGTH}]}
    assert "turn 1" in filter_reason(finished, 2048) and filter_reason(cut_at_limit, 2048)
    assert filter_reason(cut_below, 2048) is None
    source, output = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "prompt": "ramble"}, {"id": "b", "prompt": "ok"}]), tmp_path / "o.jsonl"
    with StubChatServer() as server:
        run_command(regenerate_command, ["regenerate", *OPENAI, "--base-url", server.url, "--input", source,
                                         "--output", output, "--max-response-tokens", 50])
        assert [row["id"] for row in read_jsonl(output)] == ["b"]
        assert read_jsonl(tmp_path / "o.filtered.jsonl")[0]["filtered"] == "turn 1 response is longer than 50 tokens"
        run_command(regenerate_command, ["regenerate", *OPENAI, "--base-url", server.url, "--input", source,
                                         "--output", output, "--max-response-tokens", 50, "--resume"])
    assert server.requests["ramble"] == 1  # a filtered row is final, not retried


def test_regenerate_rows_batches_turn_by_turn():
    calls = []

    def complete(batch):
        calls.append(len(batch))
        return [TurnError("boom") if "bad" in m[-1]["content"] else TurnResult("ok", 2, STOP) for m in batch]

    rows = [{"id": "a", "conversations": [{"role": "user", "content": "1"}, {"role": "user", "content": "2"}]},
            {"id": "b", "conversations": [{"role": "user", "content": "x"}]},
            {"id": "c", "conversations": [{"role": "user", "content": "bad"}]}]
    results = regenerate_rows(rows, complete)
    assert calls == [3, 1]
    assert len(results[0]["conversations"]) == 4 and str(results[2]) == "turn 1: boom"


@pytest.fixture(scope="module")
def chat_target(tmp_path_factory):
    return make_chat_target(str(tmp_path_factory.mktemp("chat-target")), end_bias=2.0)


def test_hf_backend_counts_and_finish_reasons(chat_target):
    backend = HFBackend(chat_target, SamplingSettings(max_new_tokens=5, temperature=1.0, top_p=1.0,
                                                      repetition_penalty=1.0, seed=0))
    assert backend.stop_ids == [END_ID]
    assert backend._turn([7, 8, END_ID, 0, 0]) == TurnResult(backend.tokenizer.decode([7, 8]), 3, STOP, [7, 8, END_ID])
    assert backend._turn([7, 8, 9, 10, 11]).finish_reason == LENGTH
    answers = backend.complete([[{"role": "user", "content": f"hello {i}"}] for i in range(12)])
    reasons = {answer.finish_reason for answer in answers}
    assert reasons == {STOP, LENGTH}, "seeded sampling should both end turns and hit the limit"
    for answer in answers:
        assert 1 <= answer.num_tokens <= 5 and (answer.finish_reason == STOP or answer.num_tokens == 5)
    too_long = backend.complete([[{"role": "user", "content": "word " * 600}]])[0]
    assert isinstance(too_long, TurnError) and "exceeds the target's context of 512" in str(too_long)


def test_hf_regenerate_command(chat_target, tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": f"r{i}", "prompt": f"question {i}"} for i in range(5)]
                         + [{"id": "multi", "conversations": [{"role": "user", "content": "a"},
                                                               {"role": "user", "content": "b"}]}])
    output = tmp_path / "out.jsonl"
    run_command(regenerate_command, ["regenerate", "--backend", "hf", "--target", chat_target, "--input", source,
                                     "--output", output, "--max-new-tokens", 4, "--batch-size", 4])
    rows = read_jsonl(output)
    assert sorted(row["id"] for row in rows) == ["multi", *(f"r{i}" for i in range(5))]
    for row in rows:
        for turn in row["conversations"][1::2]:
            assert turn["finish_reason"] in (STOP, LENGTH) and 1 <= turn["num_tokens"] <= 4


def test_sharded_regeneration_answers_each_prompt_once(tmp_path):
    from specforge_outlets.data.jsonl import write_jsonl as append_free_write
    from specforge_outlets.data.sharded_regeneration import regenerate_sharded, shard_path

    prompts = [{"id": f"p{i}", "prompt": f"question number {i}"} for i in range(9)] + [
        {"id": "cut", "prompt": "ramble please"}]
    source, output = write_jsonl(tmp_path / "in.jsonl", prompts), str(tmp_path / "out.jsonl")
    def answer(row):
        return {"id": row["id"], "conversations": [{"role": "user", "content": row["prompt"]}, {
            "role": "assistant", "content": "a", "num_tokens": 2, "finish_reason": STOP}]}

    append_free_write(output, [answer(prompts[0])])  # answered before
    append_free_write(shard_path(output, 1), [answer(prompts[1])])  # left by an interrupted worker
    append_free_write(shard_path(output, 0), [answer(prompts[0])])  # merged already, the shard not yet removed
    with StubChatServer() as server:
        regenerate_sharded(str(source), output, 2, [*OPENAI, "--base-url", server.url])
    rows = read_jsonl(output)
    assert sorted(row["id"] for row in rows) == sorted(row["id"] for row in prompts)  # each once
    assert server.requests["question number 0"] == 0 and server.requests["question number 1"] == 0
    assert all(server.requests[f"question number {i}"] == 1 for i in range(2, 9))
    assert not [name for name in tmp_path.iterdir() if ".shard" in name.name and not name.name.endswith(".log")]


def test_sharded_regeneration_needs_a_worker(tmp_path):
    from specforge_outlets.data.sharded_regeneration import regenerate_sharded

    with pytest.raises(OutletsError, match="--workers 0"):
        regenerate_sharded(str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl"), 0, [])


def test_resume_with_other_generation_settings_is_refused_naming_them(tmp_path):
    source, output = rows_in(tmp_path), tmp_path / "out.jsonl"
    with StubChatServer(slow_seconds=0.1) as server:
        args = ["regenerate", *OPENAI, "--base-url", server.url, "--input", source, "--output", output]
        run_command(regenerate_command, args)
        rows = output.read_text()
        with pytest.raises(OutletsError) as refused:
            run_command(regenerate_command, [*args, "--resume", "--max-new-tokens", "60", "--temperature", "0"])
        assert output.read_text() == rows  # nothing appended
        run_command(regenerate_command, [*args, "--resume"])  # the same settings resume
    message = str(refused.value)
    assert "\n" not in message and "--max-new-tokens 50, --temperature 0.7" in message
    assert "--max-new-tokens 60, --temperature 0.0" in message and "out.summary.json" in message
