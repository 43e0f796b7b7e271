"""`outlets prepare`: formats, bad rows, subsampling and the deterministic 4:1 split."""

import json

import pytest

from specforge_outlets import cli
from specforge_outlets.data import prepare_command
from specforge_outlets.data.conversations import RowError, clean_messages, normalise_row
from specforge_outlets.data.sources import builtin_prompts_path
from specforge_outlets.data.split import split_rows
from specforge_outlets.errors import OutletsError
from tests.data_fixtures import read_jsonl, run_command, write_jsonl


def test_formats_normalise_to_specforge_conversations():
    sharegpt = {"id": "s1", "conversations": [
        {"from": "gpt", "value": "stray opening"}, {"from": "human", "value": "Hi"},
        {"from": "human", "value": "there"}, {"from": "gpt", "value": "Hello"}, {"from": "human", "value": "Bye"}]}
    assert normalise_row(sharegpt, "x")["conversations"] == [
        {"role": "user", "content": "Hi\n\nthere"}, {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Bye"}]
    alpaca = {"instruction": "Add", "input": "2 and 3", "output": "5"}
    assert normalise_row(alpaca, "alpaca-7") == {"id": "alpaca-7", "conversations": [
        {"role": "user", "content": "Add\n\n2 and 3"}, {"role": "assistant", "content": "5"}]}
    lmsys = {"conversation_id": "c9", "conversation": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"}]}
    row = normalise_row(lmsys, "x", first_turn_only=True)
    assert row == {"id": "c9", "conversations": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1"}]}
    assert normalise_row({"id": 5, "prompt": "Hello"}, "x")["id"] == "5"


def test_conversation_ends_before_an_empty_user_turn():
    messages = [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
                {"role": "user", "content": "  "}, {"role": "assistant", "content": "A2"}]
    assert clean_messages(messages) == messages[:2]
    with pytest.raises(RowError, match="empty prompt"):
        clean_messages([{"role": "user", "content": ""}])
    with pytest.raises(RowError, match="no user turn"):
        clean_messages([{"role": "assistant", "content": "only me"}])


def test_split_is_deterministic_and_four_to_one():
    rows = list(range(100))
    train, test = split_rows(rows, seed=0)
    assert (len(train), len(test)) == (80, 20)
    assert split_rows(rows, seed=0) == (train, test)
    assert sorted(train + test) == rows and train == sorted(train)
    assert split_rows(rows, seed=1)[1] != test
    # Pinned: a change of the split algorithm would silently change every experiment's test set.
    assert test[:5] == [1, 2, 7, 8, 11]


def test_prepare_jsonl_with_bad_rows(tmp_path, capsys):
    source = write_jsonl(tmp_path / "prompts.jsonl", [
        {"id": "a", "prompt": "What is 2+2?"},
        "{not json",
        {"id": "b", "prompt": "   "},
        {"id": "c", "conversations": [{"from": "gpt", "value": "no question"}]},
        {"id": "a", "prompt": "duplicate id"},
        {"id": "d", "conversations": [{"from": "robot", "value": "?"}]},
        *({"id": f"p{i}", "prompt": f"Prompt number {i}"} for i in range(12)),
    ])
    out = tmp_path / "prepared"
    assert run_command(prepare_command, ["prepare", "--dataset", "jsonl", "--path", source, "--output", out]) == 0
    printed = capsys.readouterr().out
    assert "prompts.jsonl:2: malformed JSON" in printed
    assert "(id b): skipped: empty prompt" in printed and "(id c): skipped: no user turn" in printed
    assert "id 'a' already used" in printed and "unknown role 'robot'" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["kept"] == 13 and summary["skipped"] == 5
    assert summary["skipped_by_reason"] == {
        "malformed JSON": 1, "empty prompt": 1, "no user turn": 1, "duplicate id": 1, "bad turns": 1}
    train, test = read_jsonl(out / "train.jsonl"), read_jsonl(out / "test.jsonl")
    assert (len(train), len(test)) == (11, 2) == (summary["train"], summary["test"])
    assert {row["id"] for row in train + test} == {"a", *(f"p{i}" for i in range(12))}
    assert train[0] == {"id": "a", "conversations": [{"role": "user", "content": "What is 2+2?"}]}
    run_command(prepare_command, ["prepare", "--dataset", "jsonl", "--path", source, "--output", tmp_path / "again"])
    assert (tmp_path / "again" / "test.jsonl").read_text() == (out / "test.jsonl").read_text()


def test_max_samples_keeps_the_first_usable_rows(tmp_path):
    out = tmp_path / "builtin"
    run_command(prepare_command, ["prepare", "--dataset", "builtin", "--output", out, "--max-samples", 10])
    kept = read_jsonl(out / "train.jsonl") + read_jsonl(out / "test.jsonl")
    first = [json.loads(line)["id"] for line in open(builtin_prompts_path())][:10]
    assert sorted(row["id"] for row in kept) == sorted(first)


def test_random_sample_is_seeded_and_keeps_input_order(tmp_path):
    out = tmp_path / "random"
    args = ["prepare", "--dataset", "builtin", "--max-samples", 20, "--sample", "random"]
    run_command(prepare_command, [*args, "--output", out])
    run_command(prepare_command, [*args, "--output", tmp_path / "again"])
    ids = [json.loads(line)["id"] for line in open(builtin_prompts_path())]
    kept = [row["id"] for row in read_jsonl(out / "train.jsonl")]
    assert len(kept) == 16 and kept == sorted(kept, key=ids.index) and kept != ids[:16]
    assert read_jsonl(tmp_path / "again" / "train.jsonl") == read_jsonl(out / "train.jsonl")


def test_sharegpt_json_array_file(tmp_path):
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps([
        {"id": "x", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]},
        {"id": "y", "conversations": []},
        *({"id": f"z{i}", "conversations": [{"from": "human", "value": f"Question {i}"}]} for i in range(4)),
    ]))
    summary = prepare_command.prepare("sharegpt", str(path), str(tmp_path / "o"), True, None, 0)
    assert summary["kept"] == 5 and summary["skipped_by_reason"] == {"no user turn": 1}


def test_unknown_dataset_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(OutletsError, match="not known; choose one of sharegpt, alpaca, lmsys, jsonl, builtin"):
        prepare_command.prepare("wikipedia", None, str(tmp_path), False, None, 0)
    with pytest.raises(OutletsError, match="needs --path"):
        prepare_command.prepare("jsonl", None, str(tmp_path), False, None, 0)
    assert cli.main(["prepare", "--dataset", "nope", "--output", str(tmp_path)]) == 2
    assert "outlets prepare: error: --dataset 'nope' is not known" in capsys.readouterr().err


def test_a_split_left_empty_is_refused_before_anything_is_written(tmp_path, capsys):
    source = write_jsonl(tmp_path / "prompts.jsonl", [{"id": "a", "prompt": "What is 2+2?"}, "{not json",
                                                      {"id": "b", "prompt": "Name a colour"}])
    out = tmp_path / "prepared"
    assert cli.main(["prepare", "--dataset", "jsonl", "--path", source, "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("outlets prepare: error: --dataset jsonl: 2 usable rows") and "test split empty" in err
    assert "\n" not in err and not out.exists()


def test_builtin_prompt_set_is_varied():
    rows = [json.loads(line) for line in open(builtin_prompts_path())]
    assert len(rows) >= 250 and len({row["id"] for row in rows}) == len(rows)
    assert all(set(row) == {"id", "prompt"} and row["prompt"].strip() for row in rows)
    kinds = {row["id"].rsplit("-", 1)[0] for row in rows}
    assert {"fact", "list", "code", "essay", "story"} <= kinds
